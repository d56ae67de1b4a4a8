// compact_topk on the GPU: one block per logits row, running the row functions of the C++ CPU op
// (compact_topk_row.h). Rows of at most kTopkRegMaxW columns take the register path (kTopkRegLanes threads: the
// row in registers, k rounds of a block-wide maximum of 64-bit keys); wider rows the list path (kTopkLanes threads:
// sorted per-thread lists in shared memory, merged in a fixed tree). A draft step has a few to a few hundred rows,
// so one block per row keeps the step to one short launch.
#include <cuda_runtime.h>
#include <stdint.h>

#include "compact_topk_row.h"
#include "launchers.h"

namespace {

constexpr int kRegWarps = kTopkRegLanes / 32;

__global__ void __launch_bounds__(kTopkRegLanes) compact_topk_reg_kernel(SpecvocabTopkArgs a) {
  __shared__ float mx[kTopkRegLanes], sum[kTopkRegLanes];
  __shared__ uint64_t winners[2][kRegWarps];  // a round's warp maxima, double-buffered: one barrier per round
  const int64_t m = blockIdx.x;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  float x[kTopkRegPerLane];
  float M, S;
  sv_topk_reg_load(a, m, t, x, &M, &S);
  uint64_t best = sv_topk_reg_next(x, t, ~0ull);
  // The logsumexp: lane t absorbs lane t + s, s = kTopkRegLanes/2 ... 32 through shared memory, 16 ... 1 by shuffles
  // in warp 0 (the C++ op runs the same pairs in the same order).
  mx[t] = M;
  sum[t] = S;
  __syncthreads();
  for (int s = kTopkRegLanes / 2; s >= 32; s /= 2) {
    if (t < s) sv_lse_merge(&mx[t], &sum[t], mx[t + s], sum[t + s]);
    __syncthreads();
  }
  float lse = 0.0f;
  if (warp == 0) {
    M = mx[t];
    S = sum[t];
    for (int s = 16; s > 0; s /= 2) {
      const float bm = __shfl_down_sync(0xffffffffu, M, s), bs = __shfl_down_sync(0xffffffffu, S, s);
      if (lane < s) sv_lse_merge(&M, &S, bm, bs);
    }
    lse = __shfl_sync(0xffffffffu, sv_lse(M, S), 0);
  }
  // k rounds: the block's largest key wins; warp 0's lane r keeps round r's winner; the winner's lane moves on.
  uint64_t mine = 0;
  for (int r = 0; r < a.k; ++r) {
    uint64_t w = best;
    for (int o = 16; o > 0; o /= 2) {
      const uint64_t other = __shfl_xor_sync(0xffffffffu, w, o);
      w = other > w ? other : w;
    }
    if (lane == 0) winners[r & 1][warp] = w;
    __syncthreads();
    w = winners[r & 1][0];
    for (int i = 1; i < kRegWarps; ++i) w = winners[r & 1][i] > w ? winners[r & 1][i] : w;
    if (w == 0) break;  // no live column left: the same for every thread
    if (warp == 0 && lane == r) mine = w;
    if (best == w) best = sv_topk_reg_next(x, t, w);
  }
  if (warp == 0) {
    if (lane < a.k) sv_topk_reg_entry(a, m, lane, mine, lse);
    if (lane == 0) a.lse[m] = lse;
  }
}

__global__ void __launch_bounds__(kTopkLanes) compact_topk_list_kernel(SpecvocabTopkArgs a) {
  __shared__ float v[kTopkLanes * kTopkStride];
  __shared__ int32_t c[kTopkLanes * kTopkStride];
  __shared__ float mx[kTopkLanes], sum[kTopkLanes];
  const int64_t m = blockIdx.x;
  const int t = threadIdx.x;
  sv_topk_lane(a, m, t, &v[t * kTopkStride], &c[t * kTopkStride], &mx[t], &sum[t]);
  __syncthreads();
  for (int s = kTopkLanes / 2; s > 0; s /= 2) {
    if (t < s) {
      sv_topk_merge(&v[t * kTopkStride], &c[t * kTopkStride], &v[(t + s) * kTopkStride], &c[(t + s) * kTopkStride],
                    static_cast<int>(a.k));
      sv_lse_merge(&mx[t], &sum[t], mx[t + s], sum[t + s]);
    }
    __syncthreads();
  }
  if (t == 0) sv_topk_write(a, m, v, c, mx[0], sum[0]);
}

}  // namespace

extern "C" int specvocab_compact_topk_launch(const SpecvocabTopkArgs* args, void* stream) {
  if (args->N <= 0) return 0;
  if (args->N > 0x7fffffff) return static_cast<int>(cudaErrorInvalidValue);
  const unsigned blocks = static_cast<unsigned>(args->N);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (args->W <= kTopkRegMaxW)
    compact_topk_reg_kernel<<<blocks, kTopkRegLanes, 0, s>>>(*args);
  else
    compact_topk_list_kernel<<<blocks, kTopkLanes, 0, s>>>(*args);
  return static_cast<int>(cudaGetLastError());
}
