// The torch-facing side of the specvocab ops: one function per (op, device).
//
// Kernels live in .cu files that include no torch header; each exposes an `extern "C"`
// launcher taking raw pointers, sizes and the stream (as void*), returning a cudaError_t
// as int (0 = success). The .cpp files check arguments, implement the CPU version and
// call the launchers; binding.cpp registers everything with TORCH_LIBRARY. This split is
// what lets the extension build and load against a CPU-only torch (see README, "Build").
#pragma once

#include <ATen/ATen.h>

namespace specvocab {

// indexed_logits: out[m, j] = dot(weight[ids[s, j]], hidden[m]) for j < cnt[s], else -inf.
at::Tensor indexed_logits_cpu(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& ids,
                              const at::Tensor& cnt, const at::Tensor& row_to_slot);
at::Tensor indexed_logits_cuda(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& ids,
                               const at::Tensor& cnt, const at::Tensor& row_to_slot);

// packed_logits: out[m, j] = dot(packed[s, j], hidden[m]) for j < cnt[s], else -inf.
at::Tensor packed_logits_cpu(const at::Tensor& hidden, const at::Tensor& packed, const at::Tensor& cnt,
                             const at::Tensor& row_to_slot);
at::Tensor packed_logits_cuda(const at::Tensor& hidden, const at::Tensor& packed, const at::Tensor& cnt,
                              const at::Tensor& row_to_slot);

// window_update: append block entries to each row's ring, then publish the row's set.
void window_update_cpu(at::Tensor& ring, at::Tensor& length, at::Tensor& ids, at::Tensor& cnt,
                       const at::Tensor& rows, const at::Tensor& block, int64_t fallback_id, int64_t vocab_size);
void window_update_cuda(at::Tensor& ring, at::Tensor& length, at::Tensor& ids, at::Tensor& cnt,
                        const at::Tensor& rows, const at::Tensor& block, int64_t fallback_id, int64_t vocab_size);

// pack_update: bring the packed rows [R, W, d] and their ids up to date with the table.
void pack_update_cpu(at::Tensor& packed, at::Tensor& packed_ids, const at::Tensor& weight, const at::Tensor& ids,
                     const at::Tensor& cnt, const at::Tensor& rows);
void pack_update_cuda(at::Tensor& packed, at::Tensor& packed_ids, const at::Tensor& weight, const at::Tensor& ids,
                      const at::Tensor& cnt, const at::Tensor& rows);

// The current CUDA stream of `device` as a cudaStream_t (void*), without linking c10_cuda.
void* current_cuda_stream(const at::Device& device);

// Turn a launcher's return code into a torch error naming the op.
void check_launch(int code, const char* op);

}  // namespace specvocab

// Dtype codes shared with the launchers (the .cu files cannot see at::ScalarType).
enum SpecvocabDtype : int { SV_F32 = 0, SV_F16 = 1, SV_BF16 = 2 };

extern "C" {
const char* specvocab_cuda_error_string(int code);
// Launchers: see each .cu file for the exact contract.
int specvocab_indexed_logits_launch(const void* hidden, const void* weight, const int32_t* ids, const int32_t* cnt,
                                    const int32_t* row_to_slot, float* out, int64_t M, int64_t d, int64_t W,
                                    int64_t weight_rows, int dtype, int packed, void* stream);
int specvocab_window_update_launch(int32_t* ring, int64_t* length, int32_t* ids, int32_t* cnt, const int64_t* rows,
                                   const int32_t* block, int64_t B, int64_t n, int64_t ring_stride, int64_t capacity,
                                   int32_t fallback_id, int64_t vocab_size, void* stream);
int specvocab_pack_update_launch(void* packed, int32_t* packed_ids, const void* weight, const int32_t* ids,
                                 const int32_t* cnt, const int64_t* rows, int32_t* scratch, int64_t B, int64_t W,
                                 int64_t d, int64_t vocab_size, int dtype, void* stream);
}
