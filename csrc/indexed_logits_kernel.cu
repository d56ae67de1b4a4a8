// Fused indexed head: logits of each hidden row over its request's candidate rows of the LM head.
//
//   out[m, j] = dot(weight[ids[s, j]], hidden[m])  for j < cnt[s],  -inf otherwise,  s = row_to_slot[m]
//
// (packed mode: the candidate rows are packed[s, j] = weight[s * W + j], the same kernel.)
//
// The head is bandwidth bound: every candidate row must be read from HBM once per request, not
// once per hidden row. A block owns a tile of columns and a group of up to kGroup consecutive
// hidden rows; consecutive rows with the same slot (a request's tree branches) form a run, and a
// warp loads each of its candidate rows once per run and dots it with every row of the run.
// Hidden rows are small and stay in L1/L2. Loads are 16-byte vectors when the layout allows,
// accumulation is fp32, and nothing here depends on tensor values on the host (graph-safe).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kWarps = 8;   // warps per block
constexpr int kGroup = 16;  // hidden rows per block (a run of one slot is at most this long)

template <typename T>
struct Vec;  // 16 bytes of T, converted to floats
template <>
struct Vec<float> {
  static constexpr int N = 4;
  __device__ static void load(const float* p, float* f) {
    float4 v = *reinterpret_cast<const float4*>(p);
    f[0] = v.x; f[1] = v.y; f[2] = v.z; f[3] = v.w;
  }
};
template <>
struct Vec<__half> {
  static constexpr int N = 8;
  __device__ static void load(const __half* p, float* f) {
    uint4 v = *reinterpret_cast<const uint4*>(p);
    const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 x = __half22float2(h[i]);
      f[2 * i] = x.x; f[2 * i + 1] = x.y;
    }
  }
};
template <>
struct Vec<__nv_bfloat16> {
  static constexpr int N = 8;
  __device__ static void load(const __nv_bfloat16* p, float* f) {
    uint4 v = *reinterpret_cast<const uint4*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 x = __bfloat1622float2(h[i]);
      f[2 * i] = x.x; f[2 * i + 1] = x.y;
    }
  }
};

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// RPW: candidate columns per warp (more reuse of each hidden load when runs are long).
// VEC: whether 16-byte vector loads are legal (d * sizeof(T) % 16 == 0, aligned bases).
template <typename T, int RPW, bool VEC>
__global__ void __launch_bounds__(kWarps * 32) indexed_logits_kernel(
    const T* __restrict__ hidden, const T* __restrict__ weight, const int32_t* __restrict__ ids,
    const int32_t* __restrict__ cnt, const int32_t* __restrict__ row_to_slot, float* __restrict__ out, int64_t M,
    int64_t d, int64_t W, int packed) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t col0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * RPW;
  const int64_t m_begin = static_cast<int64_t>(blockIdx.y) * kGroup;
  const int64_t m_end = min(m_begin + kGroup, M);
  if (col0 >= W) return;

  for (int64_t start = m_begin; start < m_end;) {
    // The run of rows [start, stop) that share one slot.
    const int32_t s = row_to_slot[start];
    int64_t stop = start + 1;
    while (stop < m_end && row_to_slot[stop] == s) ++stop;
    const int n = static_cast<int>(stop - start);
    const int32_t c = cnt[s];

    const T* rows[RPW];
    bool live[RPW];
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      const int64_t j = col0 + r;
      live[r] = j < W && j < c;
      const int64_t row = !live[r] ? 0 : (packed ? static_cast<int64_t>(s) * W + j : static_cast<int64_t>(ids[s * W + j]));
      rows[r] = weight + row * d;
    }

    float acc[RPW][kGroup];
#pragma unroll
    for (int r = 0; r < RPW; ++r)
#pragma unroll
      for (int g = 0; g < kGroup; ++g) acc[r][g] = 0.f;

    if (VEC) {
      constexpr int N = Vec<T>::N;
      for (int64_t k = static_cast<int64_t>(lane) * N; k < d; k += 32 * N) {
        float w[RPW][N];
#pragma unroll
        for (int r = 0; r < RPW; ++r) {
          if (live[r]) Vec<T>::load(rows[r] + k, w[r]);
        }
#pragma unroll
        for (int g = 0; g < kGroup; ++g) {
          if (g < n) {
            float h[N];
            Vec<T>::load(hidden + (start + g) * d + k, h);
#pragma unroll
            for (int r = 0; r < RPW; ++r)
#pragma unroll
              for (int i = 0; i < N; ++i) acc[r][g] = fmaf(w[r][i], h[i], acc[r][g]);
          }
        }
      }
    } else {
      for (int64_t k = lane; k < d; k += 32) {
        float w[RPW];
#pragma unroll
        for (int r = 0; r < RPW; ++r) w[r] = live[r] ? to_float(rows[r][k]) : 0.f;
#pragma unroll
        for (int g = 0; g < kGroup; ++g) {
          if (g < n) {
            const float h = to_float(hidden[(start + g) * d + k]);
#pragma unroll
            for (int r = 0; r < RPW; ++r) acc[r][g] = fmaf(w[r], h, acc[r][g]);
          }
        }
      }
    }

#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      const int64_t j = col0 + r;
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        if (g < n) {
          float v = acc[r][g];
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
          if (lane == 0 && j < W) out[(start + g) * W + j] = live[r] ? v : -INFINITY;
        }
      }
    }
    start = stop;
  }
}

template <typename T, int RPW>
cudaError_t launch_t(const void* hidden, const void* weight, const int32_t* ids, const int32_t* cnt,
                     const int32_t* row_to_slot, float* out, int64_t M, int64_t d, int64_t W, int packed,
                     cudaStream_t stream) {
  const bool vec = (d * static_cast<int64_t>(sizeof(T))) % 16 == 0 && reinterpret_cast<uintptr_t>(hidden) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(weight) % 16 == 0;
  const int64_t cols_per_block = static_cast<int64_t>(kWarps) * RPW;
  dim3 grid(static_cast<unsigned>((W + cols_per_block - 1) / cols_per_block),
            static_cast<unsigned>((M + kGroup - 1) / kGroup));
  dim3 block(kWarps * 32);
  const T* h = static_cast<const T*>(hidden);
  const T* w = static_cast<const T*>(weight);
  if (vec)
    indexed_logits_kernel<T, RPW, true><<<grid, block, 0, stream>>>(h, w, ids, cnt, row_to_slot, out, M, d, W, packed);
  else
    indexed_logits_kernel<T, RPW, false><<<grid, block, 0, stream>>>(h, w, ids, cnt, row_to_slot, out, M, d, W, packed);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_rpw(const void* hidden, const void* weight, const int32_t* ids, const int32_t* cnt,
                       const int32_t* row_to_slot, float* out, int64_t M, int64_t d, int64_t W, int packed,
                       cudaStream_t stream) {
  // Four columns per warp reuse each hidden load four times, but need four times fewer blocks:
  // use it only when the grid still has a few blocks per SM (cached: a host attribute query).
  static int sms = 0;
  if (sms == 0) {
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (sms <= 0) sms = 1;
  }
  const int64_t groups = (M + kGroup - 1) / kGroup;
  const int64_t blocks4 = (W + kWarps * 4 - 1) / (kWarps * 4) * groups;
  if (blocks4 >= 4 * static_cast<int64_t>(sms))
    return launch_t<T, 4>(hidden, weight, ids, cnt, row_to_slot, out, M, d, W, packed, stream);
  return launch_t<T, 1>(hidden, weight, ids, cnt, row_to_slot, out, M, d, W, packed, stream);
}

}  // namespace

extern "C" {

const char* specvocab_cuda_error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

// hidden [M, d] and weight [weight_rows, d] of `dtype` (0 f32, 1 f16, 2 bf16), contiguous;
// ids [R, W], cnt [R], row_to_slot [M] int32; out [M, W] fp32. `packed` != 0: weight is the
// packed buffer [R * W, d] and ids is unused. Returns a cudaError_t (0 = launched).
int specvocab_indexed_logits_launch(const void* hidden, const void* weight, const int32_t* ids, const int32_t* cnt,
                                    const int32_t* row_to_slot, float* out, int64_t M, int64_t d, int64_t W,
                                    int64_t weight_rows, int dtype, int packed, void* stream) {
  (void)weight_rows;
  if (M == 0 || W == 0) return 0;
  if ((M + kGroup - 1) / kGroup > 65535) return static_cast<int>(cudaErrorInvalidConfiguration);
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case 0: return static_cast<int>(launch_rpw<float>(hidden, weight, ids, cnt, row_to_slot, out, M, d, W, packed, st));
    case 1: return static_cast<int>(launch_rpw<__half>(hidden, weight, ids, cnt, row_to_slot, out, M, d, W, packed, st));
    case 2:
      return static_cast<int>(
          launch_rpw<__nv_bfloat16>(hidden, weight, ids, cnt, row_to_slot, out, M, d, W, packed, st));
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // extern "C"
