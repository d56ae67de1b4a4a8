// One verify round of the window policy on the GPU, in one launch: a block per request computes the round's entries
// (one thread each), its committed tokens and telemetry with the row functions of the C++ CPU op
// (window_verify_row.h), keeps the entries in shared memory, and then runs the window update over them
// (window_update_block.h) after a barrier, so the telemetry reads the set as it was before the round. It was two
// launches, the first a thread per request walking about a hundred dependent loads.
#include <cuda_runtime.h>
#include <stdint.h>

#include "launchers.h"
#include "window_update_block.h"
#include "window_verify_row.h"

namespace {

__global__ void __launch_bounds__(kWindowThreads) window_round_kernel(SpecvocabVerifyArgs a) {
  extern __shared__ uint32_t dyn[];  // the update's bitmap, then the raw entries and the entries
  __shared__ SvWindowUpdateSmem sm;
  __shared__ int counts[2];  // committed tokens, and those in the set
  const int t = threadIdx.x;
  const int64_t b = blockIdx.x;
  const int64_t n_ctx = sv_verify_n_ctx(a), n = sv_verify_n(a), words = (a.vocab_size + 31) / 32;
  int32_t* raw = reinterpret_cast<int32_t*>(dyn + words);
  int32_t* entries = raw + n;
  const int64_t row = a.rows[b];
  const int32_t live = sv_verify_row_ok(a, row) ? a.cnt[row] : 0;  // before the update
  if (t < 2) counts[t] = 0;
  for (int64_t j = t; j < n; j += kWindowThreads) raw[j] = sv_verify_raw(a, b, j);
  __syncthreads();
  for (int64_t j = t; j < n; j += kWindowThreads) entries[j] = sv_verify_entry(raw, n_ctx, j);
  for (int64_t s = t; s < a.S; s += kWindowThreads) {
    const int64_t tok = sv_verify_token(a, b, s);
    a.accepted[b * a.S + s] = tok;
    if (tok >= 0) {
      atomicAdd(&counts[0], 1);
      if (sv_verify_hit(a, row, live, tok)) atomicAdd(&counts[1], 1);
    }
  }
  __syncthreads();  // the entries are complete; every read of the set before the update is done
  if (t == 0) sv_verify_telemetry(a, row, live, counts[1], counts[0]);
  if (!sv_verify_row_ok(a, row)) return;  // the whole block: a bad slot reads and writes no table row
  sv_window_update_block(a.ring, a.length, a.ids, a.cnt, row, entries, n, a.ring_stride, a.capacity, a.fallback_id,
                         a.vocab_size, dyn, sm);
}

}  // namespace

extern "C" int specvocab_window_verify_launch(const SpecvocabVerifyArgs* args, int64_t B, void* stream) {
  if (B <= 0) return 0;
  const int64_t words = (args->vocab_size + 31) / 32, n = sv_verify_n(*args);
  const size_t smem = static_cast<size_t>(words) * sizeof(uint32_t) + static_cast<size_t>(2 * n) * sizeof(int32_t);
  static size_t static_smem = 0;
  const cudaError_t err = sv_window_smem_optin(window_round_kernel, smem, static_smem);
  if (err != cudaSuccess) return static_cast<int>(err);
  window_round_kernel<<<static_cast<unsigned>(B), kWindowThreads, smem, static_cast<cudaStream_t>(stream)>>>(*args);
  return static_cast<int>(cudaGetLastError());
}
