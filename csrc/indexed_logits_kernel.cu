// Fused indexed head: logits of each hidden row over its request's candidate rows of the LM head.
//
//   out[m, j] = dot(weight[r], hidden[m])  if j < cnt[s] and 0 <= r < V,  else -inf,
//   s = row_to_slot[m / (M / B)],  r = ids[s, j]  (or row_map[ids[s, j]])
//
// so the step from a draft's hidden rows and request slots to logits is this one launch: the slot of each
// request-major row and a d2t draft's (or a TP shard's) id-to-row map are read here, not made by separate ops.
//
// (packed mode: the candidate rows are packed[s, j] = weight[s * W + j] and only j < cnt[s] decides; the same kernel.)
//
// The op is bandwidth bound: the bytes that matter are the candidate rows (W * d * 2 per request, 25 MB at
// W 3072, d 4096, bf16), which must come from HBM once per request and call, however many hidden rows (tree
// branches) the request has. So the kernel is organised around *pieces*: a run of consecutive hidden rows with
// one slot (a request's branches; a whole batch for a union table) is cut into pieces of at most P = 8 * NTMAX
// rows, and a piece is one pass over its candidate rows that feeds every row of the piece.
//
// Work split (plan chosen on the host from shapes and the SM count only: SpecvocabLogitsPlan in launchers.h,
// plan_logits in indexed_logits.cpp):
// * grid (row tiles, column tiles). A row tile is P consecutive rows; the CTA of a row tile processes the pieces
//   that START in it (a short run that crosses a tile boundary still belongs to one CTA: its rows are read once).
//   Pieces (pieces.h, shared with the CPU kernel): a run [s, e) is cut at s, s+P and every multiple of P after
//   s+P, which is decidable from row_to_slot[m0-P-1, m0+2P) (one load per thread, scanned in shared memory; no
//   host work, graph-safe).
//   Row tiles vary fastest in the launch order, so the CTAs of one column tile (which read the same candidate
//   rows when a run is longer than P) run together and share them through L2.
// * grid z (plan.zs, 1 unless the grid would leave SMs idle): zs CTAs share a row tile's pieces, CTA z taking pieces
//   z, z + zs, ...; each piece is still one CTA's (its rows read once, its outputs written once), so the results are
//   the same bits. CTA z fetches the ids of row m0 + z * per (where its first piece starts when requests have `per`
//   rows each) while the pieces are found; a wrong guess costs one more fetch, not a wrong result.
// * a CTA (8 warps) owns 16 * MT * WC candidate columns; its warps are WC column groups x WD d-slices. Each warp
//   streams its d-slice of its MT * 16 candidate rows straight from HBM into registers (16-byte loads that skip
//   L1, U k-steps issued before the first use), and the piece's hidden rows (L1/L2) for the same slice.
// * bf16/fp16: tensor cores, mma.sync m16n8k16 with fp32 accumulation: A = 16 candidate rows, B = 8 hidden rows.
//   The k order inside a 32-element step is permuted (thread c of a quad holds elements [8c, 8c+8) of both A and
//   B, so every load is 16 bytes); a dot product is invariant to a permutation applied to both operands.
//   fp32: the same tiling on the FMA pipe (no tf32: fp32 in, fp32 products and sums).
// * the WD partial sums of a column are added in shared memory in slice order (deterministic, no atomics).
// * dead columns (j >= cnt[s] or a negative id) are never read and give -inf; a column tile with no live column
//   skips the d-loop, and a CTA whose first column is past cnt[s] writes -inf without loading anything.
// * bad table entries (sglang_specvocab/table.py::head_reads, the definition every backend follows): a slot outside
//   [0, R) reads as count 0, a count is clamped into [0, W], an id >= V is a dead column; nothing is read out of
//   bounds. With a counter (a.bad), a piece whose slot or count is bad adds its rows (by the CTAs of column tile 0)
//   and a bad id adds the piece's rows (by the one thread that owns the column): an atomic on the bad path only.
//
// The summation order of out[m, j] depends only on d and the dtype (the d-slices, WD = f(d)), never on M, the
// piece, the row's position in it, MT or NTMAX: a row's logits are bitwise the same whatever else is in the batch
// (rows=10 and rows=1 give identical logits for a shared row; batch invariant).
//
// Cost model (H100: 132 SMs, 3.35 TB/s; W 3072, d 4096, bf16; WD 8, WC 1; U * MT = 4 k-steps of 512 B each per
// warp in flight = 4 KB per warp; 2 CTAs = 16 warps per SM at most -> up to 64 KB in flight per SM):
//   bs  rows  M    NTMAX MT  grid (row x col tiles)  CTAs/SM  HBM bytes (candidate rows)  hidden rows via L2
//   1   1     1    2     1   1 x 192                  1.5      25.2 MB (ideal 7.5 us)      8 KB x 192 = 1.6 MB
//   1   4     4    2     1   1 x 192                  1.5      25.2 MB                      6.3 MB
//   1   10    10   2     1   1 x 192                  1.5      25.2 MB                      15.7 MB
//   8   1     8    2     1   1 x 192 (8 pieces each)  1.5      201 MB (ideal 60 us)         12.6 MB
//   8   4     32   2     1   2 x 192 (4 pieces each)  2.9      201 MB                       50 MB
//   8   10    80   2     2   5 x 96  (1-2 pieces)     3.6      201 MB                       63 MB
//   64  1     64   2     2   4 x 96  (16 pieces)      2.9      1.61 GB (ideal 480 us)       50 MB
//   64  4     256  4     2   8 x 96  (8 pieces)       5.8      1.61 GB                      200 MB
//   64  10    640  4     2   20 x 96 (3-4 pieces)     14.5     1.61 GB                      503 MB
// At bs 1 all 192 CTAs (1536 warps, about 6 MB in flight) are resident at once and stream one 128 KB column tile
// each: the time is the HBM stream (7.5 us at peak) plus the start (launch, the slot -> ids -> rows load chain,
// about 2 us), and rows 10 adds only L2 traffic and tensor-core work, not HBM bytes. Not yet measured: the open
// choice is MT at small batch (192 CTAs of 16 columns, or 96 of 32 with half the hidden-row traffic at rows 10);
// scripts/sweep_logits_plans.py times both, and the results never differ.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "launchers.h"
#include "pieces.h"

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

struct Args {
  const void* hidden;
  const void* weight;
  const int32_t* ids;
  const int32_t* cnt;
  const void* slots;       // row_to_slot [B]: int64 if slot64, else int32; row m's entry is m / per
  const int32_t* row_map;  // [L] ids to head rows (-1: none), or null
  int64_t per, L;
  int slot64;
  float* out;
  unsigned long long* bad;  // the bad-entry counter, or null
  int64_t M, d, W, V, R;
  int packed;
  int wd, wc;      // warps per CTA = wd * wc = 8
  int64_t nsteps;  // k-steps of d
  int zs;          // CTAs per row tile (grid z)
};

// Row m's slot (the slot expansion of request-major rows happens here, not in a separate op); an int64 slot outside
// int range reads as -1, a bad slot.
__device__ __forceinline__ int slot_at(const Args& a, int64_t m) {
  // rows and requests fit 32 bits (M < 2^31): a 32-bit division, none for one slot per row
  const int64_t b = a.per == 1 ? m : static_cast<int64_t>(static_cast<uint32_t>(m) / static_cast<uint32_t>(a.per));
  if (!a.slot64) return static_cast<const int32_t*>(a.slots)[b];
  const int64_t v = static_cast<const int64_t*>(a.slots)[b];
  return v < 0 || v > 0x7fffffff ? -1 : static_cast<int>(v);
}

// 16 bytes of a candidate row: read once, so skip L1 (L2 keeps it for the other row tiles and draft steps).
__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// 16 bytes of a hidden row: read by every column group and CTA of the piece, so cache it in L1.
__device__ __forceinline__ uint4 load_cached(const void* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

__device__ __forceinline__ uint16_t raw16(const __half& x) { return __half_as_ushort(x); }
__device__ __forceinline__ uint16_t raw16(const __nv_bfloat16& x) { return __bfloat16_as_ushort(x); }

// 8 16-bit elements from p where only the first n (0..8) exist (odd d or unaligned tensors): zero-filled.
template <typename T>
__device__ __forceinline__ uint4 load8_scalar(const T* p, int64_t n) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t lo = 2 * i < n ? raw16(p[2 * i]) : 0u;
    const uint32_t hi = 2 * i + 1 < n ? raw16(p[2 * i + 1]) : 0u;
    w[i] = lo | (hi << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1);

template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma16816<__half>(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                 uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Shared-memory partial sums: per warp, [8 * NTMAX hidden rows][16 * MT columns + 4] floats. The pad of 4 makes
// the fragment stores conflict-free (lanes (g, c) hit banks 8c + g).
template <int MT>
struct RedLayout {
  static constexpr int kStride = 16 * MT + 4;
};

// One warp, bf16/fp16: partial logits of its 16 * MT candidate rows (arow, nullptr = dead) for NT * 8 hidden rows
// of the piece (row0 .. row0 + len) over the k-steps [st0, st1) of 32 elements; written to `red` (this warp's
// block of the partial-sum buffer).
template <typename T, int MT, int NT, bool VEC>
__device__ __forceinline__ void piece_mma(const Args& a, const T* const (&arow)[MT][2], int64_t row0, int len,
                                          int64_t st0, int64_t st1, float* red) {
  constexpr int U = MT * NT >= 4 ? 2 : 4 / MT;  // k-steps in flight: 4 KB of candidate rows per warp at MT * U = 4
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const T* hidden = static_cast<const T*>(a.hidden);
  const T* brow[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int n = nt * 8 + g;
    brow[nt] = n < len ? hidden + (row0 + n) * a.d : nullptr;
  }
  float acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.f;

  const int64_t k_end = a.d;
  for (int64_t st = st0; st < st1; st += U) {
    uint4 av[U][MT][2], bv[U][NT];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = (st + u) * 32 + 8 * c;
      const bool in = st + u < st1 && k < k_end;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint4 v = make_uint4(0u, 0u, 0u, 0u);
          if (in && arow[mt][h] != nullptr)
            v = VEC ? load_stream(arow[mt][h] + k) : load8_scalar(arow[mt][h] + k, k_end - k);
          av[u][mt][h] = v;
        }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (in && brow[nt] != nullptr) v = VEC ? load_cached(brow[nt] + k) : load8_scalar(brow[nt] + k, k_end - k);
        bv[u][nt] = v;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (st + u >= st1) break;  // warp-uniform: only whole k-steps are skipped
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint4 lo = av[u][mt][0], hi = av[u][mt][1], b = bv[u][nt];
          // elements [8c, 8c+4) of the step, then [8c+4, 8c+8): the same permutation for A and B
          mma16816<T>(acc[mt][nt], lo.x, hi.x, lo.y, hi.y, b.x, b.y);
          mma16816<T>(acc[mt][nt], lo.z, hi.z, lo.w, hi.w, b.z, b.w);
        }
    }
  }
  // C fragment: c0, c1 = (candidate g, hidden 2c, 2c+1); c2, c3 = (candidate g + 8, same hidden rows).
  constexpr int S = RedLayout<MT>::kStride;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int n = nt * 8 + 2 * c, col = mt * 16 + g;
      red[n * S + col] = acc[mt][nt][0];
      red[(n + 1) * S + col] = acc[mt][nt][1];
      red[n * S + col + 8] = acc[mt][nt][2];
      red[(n + 1) * S + col + 8] = acc[mt][nt][3];
    }
}

// One warp, fp32 on the FMA pipe (MT = 1): lane (g, c) holds candidate rows g and g + 8 and elements [4c, 4c+4)
// of each 16-element k-step, for every hidden row of the piece; the quad adds its four partial sums at the end.
template <int NT, bool VEC>
__device__ __forceinline__ void piece_fma(const Args& a, const float* const (&arow)[1][2], int64_t row0, int len,
                                          int64_t st0, int64_t st1, float* red) {
  constexpr int U = 2;
  constexpr int N = NT * 8;
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const float* hidden = static_cast<const float*>(a.hidden) + row0 * a.d;
  float acc[2][N];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int n = 0; n < N; ++n) acc[h][n] = 0.f;
  const int64_t k_end = a.d;
  auto load4 = [&](const float* p, int64_t k, bool in) -> float4 {
    if (!in || p == nullptr) return make_float4(0.f, 0.f, 0.f, 0.f);
    if (VEC) return __ldg(reinterpret_cast<const float4*>(p + k));
    const int64_t n = k_end - k;
    return make_float4(p[k], n > 1 ? p[k + 1] : 0.f, n > 2 ? p[k + 2] : 0.f, n > 3 ? p[k + 3] : 0.f);
  };
  for (int64_t st = st0; st < st1; st += U) {
    float4 w[U][2];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = (st + u) * 16 + 4 * c;
      const bool in = st + u < st1 && k < k_end;
#pragma unroll
      for (int h = 0; h < 2; ++h) w[u][h] = load4(arow[0][h], k, in);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = (st + u) * 16 + 4 * c;
      const bool in = st + u < st1 && k < k_end;
#pragma unroll
      for (int n = 0; n < N; ++n) {
        if (n < len) {  // warp-uniform
          const float4 x = load4(hidden + n * a.d, k, in);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            acc[h][n] = fmaf(w[u][h].x, x.x, acc[h][n]);
            acc[h][n] = fmaf(w[u][h].y, x.y, acc[h][n]);
            acc[h][n] = fmaf(w[u][h].z, x.z, acc[h][n]);
            acc[h][n] = fmaf(w[u][h].w, x.w, acc[h][n]);
          }
        }
      }
    }
  }
  constexpr int S = RedLayout<1>::kStride;
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int n = 0; n < N; ++n) {
      float v = acc[h][n];
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      if ((n & 3) == c) red[n * S + g + 8 * h] = v;
    }
}

template <typename T, int MT, int NT, bool VEC>
__device__ __forceinline__ void piece(const Args& a, const T* const (&arow)[MT][2], int64_t row0, int len, int64_t st0,
                                      int64_t st1, float* red) {
  if constexpr (std::is_same<T, float>::value) {
    static_assert(MT == 1, "the fp32 path has one 16-column tile per warp");
    piece_fma<NT, VEC>(a, arow, row0, len, st0, st1, red);
  } else {
    piece_mma<T, MT, NT, VEC>(a, arow, row0, len, st0, st1, red);
  }
}

template <typename T, int MT, int NTMAX, bool VEC>
__global__ void __launch_bounds__(kThreads, 2) indexed_logits_kernel(const Args a) {
  constexpr int P = 8 * NTMAX;   // rows per piece and per row tile
  constexpr int NW = 3 * P + 1;  // row_to_slot window [m0 - P - 1, m0 + 2P)
  constexpr int S = RedLayout<MT>::kStride;
  static_assert(P <= 32, "one warp finds the pieces");
  __shared__ int s_win[NW];
  __shared__ int4 s_piece[P];  // (offset from m0, length, slot, -)
  __shared__ int s_npiece;
  __shared__ float s_red[kWarps * P * S];
  __shared__ unsigned char s_live[kWarps * MT * 16];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2;
  const int wd = warp % a.wd, wc = warp / a.wd;
  const int64_t M = a.M, W = a.W;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * P;
  const int64_t w0 = m0 - P - 1;
  const int cta_cols = 16 * MT * a.wc;
  const int64_t col_base = static_cast<int64_t>(blockIdx.y) * cta_cols;

  // This thread's candidate columns (tile mt, row g + 8h of the warp's tiles) and their ids and count for the slot
  // `cur_slot`. A slot's ids and count are loaded together (one hop after the slot); the first row's slot is
  // fetched before the pieces are known, so the usual chain is row_to_slot -> ids, cnt -> candidate rows.
  const T* weight = static_cast<const T*>(a.weight);
  int cur_slot = -1;
  int64_t cur_cnt = 0;
  bool cur_bad = false;  // the slot or its count is out of range
  int32_t cur_id[MT][2];
  auto fetch = [&](int s) {
    cur_slot = s;
    const bool ok = s >= 0 && s < a.R;  // out-of-range slots (never valid input) give -inf, not a bad read
    const int64_t c = ok ? a.cnt[s] : 0;
    cur_bad = c < 1 || c > W;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t j = col_base + (wc * MT + mt) * 16 + g + 8 * h;
        const int32_t id = ok && !a.packed && j < W ? a.ids[static_cast<int64_t>(s) * W + j] : 0;
        // through the row map (pieces.h): one past the map reads as a bad row (>= V)
        cur_id[mt][h] = static_cast<int32_t>(specvocab::head_row(id, a.row_map, a.L, 0x7fffffff));
      }
    cur_cnt = c < 0 ? 0 : (c > W ? W : c);
  };
  const int zs = static_cast<int>(gridDim.z), z = static_cast<int>(blockIdx.z);
  const int64_t first = m0 + static_cast<int64_t>(z) * a.per;  // where this CTA's first piece likely starts
  fetch(slot_at(a, first < M ? first : M - 1));

  // 1. The pieces that start in rows [m0, m0 + P).
  for (int t = threadIdx.x; t < NW; t += kThreads) {
    const int64_t i = w0 + t;
    s_win[t] = i >= 0 && i < M ? slot_at(a, i) : 0;
  }
  __syncthreads();
  if (warp == 0) {
    const int64_t m = m0 + lane;
    int len = 0;
    if (lane < P && m < M) {
      // piece_length reads rows [m - P - 1, m + P): inside the window.
      len = specvocab::piece_length([&](int64_t i) { return s_win[i - w0]; }, m, M, P);
    }
    const unsigned mask = __ballot_sync(0xffffffffu, len > 0);
    if (len > 0) s_piece[__popc(mask & ((1u << lane) - 1u))] = make_int4(lane, len, s_win[m - w0], 0);
    if (lane == 0) s_npiece = __popc(mask);
  }
  __syncthreads();

  // This warp's d-slice: k-steps [st0, st1), a function of d only (the summation order).
  const int64_t st0 = a.nsteps * wd / a.wd, st1 = a.nsteps * (wd + 1) / a.wd;
  float* red = s_red + warp * (P * S);
  const int npiece = s_npiece;
  for (int q = z; q < npiece; q += zs) {  // CTA-uniform: a CTA past the tile's pieces has nothing to do
    const int4 pc = s_piece[q];
    const int64_t row0 = m0 + pc.x;
    const int len = pc.y;
    if (pc.z != cur_slot) fetch(pc.z);  // CTA-uniform
    if (a.bad != nullptr && cur_bad && blockIdx.y == 0 && threadIdx.x == 0)
      atomicAdd(a.bad, static_cast<unsigned long long>(len));  // one per hidden row of the piece
    const int64_t col_end = min(W, col_base + cta_cols);
    if (col_base >= cur_cnt) {  // the whole column tile is dead for this piece: no loads
      for (int idx = threadIdx.x; idx < (col_end - col_base) * len; idx += kThreads) {
        const int64_t n = idx / (col_end - col_base), j = col_base + idx % (col_end - col_base);
        a.out[(row0 + n) * W + j] = -INFINITY;
      }
      continue;  // CTA-uniform: no barrier is skipped by a subset of threads
    }
    const T* arow[MT][2];
    bool any = false;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int local = (wc * MT + mt) * 16 + g + 8 * h;
        const int64_t j = col_base + local;
        const int32_t id = cur_id[mt][h];
        // a negative id is a dead column; ids >= V are invalid input, never read
        const bool live = j < cur_cnt && (a.packed || (id >= 0 && id < a.V));
        const int64_t row = a.packed ? static_cast<int64_t>(cur_slot) * W + j : id;
        arow[mt][h] = live ? weight + row * a.d : nullptr;
        any |= live;
        if (wd == 0 && (lane & 3) == 0) {  // the one thread of this column
          s_live[local] = live;
          if (a.bad != nullptr && j < cur_cnt && !a.packed && id >= a.V)
            atomicAdd(a.bad, static_cast<unsigned long long>(len));
        }
      }
    if (__any_sync(0xffffffffu, any)) {  // a column tile with no live column skips the d-loop
      switch ((len + 7) / 8) {
        case 1:
          piece<T, MT, 1, VEC>(a, arow, row0, len, st0, st1, red);
          break;
        case 2:
          piece<T, MT, (NTMAX >= 2 ? 2 : 1), VEC>(a, arow, row0, len, st0, st1, red);
          break;
        case 3:
          piece<T, MT, (NTMAX >= 3 ? 3 : 1), VEC>(a, arow, row0, len, st0, st1, red);
          break;
        default:
          piece<T, MT, NTMAX, VEC>(a, arow, row0, len, st0, st1, red);
          break;
      }
    }
    __syncthreads();
    // 2. Add the d-slices in slice order and store; consecutive threads write consecutive columns.
    const int ncols = static_cast<int>(col_end - col_base);
    for (int idx = threadIdx.x; idx < ncols * len; idx += kThreads) {
      const int n = idx / ncols, local = idx % ncols;
      float v = -INFINITY;
      if (s_live[local]) {
        const int group = local / (16 * MT), col = local % (16 * MT);
        const float* p = s_red + (group * a.wd) * (P * S) + n * S + col;
        v = p[0];
        for (int w = 1; w < a.wd; ++w) v += p[w * (P * S)];
      }
      a.out[(row0 + n) * W + col_base + local] = v;
    }
    __syncthreads();  // s_red and s_live are rewritten by the next piece
  }
}

template <typename T, int MT, int NTMAX, bool VEC>
cudaError_t launch(const Args& a, cudaStream_t stream) {
  const int64_t rows_per_tile = 8 * NTMAX, cols_per_cta = 16 * MT * a.wc;
  const int64_t gx = (a.M + rows_per_tile - 1) / rows_per_tile, gy = (a.W + cols_per_cta - 1) / cols_per_cta;
  if (gx > 0x7fffffff || gy > 65535 || a.zs < 1 || a.zs > 64) return cudaErrorInvalidConfiguration;
  dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy), static_cast<unsigned>(a.zs));
  indexed_logits_kernel<T, MT, NTMAX, VEC><<<grid, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_plan(const Args& a, const SpecvocabLogitsPlan& plan, cudaStream_t stream) {
  if (!plan.vec) {
    if (plan.mt == 1 && plan.ntmax == 2) return launch<T, 1, 2, false>(a, stream);
    return cudaErrorInvalidValue;
  }
  if constexpr (std::is_same<T, float>::value) {
    if (plan.mt == 1 && plan.ntmax == 2) return launch<T, 1, 2, true>(a, stream);
  } else {
    if (plan.mt == 1 && plan.ntmax == 2) return launch<T, 1, 2, true>(a, stream);
    if (plan.mt == 2 && plan.ntmax == 2) return launch<T, 2, 2, true>(a, stream);
    if (plan.mt == 1 && plan.ntmax == 4) return launch<T, 1, 4, true>(a, stream);
    if (plan.mt == 2 && plan.ntmax == 4) return launch<T, 2, 4, true>(a, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

extern "C" {

const char* specvocab_cuda_error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

int specvocab_sm_count(void) {
  // Cached per device: a host attribute query once, nothing per call after that.
  static int counts[64] = {0};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) return -1;
  if (dev >= 64) {
    int n = 0;
    return cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess ? n : -1;
  }
  if (counts[dev] == 0) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) return -1;
    counts[dev] = n;
  }
  return counts[dev];
}

// See ops.h for the contract.
int specvocab_indexed_logits_launch(const void* hidden, const void* weight, const int32_t* ids, const int32_t* cnt,
                                    const void* row_to_slot, int slot64, int64_t B, const int32_t* row_map, int64_t L,
                                    float* out, int64_t* bad, int64_t M, int64_t d, int64_t W, int64_t V, int64_t R,
                                    int dtype, int packed, const SpecvocabLogitsPlan* plan, void* stream) {
  if (M == 0 || W == 0) return 0;
  if (plan == nullptr || plan->wd * plan->wc != kWarps || plan->wd < 1) return static_cast<int>(cudaErrorInvalidValue);
  if (B < 1 || M % B != 0) return static_cast<int>(cudaErrorInvalidValue);
  // int64 counts add as unsigned 64-bit (two's complement: the same bits)
  Args a{hidden,
         weight,
         ids,
         cnt,
         row_to_slot,
         row_map,
         M / B,
         L,
         slot64,
         out,
         reinterpret_cast<unsigned long long*>(bad),
         M,
         d,
         W,
         V,
         R,
         packed,
         plan->wd,
         plan->wc,
         plan->nsteps,
         plan->zs};
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case SV_F32:
      return static_cast<int>(launch_plan<float>(a, *plan, st));
    case SV_F16:
      return static_cast<int>(launch_plan<__half>(a, *plan, st));
    case SV_BF16:
      return static_cast<int>(launch_plan<__nv_bfloat16>(a, *plan, st));
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // extern "C"
