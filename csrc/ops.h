// The torch-facing side of the specvocab ops: one function per (op, device).
//
// Kernels live in .cu files that include no torch header; each exposes an `extern "C"`
// launcher taking raw pointers, sizes and the stream (as void*), returning a cudaError_t
// as int (0 = success). The .cpp files check arguments, implement the CPU version and
// call the launchers; binding.cpp registers everything with TORCH_LIBRARY. This split is
// what lets the extension build and load against a CPU-only torch (see docs/kernels.md, "Build").
#pragma once

#include <ATen/ATen.h>

#include <tuple>
#include <vector>

#include "launchers.h"

namespace specvocab {

// The debug setting (SGLANG_DYNVOCAB_DEBUG_CHECKS, read once at load; set_debug_checks_op changes it): host checks
// of values that the GPU ops otherwise trust or count, with the messages of the ops' Python checks (ops/<op>.py).
bool debug_checks();
void set_debug_checks_op(bool on);
// rows (any device; copied to the host) in [0, R) and distinct, else a RuntimeError naming the first bad one.
void check_rows(const char* op, const at::Tensor& rows, int64_t R);
// The table entries a logits call of M hidden rows reads (any device; copied to the host), else a ValueError naming
// the first bad one (ops/checks.py::check_table_entries); ids null for packed_logits.
void check_table_entries(const char* op, const at::Tensor* ids, const at::Tensor& cnt, const at::Tensor& row_to_slot,
                         int64_t W, int64_t V, int64_t M);

// indexed_logits: out[m, j] = dot(weight[r], hidden[m]) for j < cnt[s] and 0 <= r < V, else -inf, where
// s = row_to_slot[m / (M / B)] (B = row_to_slot's length: a slot per hidden row, or per request of request-major
// rows; int32 or int64) and r = ids[s, j], or row_map[ids[s, j]] with a row map (int32 [L]: ids to head rows, -1
// where the head has none; an id >= L is a bad one). A negative row is a dead column. Entries that break the table's
// contract (a slot outside [0, R), cnt outside [1, W], a row >= V) are read as table.head_reads says, on the CPU
// and the GPU alike: -inf where they would give columns, never out of bounds, and added to `bad` when given (the CUDA
// kernel with an atomic on that path only). Under the debug setting both refuse them instead.
at::Tensor indexed_logits_cpu(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& ids,
                              const at::Tensor& cnt, const at::Tensor& row_to_slot,
                              const c10::optional<at::Tensor>& bad, const c10::optional<at::Tensor>& row_map);
at::Tensor indexed_logits_cuda(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& ids,
                               const at::Tensor& cnt, const at::Tensor& row_to_slot,
                               const c10::optional<at::Tensor>& bad, const c10::optional<at::Tensor>& row_map);

// packed_logits: out[m, j] = dot(packed[s, j], hidden[m]) for j < cnt[s], else -inf; bad slots and counts as above.
at::Tensor packed_logits_cpu(const at::Tensor& hidden, const at::Tensor& packed, const at::Tensor& cnt,
                             const at::Tensor& row_to_slot, const c10::optional<at::Tensor>& bad);
at::Tensor packed_logits_cuda(const at::Tensor& hidden, const at::Tensor& packed, const at::Tensor& cnt,
                              const at::Tensor& row_to_slot, const c10::optional<at::Tensor>& bad);

// window_update: append block entries to each row's ring, then publish the row's set.
// window_update's checks of shapes, dtypes, layouts, devices and the two ints (window_verify runs them first too).
void check_window_update(at::Tensor& ring, at::Tensor& length, at::Tensor& ids, at::Tensor& cnt, const at::Tensor& rows,
                         const at::Tensor& block, int64_t fallback_id, int64_t vocab_size);
void window_update_cpu(at::Tensor& ring, at::Tensor& length, at::Tensor& ids, at::Tensor& cnt, const at::Tensor& rows,
                       const at::Tensor& block, int64_t fallback_id, int64_t vocab_size);
void window_update_cuda(at::Tensor& ring, at::Tensor& length, at::Tensor& ids, at::Tensor& cnt, const at::Tensor& rows,
                        const at::Tensor& block, int64_t fallback_id, int64_t vocab_size);

// window_verify: one verify round of the window policy (entries, telemetry, window_update); returns accepted.
at::Tensor window_verify_cpu(at::Tensor& ring, at::Tensor& length, at::Tensor& ids, at::Tensor& cnt, at::Tensor& acc,
                             const at::Tensor& rows, const at::Tensor& draft_token, const at::Tensor& accept_index,
                             const at::Tensor& accept_lens, const at::Tensor& predict, const at::Tensor& topk_values,
                             const at::Tensor& topk_ids, const c10::optional<at::Tensor>& hot, int64_t k, bool context,
                             bool compacted, int64_t fallback_id, int64_t vocab_size);
at::Tensor window_verify_cuda(at::Tensor& ring, at::Tensor& length, at::Tensor& ids, at::Tensor& cnt, at::Tensor& acc,
                              const at::Tensor& rows, const at::Tensor& draft_token, const at::Tensor& accept_index,
                              const at::Tensor& accept_lens, const at::Tensor& predict, const at::Tensor& topk_values,
                              const at::Tensor& topk_ids, const c10::optional<at::Tensor>& hot, int64_t k, bool context,
                              bool compacted, int64_t fallback_id, int64_t vocab_size);

// compact_topk: the draft head's top-k per logits row through its column map, with the row's logsumexp; returns
// (values [N, k], tokens [N, k] int64, lse [N]).
std::tuple<at::Tensor, at::Tensor, at::Tensor> compact_topk_cpu(const at::Tensor& logits,
                                                                const c10::optional<at::Tensor>& col_ids,
                                                                const c10::optional<at::Tensor>& rows, int64_t k,
                                                                int64_t fallback_id, int64_t mode);
std::tuple<at::Tensor, at::Tensor, at::Tensor> compact_topk_cuda(const at::Tensor& logits,
                                                                 const c10::optional<at::Tensor>& col_ids,
                                                                 const c10::optional<at::Tensor>& rows, int64_t k,
                                                                 int64_t fallback_id, int64_t mode);

// pack_update: bring the packed rows [R, W, d] and their ids up to date with the table.
void pack_update_cpu(at::Tensor& packed, at::Tensor& packed_ids, const at::Tensor& weight, const at::Tensor& ids,
                     const at::Tensor& cnt, const at::Tensor& rows);
void pack_update_cuda(at::Tensor& packed, at::Tensor& packed_ids, const at::Tensor& weight, const at::Tensor& ids,
                      const at::Tensor& cnt, const at::Tensor& rows);

// The launch plan of indexed_logits / packed_logits on a device with `sms` SMs (see launchers.h). `aligned`: the
// hidden and weight base pointers are 16-byte aligned; `per`: hidden rows per row_to_slot entry (M / B: a request's
// rows). A forced plan (force_logits_plan, tests and tuning) replaces mt, ntmax and zs where valid for the shapes.
SpecvocabLogitsPlan plan_logits(int64_t M, int64_t W, int64_t d, at::ScalarType dtype, bool aligned, int64_t sms,
                                int64_t per);
std::vector<int64_t> logits_plan_op(int64_t M, int64_t W, int64_t d, at::ScalarType dtype, bool aligned, int64_t sms,
                                    int64_t per);
void force_logits_plan_op(int64_t mt, int64_t ntmax, int64_t zs);
// The pieces (pieces.h) of row_to_slot: int64 [n, 2] of (first row, rows), in row order.
at::Tensor logits_pieces_op(const at::Tensor& row_to_slot, int64_t P);

// The current CUDA stream of `device` as a cudaStream_t (void*), without linking c10_cuda.
void* current_cuda_stream(const at::Device& device);

// Turn a launcher's return code into a torch error naming the op.
void check_launch(int code, const char* op);

}  // namespace specvocab
