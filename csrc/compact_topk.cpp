// compact_topk: argument checks, the C++ CPU implementation, the CUDA wrapper.
// The draft head's top-k in one op (ops/compact_topk.py::reference_compact_topk is the definition): per logits row the
// top k columns (value descending, then column ascending), their target token ids through the head's column map, the
// row's logsumexp, and the values as raw logits, log-probabilities or probabilities. It replaces some thirty small
// ops per draft step (an exact-order top-k, the column map, the log-softmax and the fallback of -inf entries).
#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <vector>

#include "compact_topk_row.h"
#include "ops.h"

namespace specvocab {
namespace {

struct Prepared {
  at::Tensor logits, ids, rows, values, tokens, lse;
  SpecvocabTopkArgs args;
};

Prepared prepare(const at::Tensor& logits, const c10::optional<at::Tensor>& col_ids,
                 const c10::optional<at::Tensor>& rows, int64_t k, int64_t fallback_id, int64_t mode) {
  const char* op = "compact_topk";
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat, op, ": logits must be float32 [N, W], got ",
              logits.scalar_type(), " ", logits.sizes());
  const int64_t N = logits.size(0), W = logits.size(1);
  TORCH_CHECK(W >= 1 && W < kTopkNoColumn, op, ": logits must have 1 to 2^31 - 2 columns, got W=", W);
  TORCH_CHECK(k >= 1 && k <= kTopkMaxK && k <= W, op, ": k = ", k, " must be in [1, min(", kTopkMaxK, ", W=", W, ")]");
  TORCH_CHECK(mode >= 0 && mode <= 2, op, ": mode = ", mode,
              " must be 0 (values), 1 (log-probabilities) or 2 "
              "(probabilities)");
  Prepared p;
  p.logits = logits.contiguous();
  int64_t per = 1;
  if (col_ids.has_value()) {
    const at::Tensor& m = *col_ids;
    TORCH_CHECK(m.scalar_type() == at::kInt || m.scalar_type() == at::kLong, op,
                ": col_ids must be int32 or int64, got ", m.scalar_type());
    TORCH_CHECK(m.device() == logits.device(), op, ": all tensors must be on one device, got ", logits.device(),
                " and ", m.device());
    TORCH_CHECK((m.dim() == 1 || m.dim() == 2) && m.size(-1) == W, op, ": col_ids must be [W=", W, "] or [R, W=", W,
                "], got ", m.sizes());
    p.ids = m.contiguous();
    if (m.dim() == 2) {
      TORCH_CHECK(rows.has_value(), op, ": a 2-D col_ids [R, W] needs rows (each request's map row)");
      const at::Tensor& r = *rows;
      TORCH_CHECK(r.dim() == 1 && (r.scalar_type() == at::kInt || r.scalar_type() == at::kLong), op,
                  ": rows must be int32 or int64 [bs], got ", r.scalar_type(), " ", r.sizes());
      TORCH_CHECK(r.device() == logits.device(), op, ": all tensors must be on one device, got ", logits.device(),
                  " and ", r.device());
      const int64_t bs = r.size(0);
      TORCH_CHECK(N == 0 || (bs > 0 && N % bs == 0), op, ": ", N, " logits rows do not split evenly over ", bs,
                  " requests (rows must be request-major)");
      per = bs > 0 && N > 0 ? N / bs : 1;
      p.rows = r.to(at::kLong).contiguous();
    }
  }
  p.values = at::empty({N, k}, logits.options());
  p.tokens = at::empty({N, k}, logits.options().dtype(at::kLong));
  p.lse = at::empty({N}, logits.options());
  SpecvocabTopkArgs& a = p.args;
  a.logits = p.logits.data_ptr<float>();
  a.ids32 = p.ids.defined() && p.ids.scalar_type() == at::kInt ? p.ids.data_ptr<int32_t>() : nullptr;
  a.ids64 = p.ids.defined() && p.ids.scalar_type() == at::kLong ? p.ids.data_ptr<int64_t>() : nullptr;
  a.rows = p.rows.defined() ? p.rows.data_ptr<int64_t>() : nullptr;
  a.values = p.values.data_ptr<float>();
  a.tokens = p.tokens.data_ptr<int64_t>();
  a.lse = p.lse.data_ptr<float>();
  a.N = N;
  a.W = W;
  a.k = k;
  a.per = per;
  a.fallback_id = fallback_id;
  a.R = p.ids.defined() && p.ids.dim() == 2 ? p.ids.size(0) : 0;
  a.mode = static_cast<int32_t>(mode);
  return p;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> compact_topk_cpu(const at::Tensor& logits,
                                                                const c10::optional<at::Tensor>& col_ids,
                                                                const c10::optional<at::Tensor>& rows, int64_t k,
                                                                int64_t fallback_id, int64_t mode) {
  Prepared p = prepare(logits, col_ids, rows, k, fallback_id, mode);
  const SpecvocabTopkArgs args = p.args;
  if (args.W <= kTopkRegMaxW) {
    at::parallel_for(0, args.N, 1, [&](int64_t m0, int64_t m1) {
      // The register kernel's lanes one after the other: the same (max, sum) pairs and rounds (compact_topk_row.h).
      std::vector<float> x(kTopkRegLanes * kTopkRegPerLane), mx(kTopkRegLanes), sum(kTopkRegLanes);
      std::vector<uint64_t> best(kTopkRegLanes), won(args.k);
      for (int64_t m = m0; m < m1; ++m) {
        for (int t = 0; t < kTopkRegLanes; ++t) {
          sv_topk_reg_load(args, m, t, &x[t * kTopkRegPerLane], &mx[t], &sum[t]);
          best[t] = sv_topk_reg_next(&x[t * kTopkRegPerLane], t, ~0ull);
        }
        for (int s = kTopkRegLanes / 2; s > 0; s /= 2)
          for (int t = 0; t < s; ++t) sv_lse_merge(&mx[t], &sum[t], mx[t + s], sum[t + s]);
        const float lse = sv_lse(mx[0], sum[0]);
        std::fill(won.begin(), won.end(), 0);
        for (int64_t r = 0; r < args.k; ++r) {
          int owner = 0;
          for (int t = 1; t < kTopkRegLanes; ++t)
            if (best[t] > best[owner]) owner = t;
          if (best[owner] == 0) break;
          won[r] = best[owner];
          best[owner] = sv_topk_reg_next(&x[owner * kTopkRegPerLane], owner, won[r]);
        }
        for (int64_t i = 0; i < args.k; ++i) sv_topk_reg_entry(args, m, i, won[i], lse);
        args.lse[m] = lse;
      }
    });
    return {p.values, p.tokens, p.lse};
  }
  at::parallel_for(0, args.N, 1, [&](int64_t m0, int64_t m1) {
    // The list kernel's lanes one after the other, then its merge tree (compact_topk_row.h).
    std::vector<float> v(kTopkLanes * kTopkStride), mx(kTopkLanes), sum(kTopkLanes);
    std::vector<int32_t> c(kTopkLanes * kTopkStride);
    for (int64_t m = m0; m < m1; ++m) {
      for (int t = 0; t < kTopkLanes; ++t)
        sv_topk_lane(args, m, t, &v[t * kTopkStride], &c[t * kTopkStride], &mx[t], &sum[t]);
      for (int s = kTopkLanes / 2; s > 0; s /= 2)
        for (int t = 0; t < s; ++t) {
          sv_topk_merge(&v[t * kTopkStride], &c[t * kTopkStride], &v[(t + s) * kTopkStride], &c[(t + s) * kTopkStride],
                        static_cast<int>(args.k));
          sv_lse_merge(&mx[t], &sum[t], mx[t + s], sum[t + s]);
        }
      sv_topk_write(args, m, v.data(), c.data(), mx[0], sum[0]);
    }
  });
  return {p.values, p.tokens, p.lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> compact_topk_cuda(const at::Tensor& logits,
                                                                 const c10::optional<at::Tensor>& col_ids,
                                                                 const c10::optional<at::Tensor>& rows, int64_t k,
                                                                 int64_t fallback_id, int64_t mode) {
  c10::DeviceGuard guard(logits.device());
  Prepared p = prepare(logits, col_ids, rows, k, fallback_id, mode);
  // A row outside the map (a bad request slot) gives no token, on both devices (compact_topk_row.h): no host check.
  check_launch(specvocab_compact_topk_launch(&p.args, current_cuda_stream(logits.device())), "compact_topk");
  return {p.values, p.tokens, p.lse};
}

}  // namespace specvocab
