// The one TORCH_LIBRARY binding of the specvocab ops: schemas, CPU and CUDA kernels.
// Fake (meta) kernels are registered from Python (sglang_specvocab/ops/_ext.py).
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include "ops.h"

namespace specvocab {

void* current_cuda_stream(const at::Device& device) {
  // c10's virtual device guard answers for CUDA once torch's CUDA library is loaded; going
  // through it keeps this extension free of a link-time dependency on libc10_cuda, so the same
  // sources build against a CPU-only torch (where no CUDA tensor can ever reach this code).
  const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  return impl->getStream(device).native_handle();
}

void check_launch(int code, const char* op) {
  TORCH_CHECK(code == 0, "specvocab::", op, ": CUDA launch failed: ", specvocab_cuda_error_string(code));
}

}  // namespace specvocab

TORCH_LIBRARY(specvocab, m) {
  // out[m, j] = dot(weight[ids[s, j]], hidden[m]) for j < cnt[s] and ids[s, j] >= 0, else -inf; s = row_to_slot[m].
  // A negative id is a dead column (a set mapped to local head rows, d2t or a TP shard, keeps its slot).
  m.def("indexed_logits(Tensor hidden, Tensor weight, Tensor ids, Tensor cnt, Tensor row_to_slot) -> Tensor");
  m.def("packed_logits(Tensor hidden, Tensor packed, Tensor cnt, Tensor row_to_slot) -> Tensor");
  m.def(
      "window_update(Tensor(a!) ring, Tensor(b!) length, Tensor(c!) ids, Tensor(d!) cnt, Tensor rows, Tensor block, "
      "int fallback_id, int vocab_size) -> ()");
  // One verify round of the window policy: entries from SGLang's verify tensors, telemetry into acc, then
  // window_update; returns the committed tokens [B, S] (ops/reference.py::window_verify is the definition).
  m.def(
      "window_verify(Tensor(a!) ring, Tensor(b!) length, Tensor(c!) ids, Tensor(d!) cnt, Tensor(e!) acc, Tensor rows, "
      "Tensor draft_token, Tensor accept_index, Tensor accept_lens, Tensor predict, Tensor topk_values, "
      "Tensor topk_ids, Tensor? hot, int k, bool context, bool compacted, int fallback_id, int vocab_size) -> Tensor");
  // The draft head's top-k: per row the top k columns (value descending, then column ascending), their token ids
  // through col_ids (none, [W], or [R, W] with each request's map row in rows), the row's logsumexp; values raw
  // (mode 0), log-probabilities (1) or probabilities (2) (ops/reference.py::compact_topk is the definition).
  m.def(
      "compact_topk(Tensor logits, Tensor? col_ids, Tensor? rows, int k, int fallback_id, int mode) -> "
      "(Tensor, Tensor, Tensor)");
  m.def(
      "pack_update(Tensor(a!) packed, Tensor(b!) packed_ids, Tensor weight, Tensor ids, Tensor cnt, Tensor rows) -> "
      "()");
  // The CUDA launch plan of the logits ops for shapes (tests, benchmarks): [wd, wc, mt, ntmax, vec, nsteps, grid_x,
  // grid_y]; sms < 0 asks the current device. force_logits_plan(mt, ntmax) overrides the rule's free choices (which
  // never change results) for later calls in this process; (0, 0) restores the rule.
  m.def("logits_plan(int M, int W, int d, ScalarType dtype, bool aligned, int sms) -> int[]",
        &specvocab::logits_plan_op);
  m.def("force_logits_plan(int mt, int ntmax) -> ()", &specvocab::force_logits_plan_op);
  // The pieces the logits kernels cut row_to_slot into (csrc/pieces.h): [n, 2] of (first row, rows).
  m.def("logits_pieces(Tensor row_to_slot, int P) -> Tensor");
}

TORCH_LIBRARY_IMPL(specvocab, CPU, m) {
  m.impl("indexed_logits", &specvocab::indexed_logits_cpu);
  m.impl("packed_logits", &specvocab::packed_logits_cpu);
  m.impl("logits_pieces", &specvocab::logits_pieces_op);
  m.impl("window_update", &specvocab::window_update_cpu);
  m.impl("window_verify", &specvocab::window_verify_cpu);
  m.impl("compact_topk", &specvocab::compact_topk_cpu);
  m.impl("pack_update", &specvocab::pack_update_cpu);
}

#ifdef SPECVOCAB_WITH_CUDA  // set by setup.py when nvcc compiled the .cu files
TORCH_LIBRARY_IMPL(specvocab, CUDA, m) {
  m.impl("indexed_logits", &specvocab::indexed_logits_cuda);
  m.impl("packed_logits", &specvocab::packed_logits_cuda);
  m.impl("window_update", &specvocab::window_update_cuda);
  m.impl("window_verify", &specvocab::window_verify_cuda);
  m.impl("compact_topk", &specvocab::compact_topk_cuda);
  m.impl("pack_update", &specvocab::pack_update_cuda);
}
#endif
