// window_verify: argument checks, the C++ CPU implementation, the CUDA wrapper.
// One verify round of the window policy in one op (the torch reference, ops/window_verify.py::reference_window_verify,
// is the definition): the round's window entries and committed tokens from SGLang's verify tensors, the
// round's telemetry against the sets as they were, then window_update with those entries. The eager
// verify hook is then a top-k and this op instead of some forty small ops (host time per decode round).
#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>

#include <vector>

#include "ops.h"
#include "window_verify_row.h"

namespace specvocab {
namespace {

struct Prepared {
  at::Tensor draft_token, accept_index, accept_lens, predict, topk_values, topk_ids, hot, block, accepted;
  SpecvocabVerifyArgs args;
};

Prepared prepare(at::Tensor& ring, at::Tensor& length, at::Tensor& ids, at::Tensor& cnt, at::Tensor& acc,
                 const at::Tensor& rows, const at::Tensor& draft_token, const at::Tensor& accept_index,
                 const at::Tensor& accept_lens, const at::Tensor& predict, const at::Tensor& topk_values,
                 const at::Tensor& topk_ids, const c10::optional<at::Tensor>& hot, int64_t k, bool context,
                 bool compacted, int64_t fallback_id, int64_t vocab_size) {
  const char* op = "window_verify";
  TORCH_CHECK(ids.dim() == 2 && ids.scalar_type() == at::kInt && ids.is_contiguous(), op,
              ": ids must be a contiguous int32 [R, capacity] table, got ", ids.scalar_type(), " ", ids.sizes());
  const int64_t R = ids.size(0);
  TORCH_CHECK(
      acc.dim() == 2 && acc.size(0) == 4 && acc.size(1) == R && acc.scalar_type() == at::kDouble && acc.is_contiguous(),
      op, ": acc must be contiguous float64 [4, R=", R, "], got ", acc.scalar_type(), " ", acc.sizes());
  TORCH_CHECK(rows.dim() == 1 && rows.scalar_type() == at::kLong, op, ": rows must be int64 [B], got ",
              rows.scalar_type(), " ", rows.sizes());
  const int64_t B = rows.size(0);
  TORCH_CHECK(accept_index.dim() == 2 && accept_index.size(0) == B, op, ": accept_index must be [B=", B, ", S], got ",
              accept_index.sizes());
  TORCH_CHECK(accept_lens.dim() == 1 && accept_lens.size(0) == B, op, ": accept_lens must be [B=", B, "], got ",
              accept_lens.sizes());
  TORCH_CHECK(B > 0 && draft_token.dim() == 1 && draft_token.size(0) % B == 0 && draft_token.size(0) > 0, op,
              ": draft_token must be [B * num_draft_tokens] with B=", B, " >= 1, got ", draft_token.sizes());
  const int64_t nd = draft_token.size(0) / B, S = accept_index.size(1);
  TORCH_CHECK(predict.dim() == 1 && predict.size(0) == B * nd, op, ": predict must be [B * num_draft_tokens=", B * nd,
              "], got ", predict.sizes());
  TORCH_CHECK(topk_values.dim() == 2 && topk_values.size(0) == B * nd && topk_values.sizes() == topk_ids.sizes() &&
                  topk_ids.scalar_type() == at::kLong && at::isFloatingType(topk_values.scalar_type()),
              op, ": topk_values (float) and topk_ids (int64) must both be [B * num_draft_tokens=", B * nd,
              ", kk], got ", topk_values.scalar_type(), " ", topk_values.sizes(), " and ", topk_ids.scalar_type(), " ",
              topk_ids.sizes());
  TORCH_CHECK(k >= 0, op, ": k = ", k, " must be >= 0");
  for (const at::Tensor* t :
       std::initializer_list<const at::Tensor*>{&ring, &length, &cnt, &acc, &rows, &draft_token, &accept_index,
                                                &accept_lens, &predict, &topk_values, &topk_ids})
    TORCH_CHECK(t->device() == ids.device(), op, ": all tensors must be on one device, got ", ids.device(), " and ",
                t->device());
  for (const at::Tensor* t :
       std::initializer_list<const at::Tensor*>{&draft_token, &accept_index, &accept_lens, &predict})
    TORCH_CHECK(at::isIntegralType(t->scalar_type(), /*includeBool=*/false), op,
                ": draft_token, accept_index, accept_lens and predict must be integer tensors, got ", t->scalar_type());
  Prepared p;
  p.draft_token = draft_token.to(at::kLong).contiguous();
  p.accept_index = accept_index.to(at::kLong).contiguous();
  p.accept_lens = accept_lens.to(at::kLong).contiguous();
  p.predict = predict.to(at::kLong).contiguous();
  p.topk_values = topk_values.to(at::kFloat).contiguous();
  p.topk_ids = topk_ids.contiguous();
  if (hot.has_value()) {
    TORCH_CHECK(hot->dim() == 1 && hot->scalar_type() == at::kBool && hot->device() == ids.device(), op,
                ": hot must be a bool [vocab] mask on ", ids.device(), ", got ", hot->scalar_type(), " ", hot->sizes());
    p.hot = hot->contiguous();
  }
  const int64_t n = (context ? nd : 0) + S * k;
  p.block = at::empty({B, n}, ids.options());
  p.accepted = at::empty({B, S}, rows.options());
  // The row pass reads cnt and writes acc: the window update's arguments are checked before it, not after.
  check_window_update(ring, length, ids, cnt, rows, p.block, fallback_id, vocab_size);
  SpecvocabVerifyArgs& a = p.args;
  a.draft_token = p.draft_token.data_ptr<int64_t>();
  a.accept_index = p.accept_index.data_ptr<int64_t>();
  a.accept_lens = p.accept_lens.data_ptr<int64_t>();
  a.predict = p.predict.data_ptr<int64_t>();
  a.topk_values = p.topk_values.data_ptr<float>();
  a.topk_ids = p.topk_ids.data_ptr<int64_t>();
  a.hot = p.hot.defined() ? p.hot.data_ptr<bool>() : nullptr;
  a.ids = ids.data_ptr<int32_t>();
  a.cnt = cnt.data_ptr<int32_t>();
  a.rows = rows.data_ptr<int64_t>();
  a.acc = acc.data_ptr<double>();
  a.block = p.block.data_ptr<int32_t>();
  a.accepted = p.accepted.data_ptr<int64_t>();
  a.ring = ring.data_ptr<int32_t>();
  a.length = length.data_ptr<int64_t>();
  a.ring_stride = ring.stride(0);
  a.fallback_id = static_cast<int32_t>(fallback_id);
  a.nd = nd;
  a.S = S;
  a.kk = topk_ids.size(1);
  a.k = k;
  a.capacity = ids.size(1);
  a.R = R;
  a.n_hot = p.hot.defined() ? p.hot.size(0) : 0;
  a.vocab_size = vocab_size;
  a.context = context ? 1 : 0;
  a.compacted = compacted ? 1 : 0;
  return p;
}

}  // namespace

at::Tensor window_verify_cpu(at::Tensor& ring, at::Tensor& length, at::Tensor& ids, at::Tensor& cnt, at::Tensor& acc,
                             const at::Tensor& rows_, const at::Tensor& draft_token, const at::Tensor& accept_index,
                             const at::Tensor& accept_lens, const at::Tensor& predict, const at::Tensor& topk_values,
                             const at::Tensor& topk_ids, const c10::optional<at::Tensor>& hot, int64_t k, bool context,
                             bool compacted, int64_t fallback_id, int64_t vocab_size) {
  const at::Tensor rows = rows_.contiguous();
  Prepared p = prepare(ring, length, ids, cnt, acc, rows, draft_token, accept_index, accept_lens, predict, topk_values,
                       topk_ids, hot, k, context, compacted, fallback_id, vocab_size);
  const int64_t B = rows.size(0);
  check_rows("window_verify", rows, ids.size(0));  // before any row is read or written (window_update repeats it)
  const SpecvocabVerifyArgs args = p.args;
  at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) sv_verify_row(args, b);
  });
  window_update_cpu(ring, length, ids, cnt, rows, p.block, fallback_id, vocab_size);
  return p.accepted;
}

at::Tensor window_verify_cuda(at::Tensor& ring, at::Tensor& length, at::Tensor& ids, at::Tensor& cnt, at::Tensor& acc,
                              const at::Tensor& rows_, const at::Tensor& draft_token, const at::Tensor& accept_index,
                              const at::Tensor& accept_lens, const at::Tensor& predict, const at::Tensor& topk_values,
                              const at::Tensor& topk_ids, const c10::optional<at::Tensor>& hot, int64_t k, bool context,
                              bool compacted, int64_t fallback_id, int64_t vocab_size) {
  c10::DeviceGuard guard(ids.device());
  const at::Tensor rows = rows_.contiguous();
  Prepared p = prepare(ring, length, ids, cnt, acc, rows, draft_token, accept_index, accept_lens, predict, topk_values,
                       topk_ids, hot, k, context, compacted, fallback_id, vocab_size);
  // As in window_update: rows are SGLang's req_pool_indices, distinct and in range by construction (a host check
  // only under the debug setting); a row out of range reads and writes nothing (window_verify_row.h, the update).
  if (debug_checks()) check_rows("window_verify", rows, ids.size(0));
  // One launch: the entries stay in the kernel's shared memory, then its window update runs over them.
  check_launch(specvocab_window_verify_launch(&p.args, rows.size(0), current_cuda_stream(ids.device())),
               "window_verify");
  return p.accepted;
}

}  // namespace specvocab
