// window_update's work for one request, by one CUDA block (device code: only the .cu files include this header),
// shared by window_update_kernel.cu (the op) and window_verify_kernel.cu (a verify round, whose entries come from
// shared memory). Semantics: csrc/window_update.cpp and ops/window_update.py::reference_window_update.
//
// The set is rebuilt from the ring through a bitmap of the vocabulary in shared memory (V / 8 bytes: 32 KB at 262k):
// ring entries set bits, a block-wide scan of per-thread popcounts gives each id its column, so the row comes out
// ascending without a sort. The bitmap's zeroing and scan are what make this a block's work, not a warp's.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

constexpr int kWindowThreads = 512;

struct SvWindowUpdateSmem {
  union {
    typename cub::BlockScan<int, kWindowThreads>::TempStorage scan;
    typename cub::BlockReduce<int, kWindowThreads>::TempStorage reduce;
  } tmp;
  int shared_int;
};

// Appends the valid entries[0, n) to row s's ring, then publishes its set; bitmap: (vocab_size + 31) / 32 words of
// shared memory. Every thread of the block calls it (it has barriers); s is in [0, R).
__device__ __forceinline__ void sv_window_update_block(int32_t* __restrict__ ring, int64_t* __restrict__ length,
                                                       int32_t* __restrict__ ids, int32_t* __restrict__ cnt, int64_t s,
                                                       const int32_t* entries, int64_t n, int64_t ring_stride,
                                                       int64_t capacity, int32_t fallback_id, int64_t vocab_size,
                                                       uint32_t* bitmap, SvWindowUpdateSmem& sm) {
  using Scan = cub::BlockScan<int, kWindowThreads>;
  using Reduce = cub::BlockReduce<int, kWindowThreads>;
  const int t = threadIdx.x;
  int32_t* my_ring = ring + s * ring_stride;
  const int64_t len0 = length[s];
  auto valid = [&](int32_t v) { return v >= 0 && static_cast<int64_t>(v) < vocab_size; };

  // 1. How many valid entries this append has.
  int mine = 0;
  for (int64_t i = t; i < n; i += kWindowThreads) mine += valid(entries[i]) ? 1 : 0;
  const int total = Reduce(sm.tmp.reduce).Sum(mine);
  if (t == 0) sm.shared_int = total;
  __syncthreads();
  const int64_t count = sm.shared_int;

  // 2. Append: rank each valid entry (chunked exclusive scan), keep the last `capacity`.
  int64_t base = 0;
  for (int64_t c0 = 0; c0 < n; c0 += kWindowThreads) {
    const int64_t i = c0 + t;
    const int32_t v = i < n ? entries[i] : -1;
    const int flag = valid(v) ? 1 : 0;
    int rank, chunk;
    Scan(sm.tmp.scan).ExclusiveSum(flag, rank, chunk);
    const int64_t r = base + rank;
    if (flag && r >= count - capacity) my_ring[(len0 + r) % capacity] = v;
    base += chunk;
    __syncthreads();  // tmp is reused by the next chunk's scan
  }
  if (t == 0) length[s] = len0 + count;

  // 3. Bitmap of the ring's ids (the ring writes above are visible after the barrier).
  const int64_t words = (vocab_size + 31) / 32;
  for (int64_t w = t; w < words; w += kWindowThreads) bitmap[w] = 0u;
  __syncthreads();
  for (int64_t p = t; p < capacity; p += kWindowThreads) {
    const int32_t v = my_ring[p];
    if (valid(v)) atomicOr(&bitmap[v >> 5], 1u << (v & 31));
  }
  __syncthreads();

  // 4. Each thread owns a contiguous range of words; a scan of their popcounts places its ids.
  const int64_t per = (words + kWindowThreads - 1) / kWindowThreads;
  const int64_t w0 = min(static_cast<int64_t>(t) * per, words);
  const int64_t w1 = min(w0 + per, words);
  int pop = 0;
  for (int64_t w = w0; w < w1; ++w) pop += __popc(bitmap[w]);
  int offset, distinct;
  Scan(sm.tmp.scan).ExclusiveSum(pop, offset, distinct);
  int32_t* my_ids = ids + s * capacity;
  int64_t col = offset;
  for (int64_t w = w0; w < w1; ++w) {
    uint32_t bits = bitmap[w];
    while (bits) {
      const int bit = __ffs(bits) - 1;
      bits &= bits - 1;
      if (col < capacity) my_ids[col] = static_cast<int32_t>(w * 32 + bit);
      ++col;
    }
  }
  for (int64_t j = distinct + t; j < capacity; j += kWindowThreads) my_ids[j] = fallback_id;
  if (t == 0) {
    if (distinct == 0) my_ids[0] = fallback_id;
    cnt[s] = distinct > 0 ? distinct : 1;
  }
}

// Dynamic shared memory for `kernel` beyond the 48 KB a block gets without opting in: asks for it (once per size
// above the last), or returns the error. static_smem: the kernel's own static shared memory.
template <typename Kernel>
inline cudaError_t sv_window_smem_optin(Kernel kernel, size_t smem, size_t& static_smem) {
  if (static_smem == 0) {
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, kernel) == cudaSuccess) {
      static_smem = attr.sharedSizeBytes;
    } else {
      cudaGetLastError();      // not left for the launch check to report
      static_smem = 8 * 1024;  // a safe bound on the scan storage
    }
  }
  if (smem + static_smem <= 48 * 1024) return cudaSuccess;
  int dev = 0, optin = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (smem + static_smem > static_cast<size_t>(optin)) return cudaErrorInvalidValue;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
}
