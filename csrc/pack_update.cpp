// pack_update: MicroSpec's asynchronous gathering. After a set update, copy into each listed
// slot's packed rows [W, d] only the LM-head rows of the ids that entered its set.
//
// For slot s (rows are distinct): the live slots are the prefix j < c_old of packed_ids[s] that is
// >= 0; c = cnt[s]; N = ids[s, :c] (ascending). Survivors (old live ids in N) below c keep slot and
// row. The free slots (j < c, leaving or j >= c_old, ascending) take, in order, the entering ids
// (in N but not old live, table order; row read from weight) and then the survivors at slots >= c
// (slot order; row moved from there). Then packed_ids[s, c:] = -1; packed[s, c:] is don't care.
// The torch reference (sglang_specvocab/ops/pack_update.py) and tests/literal.py state the same.
#include "ops.h"

#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace specvocab {
namespace {

// The launchers' dtype code; the CPU side only needs the element size (rows are copied bitwise).
int dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return SV_F32;
    case at::kHalf:
      return SV_F16;
    case at::kBFloat16:
      return SV_BF16;
    default:
      TORCH_CHECK(false, "pack_update: packed dtype ", t, " must be one of bf16, fp16, fp32");
  }
  return -1;
}

// Shapes, dtypes, devices and layouts: everything that needs no look at the values.
int check_args(const at::Tensor& packed, const at::Tensor& packed_ids, const at::Tensor& weight, const at::Tensor& ids,
               const at::Tensor& cnt, const at::Tensor& rows) {
  TORCH_CHECK(packed.dim() == 3, "pack_update: packed must be [R, W, d], got shape ", packed.sizes());
  const int64_t R = packed.size(0), W = packed.size(1), d = packed.size(2);
  TORCH_CHECK(weight.dim() == 2, "pack_update: weight must be [V, d], got shape ", weight.sizes());
  TORCH_CHECK(weight.size(1) == d, "pack_update: packed has d=", d, " but weight has d=", weight.size(1));
  const int code = dtype_code(packed.scalar_type());
  TORCH_CHECK(weight.scalar_type() == packed.scalar_type(), "pack_update: weight dtype ", weight.scalar_type(),
              " must equal packed dtype ", packed.scalar_type());
  TORCH_CHECK(packed_ids.scalar_type() == at::kInt && packed_ids.dim() == 2 && packed_ids.size(0) == R &&
                  packed_ids.size(1) == W,
              "pack_update: packed_ids must be int32 [R=", R, ", W=", W, "], got ", packed_ids.scalar_type(), " ",
              packed_ids.sizes());
  TORCH_CHECK(ids.scalar_type() == at::kInt && ids.dim() == 2 && ids.size(0) == R && ids.size(1) == W,
              "pack_update: ids must be int32 [R=", R, ", W=", W, "], got ", ids.scalar_type(), " ", ids.sizes());
  TORCH_CHECK(cnt.scalar_type() == at::kInt && cnt.dim() == 1 && cnt.size(0) == R,
              "pack_update: cnt must be int32 [R=", R, "], got ", cnt.scalar_type(), " ", cnt.sizes());
  TORCH_CHECK(rows.scalar_type() == at::kLong && rows.dim() == 1, "pack_update: rows must be int64 [B], got ",
              rows.scalar_type(), " ", rows.sizes());
  const at::Device dev = packed.device();
  for (const at::Tensor* t : {&packed_ids, &weight, &ids, &cnt, &rows}) {
    TORCH_CHECK(t->device() == dev, "pack_update: all tensors must be on one device, got ", dev, " and ", t->device());
  }
  // packed and packed_ids are written in place, weight is too big to copy: they must be dense already.
  TORCH_CHECK(packed.is_contiguous(), "pack_update: packed must be contiguous");
  TORCH_CHECK(packed_ids.is_contiguous(), "pack_update: packed_ids must be contiguous");
  TORCH_CHECK(weight.is_contiguous(), "pack_update: weight must be contiguous");
  TORCH_CHECK(W <= INT32_MAX, "pack_update: W=", W, " must fit in int32");
  return code;
}

}  // namespace

void pack_update_cpu(at::Tensor& packed, at::Tensor& packed_ids, const at::Tensor& weight, const at::Tensor& ids,
                     const at::Tensor& cnt, const at::Tensor& rows) {
  check_args(packed, packed_ids, weight, ids, cnt, rows);
  TORCH_CHECK(packed.device().is_cpu(), "pack_update_cpu: tensors must be on the CPU, got ", packed.device());
  const int64_t R = packed.size(0), W = packed.size(1), V = weight.size(0);
  const int64_t row_bytes = packed.size(2) * static_cast<int64_t>(packed.element_size());
  const at::Tensor ids_c = ids.contiguous(), cnt_c = cnt.contiguous(), rows_c = rows.contiguous();
  const int64_t B = rows_c.size(0);
  if (B == 0) return;
  const int64_t* row = rows_c.data_ptr<int64_t>();
  const int32_t* cnt_p = cnt_c.data_ptr<int32_t>();
  const int32_t* ids_p = ids_c.data_ptr<int32_t>();
  int32_t* pid_p = packed_ids.data_ptr<int32_t>();
  char* packed_p = static_cast<char*>(packed.data_ptr());
  const char* weight_p = static_cast<const char*>(weight.const_data_ptr());

  // 1. Check every listed row before writing any, so a refused call leaves the state as it was.
  check_rows("pack_update", rows_c, R);
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t s = row[b];
      const int64_t c = cnt_p[s];
      TORCH_CHECK(c >= 1 && c <= W, "pack_update: cnt[rows] must be in [1, W=", W, "], got ", c, " at row ", s);
      const int32_t* I = ids_p + s * W;
      for (int64_t k = 0; k < c; ++k) {
        TORCH_CHECK(I[k] >= 0 && I[k] < V, "pack_update: ids[rows, :cnt] must be in [0, V=", V, "), got ", I[k],
                    " at row ", s);
        TORCH_CHECK(k == 0 || I[k] > I[k - 1], "pack_update: ids[rows, :cnt] must be strictly ascending (row ", s, ")");
      }
      const int32_t* P = pid_p + s * W;
      for (int64_t j = 0; j < W; ++j) {
        TORCH_CHECK(P[j] < V, "pack_update: packed_ids[rows] must be in [-1, V=", V, "), got ", P[j], " at row ", s);
        TORCH_CHECK(P[j] >= -1 && (j == 0 || P[j - 1] >= 0 || P[j] == -1),
                    "pack_update: packed_ids[rows] must be live ids >= 0 followed by -1 (a fresh row is all -1), "
                    "not so at row ",
                    s);
      }
    }
  });

  // 2. Update each row on its own: rows are distinct, so no two tasks touch the same memory.
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    std::vector<int32_t> old_sorted, free_slots, fillers;
    for (int64_t b = begin; b < end; ++b) {
      const int64_t s = row[b];
      const int32_t* I = ids_p + s * W;  // N = I[0, c), ascending: binary search answers "in N?"
      int32_t* P = pid_p + s * W;
      const int64_t c = cnt_p[s];
      const int64_t c_old = std::count_if(P, P + W, [](int32_t t) { return t >= 0; });
      const auto in_new = [&](int32_t t) { return std::binary_search(I, I + c, t); };
      old_sorted.assign(P, P + c_old);
      std::sort(old_sorted.begin(), old_sorted.end());
      // Free slots: below c and not holding a survivor (leaving, or past the old live prefix).
      free_slots.clear();
      for (int64_t j = 0; j < c; ++j) {
        if (j >= c_old || !in_new(P[j])) free_slots.push_back(static_cast<int32_t>(j));
      }
      // Fillers, encoded: id >= 0 is an entering id (row from weight), -1 - j a survivor moving down from slot j.
      fillers.clear();
      for (int64_t k = 0; k < c; ++k) {
        if (!std::binary_search(old_sorted.begin(), old_sorted.end(), I[k])) fillers.push_back(I[k]);
      }
      for (int64_t j = c; j < c_old; ++j) {
        if (in_new(P[j])) fillers.push_back(static_cast<int32_t>(-1 - j));
      }
      // |N| = c = survivors + entering and free = c - (survivors below c), so both lists are equally long.
      TORCH_CHECK(free_slots.size() == fillers.size(), "pack_update: internal error: ", free_slots.size(),
                  " free slots for ", fillers.size(), " fillers at row ", s);
      char* dst_row = packed_p + s * W * row_bytes;
      for (size_t i = 0; i < free_slots.size(); ++i) {
        const int64_t slot = free_slots[i];
        const int32_t f = fillers[i];
        if (f >= 0) {
          P[slot] = f;
          std::memcpy(dst_row + slot * row_bytes, weight_p + static_cast<int64_t>(f) * row_bytes, row_bytes);
        } else {  // the source slot is >= c, above every free slot: nothing copied so far overwrote it
          const int64_t from = -1 - static_cast<int64_t>(f);
          P[slot] = P[from];
          std::memcpy(dst_row + slot * row_bytes, dst_row + from * row_bytes, row_bytes);
        }
      }
      std::fill(P + c, P + W, -1);
    }
  });
}

void pack_update_cuda(at::Tensor& packed, at::Tensor& packed_ids, const at::Tensor& weight, const at::Tensor& ids,
                      const at::Tensor& cnt, const at::Tensor& rows) {
  const int code = check_args(packed, packed_ids, weight, ids, cnt, rows);
  TORCH_CHECK(packed.device().is_cuda(), "pack_update_cuda: tensors must be on a CUDA device, got ", packed.device());
  // Values are not checked here (that would cost a host sync): rows must be distinct, cnt in [1, W],
  // ids[s, :cnt] ascending in [0, V), packed_ids[s] a live prefix; the kernel stays in bounds regardless of
  // these, and skips a listed row outside [0, R) (a row listed twice races with itself). The debug setting checks
  // rows on the host.
  const c10::DeviceGuard guard(packed.device());
  const at::Tensor ids_c = ids.contiguous(), cnt_c = cnt.contiguous(), rows_c = rows.contiguous();
  if (debug_checks()) check_rows("pack_update", rows_c, packed.size(0));
  const int64_t B = rows_c.size(0), W = packed.size(1);
  if (B == 0) return;
  // Per listed row, the list of its free slots (global memory: W may be 32K and more).
  at::Tensor scratch = at::empty({B, W}, packed_ids.options());
  const int err = specvocab_pack_update_launch(
      packed.data_ptr(), packed_ids.data_ptr<int32_t>(), weight.const_data_ptr(), ids_c.const_data_ptr<int32_t>(),
      cnt_c.const_data_ptr<int32_t>(), rows_c.const_data_ptr<int64_t>(), scratch.data_ptr<int32_t>(), B, packed.size(0),
      W, packed.size(2), weight.size(0), code, current_cuda_stream(packed.device()));
  check_launch(err, "pack_update");
}

}  // namespace specvocab
