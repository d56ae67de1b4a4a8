// window_verify's per-request pass on the GPU: one thread per request runs the same row function as
// the C++ CPU op (window_verify_row.h). A round holds a few dozen entries per request, so a thread
// per request is enough; the window update that follows is window_update_kernel.cu.
#include <cuda_runtime.h>
#include <stdint.h>

#include "launchers.h"
#include "window_verify_row.h"

namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) window_verify_kernel(SpecvocabVerifyArgs args, int64_t B) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (b < B) sv_verify_row(args, b);
}

}  // namespace

extern "C" int specvocab_window_verify_launch(const SpecvocabVerifyArgs* args, int64_t B, void* stream) {
  if (B <= 0) return 0;
  const unsigned grid = static_cast<unsigned>((B + kThreads - 1) / kThreads);
  window_verify_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(*args, B);
  return static_cast<int>(cudaGetLastError());
}
