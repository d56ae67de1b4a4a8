// indexed_logits / packed_logits: argument checks, the C++ CPU implementation, the CUDA wrapper.
// Table values are never refused (bad entries read as -inf and are counted, as on the GPU), except under the debug
// setting (check_table_entries).
#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "ops.h"
#include "pieces.h"

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
  const int64_t M = hidden.size(0), B = row_to_slot.dim() == 1 ? row_to_slot.size(0) : -1;
  const bool b_ok = B == M || (B > 0 && M % B == 0) || (M == 0 && B >= 0);
  TORCH_CHECK(row_to_slot.dim() == 1 &&
                  (row_to_slot.scalar_type() == at::kInt || row_to_slot.scalar_type() == at::kLong) && b_ok,
              op, ": row_to_slot must be int32 or int64 [B] with B dividing M=", M,
              " (a slot per hidden row, or per request of M // B request-major rows), got ", row_to_slot.scalar_type(),
              " ", row_to_slot.sizes());
  for (const at::Tensor* t : {&rows_like, &cnt, &row_to_slot})
    TORCH_CHECK(t->device() == hidden.device(), op, ": all tensors must be on one device, got ", hidden.device(),
                " and ", t->device());
}

void check_counter(const char* op, const c10::optional<at::Tensor>& bad, const at::Device& device) {
  if (!bad.has_value() || !bad->defined()) return;
  TORCH_CHECK(bad->scalar_type() == at::kLong && bad->numel() == 1 && bad->is_contiguous(), op,
              ": bad must be an int64 counter of one element, got ", bad->scalar_type(), " ", bad->sizes());
  TORCH_CHECK(bad->device() == device, op, ": all tensors must be on one device, got ", device, " and ", bad->device());
}

int64_t* counter_ptr(const c10::optional<at::Tensor>& bad) {
  return bad.has_value() && bad->defined() ? bad->data_ptr<int64_t>() : nullptr;
}

// fp32 dot product with eight independent partial sums (the compiler vectorises the lanes).
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int i = 0; i < 8; ++i) acc[i] += a[k + i] * b[k + i];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; k < n; ++k) s += a[k] * b[k];
  return s;
}

// The pieces of the CUDA kernel (pieces.h: runs of consecutive rows with one slot, cut to at most 16 rows) share
// their candidate rows: each live row is converted to fp32 once per piece and dotted with every hidden row of the
// piece. Work items are (piece, 16 columns); dead columns are never read. Bad table entries are read as the CUDA
// kernel reads them (table.head_reads) and counted the same way; returns their number.
// Row m's slot: row_to_slot[m / per] (int32 or int64), per = M / B hidden rows per slot entry.
struct Slots {
  const void* p;
  bool wide;
  int64_t per;
  int64_t operator()(int64_t m) const {
    const int64_t b = m / per;
    return wide ? static_cast<const int64_t*>(p)[b] : static_cast<const int32_t*>(p)[b];
  }
};

template <typename T>
int64_t logits_cpu(const T* hidden, const T* weight, const int32_t* ids, const int32_t* cnt, const Slots& slot,
                   const int32_t* row_map, int64_t L, float* out, int64_t M, int64_t d, int64_t W, int64_t V, int64_t R,
                   bool packed) {
  constexpr bool kFloat = std::is_same<T, float>::value;
  constexpr int kPiece = 16;
  std::vector<int64_t> starts, lens;
  for (int64_t m = 0; m < M; ++m) {
    const int len = piece_length([&](int64_t i) { return slot(i); }, m, M, kPiece);
    if (len > 0) {
      starts.push_back(m);
      lens.push_back(len);
    }
  }
  const int64_t pieces = static_cast<int64_t>(starts.size());
  std::vector<float> hidden_f;
  if (!kFloat) {
    hidden_f.resize(static_cast<size_t>(M * d));
    at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
      for (int64_t i = m0 * d; i < m1 * d; ++i) hidden_f[i] = static_cast<float>(hidden[i]);
    });
  }
  const float* h = kFloat ? reinterpret_cast<const float*>(hidden) : hidden_f.data();
  constexpr int64_t kCols = 16;
  const int64_t tiles = (W + kCols - 1) / kCols;
  std::atomic<int64_t> bad{0};
  at::parallel_for(0, pieces * tiles, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> row_f(kFloat ? 0 : d);
    int64_t my_bad = 0;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t q = t / tiles, m0 = starts[q], len = lens[q], m1 = m0 + len;
      const int64_t s = slot(m0);
      const int64_t raw = s >= 0 && s < R ? cnt[s] : 0;  // a bad slot reads as count 0
      const int64_t c = std::min(std::max<int64_t>(raw, 0), W);
      if ((raw < 1 || raw > W) && t % tiles == 0) my_bad += len;  // one per hidden row, by its first column tile
      for (int64_t j = (t % tiles) * kCols; j < std::min(W, (t % tiles + 1) * kCols); ++j) {
        const int64_t row = packed ? s * W + j : (j < c ? head_row(ids[s * W + j], row_map, L, V) : -1);
        const bool id_bad = !packed && row >= V;
        if (j < c && id_bad) my_bad += len;
        if (j >= c || row < 0 || id_bad) {  // a dead column: never read
          for (int64_t m = m0; m < m1; ++m) out[m * W + j] = -std::numeric_limits<float>::infinity();
          continue;
        }
        const float* w;
        if (kFloat) {
          w = reinterpret_cast<const float*>(weight) + row * d;
        } else {
          const T* src = weight + row * d;
          for (int64_t k = 0; k < d; ++k) row_f[k] = static_cast<float>(src[k]);
          w = row_f.data();
        }
        for (int64_t m = m0; m < m1; ++m) out[m * W + j] = dot(w, h + m * d, d);
      }
    }
    bad += my_bad;
  });
  return bad.load();
}

at::Tensor map_or_empty(const c10::optional<at::Tensor>& row_map) {
  return row_map.has_value() && row_map->defined() ? row_map->contiguous() : at::Tensor();
}

at::Tensor run_cpu(const at::Tensor& hidden_, const at::Tensor& weight_, const at::Tensor* ids_, const at::Tensor& cnt_,
                   const at::Tensor& slot_, int64_t W, int64_t V, bool packed, const c10::optional<at::Tensor>& bad,
                   const c10::optional<at::Tensor>& row_map_ = c10::nullopt) {
  at::Tensor hidden = hidden_.contiguous(), weight = weight_.contiguous(), cnt = cnt_.contiguous(),
             slot = slot_.contiguous(), row_map = map_or_empty(row_map_);
  at::Tensor ids = ids_ ? ids_->contiguous() : at::Tensor();
  const int64_t M = hidden.size(0), d = hidden.size(1), R = cnt.size(0), B = slot.size(0);
  at::Tensor out = at::empty({M, W}, hidden.options().dtype(at::kFloat));
  const Slots slots{slot.data_ptr(), slot.scalar_type() == at::kLong, B ? std::max<int64_t>(M / B, 1) : 1};
  const int32_t* map = row_map.defined() ? row_map.data_ptr<int32_t>() : nullptr;
  const int64_t L = row_map.defined() ? row_map.size(0) : 0;
  int64_t n_bad = 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, hidden.scalar_type(), "specvocab_logits_cpu", [&] {
    n_bad = logits_cpu<scalar_t>(hidden.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(),
                                 packed ? nullptr : ids.data_ptr<int32_t>(), cnt.data_ptr<int32_t>(), slots, map, L,
                                 out.data_ptr<float>(), M, d, W, V, R, packed);
  });
  if (int64_t* counter = counter_ptr(bad)) *counter += n_bad;
  return out;
}

int dtype_code(at::ScalarType t) { return t == at::kFloat ? SV_F32 : (t == at::kHalf ? SV_F16 : SV_BF16); }

// Test and tuning hook: mt / ntmax / zs to use instead of the rule (0 = the rule).
std::atomic<int> g_force_mt{0}, g_force_ntmax{0}, g_force_zs{0};

at::Tensor run_cuda(const at::Tensor& hidden_, const at::Tensor& weight_, const at::Tensor* ids_,
                    const at::Tensor& cnt_, const at::Tensor& slot_, int64_t W, int64_t R, bool packed,
                    const c10::optional<at::Tensor>& bad, const char* op,
                    const c10::optional<at::Tensor>& row_map_ = c10::nullopt) {
  c10::DeviceGuard guard(hidden_.device());
  at::Tensor hidden = hidden_.contiguous(), weight = weight_.contiguous(), cnt = cnt_.contiguous(),
             slot = slot_.contiguous(), row_map = map_or_empty(row_map_);
  at::Tensor ids = ids_ ? ids_->contiguous() : at::Tensor();
  const int64_t M = hidden.size(0), d = hidden.size(1);
  at::Tensor out = at::empty({M, W}, hidden.options().dtype(at::kFloat));
  const bool aligned = reinterpret_cast<uintptr_t>(hidden.data_ptr()) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(weight.data_ptr()) % 16 == 0;
  const int64_t per = slot.size(0) > 0 ? M / slot.size(0) : 1;  // a request's rows (the launcher checks B | M)
  const SpecvocabLogitsPlan plan = plan_logits(M, W, d, hidden.scalar_type(), aligned, specvocab_sm_count(), per);
  const int code = specvocab_indexed_logits_launch(
      hidden.data_ptr(), weight.data_ptr(), packed ? nullptr : ids.data_ptr<int32_t>(), cnt.data_ptr<int32_t>(),
      slot.data_ptr(), slot.scalar_type() == at::kLong ? 1 : 0, slot.size(0),
      row_map.defined() ? row_map.data_ptr<int32_t>() : nullptr, row_map.defined() ? row_map.size(0) : 0,
      out.data_ptr<float>(), counter_ptr(bad), M, d, W, weight.size(0), R, dtype_code(hidden.scalar_type()),
      packed ? 1 : 0, &plan, current_cuda_stream(hidden.device()));
  check_launch(code, op);
  return out;
}

void check_indexed(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& ids, const at::Tensor& cnt,
                   const at::Tensor& row_to_slot, const c10::optional<at::Tensor>& bad,
                   const c10::optional<at::Tensor>& row_map) {
  const char* op = "indexed_logits";
  TORCH_CHECK(weight.dim() == 2, op, ": weight must be [V, d], got shape ", weight.sizes());
  TORCH_CHECK(ids.dim() == 2 && ids.scalar_type() == at::kInt, op, ": ids must be int32 [R, W], got ",
              ids.scalar_type(), " ", ids.sizes());
  TORCH_CHECK(ids.device() == hidden.device(), op, ": all tensors must be on one device, got ", hidden.device(),
              " and ", ids.device());
  check_common(op, hidden, weight, cnt, row_to_slot, ids.size(0));
  TORCH_CHECK(hidden.dim() == 2 && hidden.size(1) == weight.size(1), op, ": hidden has d=", hidden.size(1),
              " but weight has d=", weight.size(1));
  check_counter(op, bad, hidden.device());
  const bool mapped = row_map.has_value() && row_map->defined();
  if (mapped) {
    TORCH_CHECK(row_map->dim() == 1 && row_map->scalar_type() == at::kInt, op,
                ": row_map must be int32 [L] (ids to head rows, -1: no row), got ", row_map->scalar_type(), " ",
                row_map->sizes());
    TORCH_CHECK(row_map->device() == hidden.device(), op, ": all tensors must be on one device, got ", hidden.device(),
                " and ", row_map->device());
  }
  // a mapped table's ids index the map
  if (debug_checks())
    check_table_entries(op, &ids, cnt, row_to_slot, ids.size(1), mapped ? row_map->size(0) : weight.size(0),
                        hidden.size(0));
}

void check_packed(const at::Tensor& hidden, const at::Tensor& packed, const at::Tensor& cnt,
                  const at::Tensor& row_to_slot, const c10::optional<at::Tensor>& bad) {
  const char* op = "packed_logits";
  TORCH_CHECK(packed.dim() == 3, op, ": packed must be [R, W, d], got shape ", packed.sizes());
  check_common(op, hidden, packed, cnt, row_to_slot, packed.size(0));
  TORCH_CHECK(hidden.size(1) == packed.size(2), op, ": hidden has d=", hidden.size(1),
              " but packed has d=", packed.size(2));
  check_counter(op, bad, hidden.device());
  if (debug_checks()) check_table_entries(op, nullptr, cnt, row_to_slot, packed.size(1), 0, hidden.size(0));
}

}  // namespace

at::Tensor indexed_logits_cpu(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& ids,
                              const at::Tensor& cnt, const at::Tensor& row_to_slot,
                              const c10::optional<at::Tensor>& bad, const c10::optional<at::Tensor>& row_map) {
  check_indexed(hidden, weight, ids, cnt, row_to_slot, bad, row_map);
  return run_cpu(hidden, weight, &ids, cnt, row_to_slot, ids.size(1), weight.size(0), false, bad, row_map);
}

at::Tensor indexed_logits_cuda(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& ids,
                               const at::Tensor& cnt, const at::Tensor& row_to_slot,
                               const c10::optional<at::Tensor>& bad, const c10::optional<at::Tensor>& row_map) {
  check_indexed(hidden, weight, ids, cnt, row_to_slot, bad, row_map);
  return run_cuda(hidden, weight, &ids, cnt, row_to_slot, ids.size(1), ids.size(0), false, bad, "indexed_logits",
                  row_map);
}

at::Tensor packed_logits_cpu(const at::Tensor& hidden, const at::Tensor& packed, const at::Tensor& cnt,
                             const at::Tensor& row_to_slot, const c10::optional<at::Tensor>& bad) {
  check_packed(hidden, packed, cnt, row_to_slot, bad);
  const int64_t R = packed.size(0), W = packed.size(1);
  return run_cpu(hidden, packed.reshape({R * W, packed.size(2)}), nullptr, cnt, row_to_slot, W, R * W, true, bad);
}

at::Tensor packed_logits_cuda(const at::Tensor& hidden, const at::Tensor& packed, const at::Tensor& cnt,
                              const at::Tensor& row_to_slot, const c10::optional<at::Tensor>& bad) {
  check_packed(hidden, packed, cnt, row_to_slot, bad);
  const int64_t R = packed.size(0), W = packed.size(1);
  return run_cuda(hidden, packed.reshape({R * W, packed.size(2)}), nullptr, cnt, row_to_slot, W, R, true, bad,
                  "packed_logits");
}

SpecvocabLogitsPlan plan_logits(int64_t M, int64_t W, int64_t d, at::ScalarType dtype, bool aligned, int64_t sms,
                                int64_t per) {
  const bool fp32 = dtype == at::kFloat;
  const int64_t elem = fp32 ? 4 : 2, kstep = fp32 ? 16 : 32;
  SpecvocabLogitsPlan p{};
  p.nsteps = (d + kstep - 1) / kstep;
  // d-slices of at least 4 k-steps, at most 8: fixed by d and the dtype, so it is the summation order.
  p.wd = 1;
  while (p.wd < 8 && p.nsteps / (2 * p.wd) >= 4) p.wd *= 2;
  p.wc = 8 / p.wd;
  p.vec = aligned && (d * elem) % 16 == 0;
  p.mt = 1;
  p.ntmax = 2;
  if (!fp32 && p.vec) {
    // Long calls (many rows, long runs of one slot) take 32-row pieces: half the L2 re-reads of a long run.
    p.ntmax = M >= 128 ? 4 : 2;
    // Two 16-column tiles per warp halve the hidden-row traffic, but halve the CTAs: only with 2 CTAs per SM.
    const int64_t row_tiles = (M + 8 * p.ntmax - 1) / (8 * p.ntmax);
    const int64_t ctas = (W + 32 * p.wc - 1) / (32 * p.wc) * row_tiles;
    p.mt = ctas >= 2 * std::max<int64_t>(sms, 1) ? 2 : 1;
    const int fmt = g_force_mt.load(), fnt = g_force_ntmax.load();
    if (fmt) p.mt = fmt;
    if (fnt) p.ntmax = fnt;
  }
  // Pieces across CTAs: a row tile holds about P / per pieces (runs of a request's `per` rows); when the grid would
  // leave SMs idle (fewer than 2 CTAs per SM), up to that many CTAs share the tile's pieces, as few as give each the
  // same most pieces. At d 640 (Gemma-3 270M), bs 8, one row each: 38 CTAs walking 8 pieces each become 152 of 2.
  const int64_t P = 8 * p.ntmax, rows = std::min<int64_t>(P, std::max<int64_t>(M, 1));
  const int64_t pieces = per >= P ? 1 : (rows + std::max<int64_t>(per, 1) - 1) / std::max<int64_t>(per, 1);
  const int64_t ctas = (M + P - 1) / P * ((W + 16 * p.mt * p.wc - 1) / (16 * p.mt * p.wc));
  const int64_t want = 2 * std::max<int64_t>(sms, 1);
  int64_t zs = ctas >= want || pieces <= 1 ? 1 : std::min<int64_t>(pieces, (want + ctas - 1) / ctas);
  const int64_t each = (pieces + zs - 1) / zs;  // pieces per CTA: no more CTAs than that many pieces each needs
  p.zs = static_cast<int32_t>((pieces + each - 1) / each);
  const int fzs = g_force_zs.load();
  if (fzs) p.zs = fzs;
  return p;
}

std::vector<int64_t> logits_plan_op(int64_t M, int64_t W, int64_t d, at::ScalarType dtype, bool aligned, int64_t sms,
                                    int64_t per) {
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
              "logits_plan: dtype must be bf16, fp16 or fp32, got ", dtype);
  TORCH_CHECK(M >= 0 && W >= 0 && d >= 0, "logits_plan: M, W and d must be >= 0, got ", M, ", ", W, ", ", d);
  TORCH_CHECK(per >= 1, "logits_plan: per (hidden rows per slot entry) must be >= 1, got ", per);
  if (sms < 0) sms = specvocab_sm_count();
  const SpecvocabLogitsPlan p = plan_logits(M, W, d, dtype, aligned, sms, per);
  const int64_t rows = 8 * p.ntmax, cols = 16 * p.mt * p.wc;
  return {p.wd, p.wc, p.mt, p.ntmax, p.vec, p.nsteps, (M + rows - 1) / rows, (W + cols - 1) / cols, p.zs};
}

at::Tensor logits_pieces_op(const at::Tensor& row_to_slot, int64_t P) {
  TORCH_CHECK(row_to_slot.dim() == 1 && row_to_slot.scalar_type() == at::kInt && row_to_slot.device().is_cpu(),
              "logits_pieces: row_to_slot must be an int32 [M] CPU tensor, got ", row_to_slot.scalar_type(), " ",
              row_to_slot.sizes(), " on ", row_to_slot.device());
  TORCH_CHECK(P >= 1 && P <= 32, "logits_pieces: P must be in [1, 32], got ", P);
  const at::Tensor slot = row_to_slot.contiguous();
  const int32_t* sl = slot.data_ptr<int32_t>();
  const int64_t M = slot.size(0);
  std::vector<int64_t> flat;
  for (int64_t m = 0; m < M; ++m) {
    const int len = piece_length([&](int64_t i) { return sl[i]; }, m, M, static_cast<int>(P));
    if (len > 0) flat.insert(flat.end(), {m, static_cast<int64_t>(len)});
  }
  return at::tensor(flat, at::kLong).reshape({-1, 2});
}

void force_logits_plan_op(int64_t mt, int64_t ntmax, int64_t zs) {
  TORCH_CHECK((mt == 0 || mt == 1 || mt == 2) && (ntmax == 0 || ntmax == 2 || ntmax == 4) && zs >= 0 && zs <= 32,
              "force_logits_plan: mt must be 0 (the rule), 1 or 2, ntmax 0 (the rule), 2 or 4 and zs 0 (the rule) to "
              "32, got mt=",
              mt, ", ntmax=", ntmax, ", zs=", zs);
  g_force_mt.store(static_cast<int>(mt));
  g_force_ntmax.store(static_cast<int>(ntmax));
  g_force_zs.store(static_cast<int>(zs));
}

}  // namespace specvocab
