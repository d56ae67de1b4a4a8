// MicroSpec window update, in place on the GPU: append a block of stream entries to each listed
// request's ring, then publish the request's set (the sorted distinct ids of the ring) into the
// candidate table. Exactly the torch reference (ops/window_update.py::reference_window_update):
//
//   valid entries of block[b, :] are the ids in [0, vocab_size), in order (others are holes);
//   of `count` valid entries only the last `capacity` are kept; kept entry of rank r goes to
//   ring[s, (length[s] + r) % capacity]; length[s] += count;
//   ids[s, :] = sorted distinct valid ids of ring[s, :capacity], then fallback_id; cnt[s] = their
//   number, or 1 (the set {fallback_id}) when the ring holds none.
//
// One block per listed row (window_update_block.h). Rows must be distinct; a row outside [0, R) (a bad request
// slot) is skipped: nothing is read or written for it.
#include <cuda_runtime.h>
#include <stdint.h>

#include "window_update_block.h"

namespace {

__global__ void __launch_bounds__(kWindowThreads)
    window_update_kernel(int32_t* __restrict__ ring, int64_t* __restrict__ length, int32_t* __restrict__ ids,
                         int32_t* __restrict__ cnt, const int64_t* __restrict__ rows, const int32_t* __restrict__ block,
                         int64_t num_rows, int64_t n, int64_t ring_stride, int64_t capacity, int32_t fallback_id,
                         int64_t vocab_size) {
  extern __shared__ uint32_t bitmap[];
  __shared__ SvWindowUpdateSmem sm;
  const int64_t b = blockIdx.x;
  const int64_t s = rows[b];
  if (s < 0 || s >= num_rows) return;  // the whole block: before any barrier
  sv_window_update_block(ring, length, ids, cnt, s, block + b * n, n, ring_stride, capacity, fallback_id, vocab_size,
                         bitmap, sm);
}

}  // namespace

extern "C" int specvocab_window_update_launch(int32_t* ring, int64_t* length, int32_t* ids, int32_t* cnt,
                                              const int64_t* rows, const int32_t* block, int64_t B, int64_t R,
                                              int64_t n, int64_t ring_stride, int64_t capacity, int32_t fallback_id,
                                              int64_t vocab_size, void* stream) {
  if (B == 0) return 0;
  const size_t smem = static_cast<size_t>((vocab_size + 31) / 32) * sizeof(uint32_t);
  // The kernel's static storage is a property of the compiled kernel: asked once, not in every round.
  static size_t static_smem = 0;
  const cudaError_t err = sv_window_smem_optin(window_update_kernel, smem, static_smem);
  if (err != cudaSuccess) return static_cast<int>(err);
  window_update_kernel<<<static_cast<unsigned>(B), kWindowThreads, smem, static_cast<cudaStream_t>(stream)>>>(
      ring, length, ids, cnt, rows, block, R, n, ring_stride, capacity, fallback_id, vocab_size);
  return static_cast<int>(cudaGetLastError());
}
