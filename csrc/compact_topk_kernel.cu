// compact_topk on the GPU: one block of kTopkLanes threads per logits row, running the row function of the C++
// CPU op (compact_topk_row.h): each thread scans its strided columns into a sorted top-k list in shared memory,
// then the lists and the (max, sum) pairs are merged in the same fixed tree. A draft step has a few to a few
// hundred rows of a few thousand columns, so one block per row keeps the step to one short launch.
#include <cuda_runtime.h>
#include <stdint.h>

#include "compact_topk_row.h"
#include "launchers.h"

namespace {

__global__ void __launch_bounds__(kTopkLanes) compact_topk_kernel(SpecvocabTopkArgs a) {
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
  compact_topk_kernel<<<static_cast<unsigned>(args->N), kTopkLanes, 0, static_cast<cudaStream_t>(stream)>>>(*args);
  return static_cast<int>(cudaGetLastError());
}
