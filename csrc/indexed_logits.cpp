// indexed_logits / packed_logits: argument checks, the C++ CPU implementation, the CUDA wrapper.
#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>

#include <cmath>
#include <limits>

#include "ops.h"

namespace specvocab {
namespace {

void check_common(const char* op, const at::Tensor& hidden, const at::Tensor& rows_like, const at::Tensor& cnt,
                  const at::Tensor& row_to_slot, int64_t R) {
  TORCH_CHECK(hidden.dim() == 2, op, ": hidden must be [M, d], got shape ", hidden.sizes());
  const auto dt = hidden.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kHalf || dt == at::kBFloat16, op,
              ": hidden dtype must be bf16, fp16 or fp32, got ", dt);
  TORCH_CHECK(rows_like.scalar_type() == dt, op, ": the candidate rows' dtype ", rows_like.scalar_type(),
              " must equal hidden dtype ", dt);
  TORCH_CHECK(cnt.dim() == 1 && cnt.scalar_type() == at::kInt && cnt.size(0) == R, op, ": cnt must be int32 [R=", R,
              "], got ", cnt.scalar_type(), " ", cnt.sizes());
  TORCH_CHECK(row_to_slot.dim() == 1 && row_to_slot.scalar_type() == at::kInt && row_to_slot.size(0) == hidden.size(0),
              op, ": row_to_slot must be int32 [M=", hidden.size(0), "], got ", row_to_slot.scalar_type(), " ",
              row_to_slot.sizes());
  for (const at::Tensor* t : {&rows_like, &cnt, &row_to_slot})
    TORCH_CHECK(t->device() == hidden.device(), op, ": all tensors must be on one device, got ", hidden.device(),
                " and ", t->device());
}

// Value checks read the tensors: only on the CPU, where that costs nothing.
void check_values_cpu(const char* op, const at::Tensor& cnt, const at::Tensor& row_to_slot, int64_t R, int64_t W) {
  const int32_t* c = cnt.data_ptr<int32_t>();
  for (int64_t r = 0; r < R; ++r)
    TORCH_CHECK(c[r] >= 1 && c[r] <= W, op, ": cnt must be in [1, W=", W, "], got cnt[", r, "] = ", c[r]);
  const int32_t* s = row_to_slot.data_ptr<int32_t>();
  for (int64_t m = 0; m < row_to_slot.size(0); ++m)
    TORCH_CHECK(s[m] >= 0 && s[m] < R, op, ": row_to_slot must be in [0, R=", R, "), got row_to_slot[", m, "] = ", s[m]);
}

template <typename T>
void logits_cpu(const T* hidden, const T* weight, const int32_t* ids, const int32_t* cnt, const int32_t* slot,
                float* out, int64_t M, int64_t d, int64_t W, bool packed) {
  at::parallel_for(0, M, 1, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const int64_t s = slot[m];
      const T* h = hidden + m * d;
      for (int64_t j = 0; j < W; ++j) {
        if (j >= cnt[s]) {
          out[m * W + j] = -std::numeric_limits<float>::infinity();
          continue;
        }
        const int64_t row = packed ? s * W + j : static_cast<int64_t>(ids[s * W + j]);
        const T* w = weight + row * d;
        float acc = 0.f;
        for (int64_t k = 0; k < d; ++k) acc += static_cast<float>(w[k]) * static_cast<float>(h[k]);
        out[m * W + j] = acc;
      }
    }
  });
}

at::Tensor run_cpu(const at::Tensor& hidden_, const at::Tensor& weight_, const at::Tensor* ids_, const at::Tensor& cnt_,
                   const at::Tensor& slot_, int64_t W, bool packed) {
  at::Tensor hidden = hidden_.contiguous(), weight = weight_.contiguous(), cnt = cnt_.contiguous(),
             slot = slot_.contiguous();
  at::Tensor ids = ids_ ? ids_->contiguous() : at::Tensor();
  const int64_t M = hidden.size(0), d = hidden.size(1);
  at::Tensor out = at::empty({M, W}, hidden.options().dtype(at::kFloat));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, hidden.scalar_type(), "specvocab_logits_cpu", [&] {
    logits_cpu<scalar_t>(hidden.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(),
                         packed ? nullptr : ids.data_ptr<int32_t>(), cnt.data_ptr<int32_t>(), slot.data_ptr<int32_t>(),
                         out.data_ptr<float>(), M, d, W, packed);
  });
  return out;
}

int dtype_code(at::ScalarType t) { return t == at::kFloat ? SV_F32 : (t == at::kHalf ? SV_F16 : SV_BF16); }

at::Tensor run_cuda(const at::Tensor& hidden_, const at::Tensor& weight_, const at::Tensor* ids_, const at::Tensor& cnt_,
                    const at::Tensor& slot_, int64_t W, bool packed, const char* op) {
  c10::DeviceGuard guard(hidden_.device());
  at::Tensor hidden = hidden_.contiguous(), weight = weight_.contiguous(), cnt = cnt_.contiguous(),
             slot = slot_.contiguous();
  at::Tensor ids = ids_ ? ids_->contiguous() : at::Tensor();
  const int64_t M = hidden.size(0), d = hidden.size(1);
  at::Tensor out = at::empty({M, W}, hidden.options().dtype(at::kFloat));
  const int code = specvocab_indexed_logits_launch(
      hidden.data_ptr(), weight.data_ptr(), packed ? nullptr : ids.data_ptr<int32_t>(), cnt.data_ptr<int32_t>(),
      slot.data_ptr<int32_t>(), out.data_ptr<float>(), M, d, W, weight.size(0), dtype_code(hidden.scalar_type()),
      packed ? 1 : 0, current_cuda_stream(hidden.device()));
  check_launch(code, op);
  return out;
}

void check_indexed(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& ids, const at::Tensor& cnt,
                   const at::Tensor& row_to_slot) {
  const char* op = "indexed_logits";
  TORCH_CHECK(weight.dim() == 2, op, ": weight must be [V, d], got shape ", weight.sizes());
  TORCH_CHECK(ids.dim() == 2 && ids.scalar_type() == at::kInt, op, ": ids must be int32 [R, W], got ",
              ids.scalar_type(), " ", ids.sizes());
  TORCH_CHECK(ids.device() == hidden.device(), op, ": all tensors must be on one device, got ", hidden.device(),
              " and ", ids.device());
  check_common(op, hidden, weight, cnt, row_to_slot, ids.size(0));
  TORCH_CHECK(hidden.dim() == 2 && hidden.size(1) == weight.size(1), op, ": hidden has d=", hidden.size(1),
              " but weight has d=", weight.size(1));
}

void check_packed(const at::Tensor& hidden, const at::Tensor& packed, const at::Tensor& cnt,
                  const at::Tensor& row_to_slot) {
  const char* op = "packed_logits";
  TORCH_CHECK(packed.dim() == 3, op, ": packed must be [R, W, d], got shape ", packed.sizes());
  check_common(op, hidden, packed, cnt, row_to_slot, packed.size(0));
  TORCH_CHECK(hidden.size(1) == packed.size(2), op, ": hidden has d=", hidden.size(1), " but packed has d=",
              packed.size(2));
}

}  // namespace

at::Tensor indexed_logits_cpu(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& ids,
                              const at::Tensor& cnt, const at::Tensor& row_to_slot) {
  check_indexed(hidden, weight, ids, cnt, row_to_slot);
  const int64_t R = ids.size(0), W = ids.size(1), V = weight.size(0);
  check_values_cpu("indexed_logits", cnt, row_to_slot, R, W);
  at::Tensor ids_c = ids.contiguous();
  const int32_t* p = ids_c.data_ptr<int32_t>();
  for (int64_t i = 0; i < ids_c.numel(); ++i)
    TORCH_CHECK(p[i] >= 0 && p[i] < V, "indexed_logits: ids must be in [0, V=", V, "), got ", p[i]);
  return run_cpu(hidden, weight, &ids_c, cnt, row_to_slot, W, false);
}

at::Tensor indexed_logits_cuda(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& ids,
                               const at::Tensor& cnt, const at::Tensor& row_to_slot) {
  check_indexed(hidden, weight, ids, cnt, row_to_slot);
  return run_cuda(hidden, weight, &ids, cnt, row_to_slot, ids.size(1), false, "indexed_logits");
}

at::Tensor packed_logits_cpu(const at::Tensor& hidden, const at::Tensor& packed, const at::Tensor& cnt,
                             const at::Tensor& row_to_slot) {
  check_packed(hidden, packed, cnt, row_to_slot);
  const int64_t R = packed.size(0), W = packed.size(1);
  check_values_cpu("packed_logits", cnt, row_to_slot, R, W);
  return run_cpu(hidden, packed.reshape({R * W, packed.size(2)}), nullptr, cnt, row_to_slot, W, true);
}

at::Tensor packed_logits_cuda(const at::Tensor& hidden, const at::Tensor& packed, const at::Tensor& cnt,
                              const at::Tensor& row_to_slot) {
  check_packed(hidden, packed, cnt, row_to_slot);
  const int64_t R = packed.size(0), W = packed.size(1);
  return run_cuda(hidden, packed.reshape({R * W, packed.size(2)}), nullptr, cnt, row_to_slot, W, true,
                  "packed_logits");
}

}  // namespace specvocab
