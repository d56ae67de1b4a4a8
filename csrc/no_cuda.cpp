// Built instead of the .cu files when nvcc is absent at install time: the launchers exist (so the
// CUDA wrappers link) but binding.cpp registers no CUDA kernels, so none of these can be reached.
#include "ops.h"

extern "C" {
const char* specvocab_cuda_error_string(int) {
  return "built without CUDA kernels (nvcc was not found at install time)";
}
int specvocab_sm_count(void) { return -1; }
int specvocab_indexed_logits_launch(const void*, const void*, const int32_t*, const int32_t*, const void*, int, int64_t,
                                    const int32_t*, int64_t, float*, int64_t*, int64_t, int64_t, int64_t, int64_t,
                                    int64_t, int, int, const SpecvocabLogitsPlan*, void*) {
  return -1;
}
int specvocab_window_update_launch(int32_t*, int64_t*, int32_t*, int32_t*, const int64_t*, const int32_t*, int64_t,
                                   int64_t, int64_t, int64_t, int64_t, int32_t, int64_t, void*) {
  return -1;
}
int specvocab_window_verify_launch(const SpecvocabVerifyArgs*, int64_t, void*) { return -1; }
int specvocab_compact_topk_launch(const SpecvocabTopkArgs*, void*) { return -1; }
int specvocab_pack_update_launch(void*, int32_t*, const void*, const int32_t*, const int32_t*, const int64_t*, int32_t*,
                                 int64_t, int64_t, int64_t, int64_t, int64_t, int, void*) {
  return -1;
}
}
