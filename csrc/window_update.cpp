// window_update: argument checks, the C++ CPU implementation, the CUDA wrapper.
// Semantics (the torch reference, ops/window_update.py::reference_window_update, is the definition):
// append each listed row's valid block entries (ids in [0, vocab_size), in order) to its ring of
// the last `capacity` stream entries, then write the ring's sorted distinct ids to the table.
#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <vector>

#include "ops.h"

namespace specvocab {

void check_window_update(at::Tensor& ring, at::Tensor& length, at::Tensor& ids, at::Tensor& cnt, const at::Tensor& rows,
                         const at::Tensor& block, int64_t fallback_id, int64_t vocab_size) {
  const char* op = "window_update";
  TORCH_CHECK(ids.dim() == 2 && ids.scalar_type() == at::kInt && ids.is_contiguous(), op,
              ": ids must be a contiguous int32 [R, capacity] table, got ", ids.scalar_type(), " ", ids.sizes());
  const int64_t R = ids.size(0), cap = ids.size(1);
  TORCH_CHECK(cnt.dim() == 1 && cnt.scalar_type() == at::kInt && cnt.size(0) == R && cnt.is_contiguous(), op,
              ": cnt must be contiguous int32 [R=", R, "], got ", cnt.scalar_type(), " ", cnt.sizes());
  TORCH_CHECK(ring.dim() == 2 && ring.scalar_type() == at::kInt && ring.size(0) == R && ring.size(1) >= cap &&
                  ring.stride(1) == 1,
              op, ": ring must be int32 [R=", R, ", >= capacity=", cap, "] with contiguous rows, got ",
              ring.scalar_type(), " ", ring.sizes());
  TORCH_CHECK(length.dim() == 1 && length.scalar_type() == at::kLong && length.size(0) == R && length.is_contiguous(),
              op, ": length must be contiguous int64 [R=", R, "], got ", length.scalar_type(), " ", length.sizes());
  TORCH_CHECK(rows.dim() == 1 && rows.scalar_type() == at::kLong, op, ": rows must be int64 [B], got ",
              rows.scalar_type(), " ", rows.sizes());
  TORCH_CHECK(block.dim() == 2 && block.scalar_type() == at::kInt && block.size(0) == rows.size(0), op,
              ": block must be int32 [B=", rows.size(0), ", n], got ", block.scalar_type(), " ", block.sizes());
  TORCH_CHECK(vocab_size >= 1 && vocab_size <= (int64_t{1} << 31), op, ": vocab_size = ", vocab_size,
              " must be in [1, 2^31]");
  TORCH_CHECK(fallback_id >= 0 && fallback_id < vocab_size, op, ": fallback_id = ", fallback_id,
              " must be a token id in [0, vocab_size=", vocab_size, ")");
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&length, &ids, &cnt, &rows, &block})
    TORCH_CHECK(t->device() == ring.device(), op, ": all tensors must be on one device, got ", ring.device(), " and ",
                t->device());
}

void window_update_cpu(at::Tensor& ring, at::Tensor& length, at::Tensor& ids, at::Tensor& cnt, const at::Tensor& rows_,
                       const at::Tensor& block_, int64_t fallback_id, int64_t vocab_size) {
  check_window_update(ring, length, ids, cnt, rows_, block_, fallback_id, vocab_size);
  const at::Tensor rows = rows_.contiguous(), block = block_.contiguous();
  const int64_t R = ids.size(0), cap = ids.size(1), B = rows.size(0), n = block.size(1);
  const int64_t* r = rows.data_ptr<int64_t>();
  check_rows("window_update", rows, R);  // free on the CPU: always
  int32_t* ring_p = ring.data_ptr<int32_t>();
  const int64_t stride = ring.stride(0);
  int64_t* len_p = length.data_ptr<int64_t>();
  int32_t* ids_p = ids.data_ptr<int32_t>();
  int32_t* cnt_p = cnt.data_ptr<int32_t>();
  const int32_t* blk = block.data_ptr<int32_t>();
  at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
    std::vector<int32_t> set;
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t s = r[b];
      int32_t* my_ring = ring_p + s * stride;
      const int32_t* e = blk + b * n;
      auto valid = [&](int32_t v) { return v >= 0 && v < vocab_size; };
      int64_t count = 0;
      for (int64_t i = 0; i < n; ++i) count += valid(e[i]);
      int64_t rank = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (!valid(e[i])) continue;
        if (rank >= count - cap) my_ring[(len_p[s] + rank) % cap] = e[i];
        ++rank;
      }
      len_p[s] += count;
      set.clear();
      for (int64_t p = 0; p < cap; ++p)
        if (valid(my_ring[p])) set.push_back(my_ring[p]);
      std::sort(set.begin(), set.end());
      set.erase(std::unique(set.begin(), set.end()), set.end());
      int32_t* row = ids_p + s * cap;
      const int64_t k = static_cast<int64_t>(set.size());
      std::copy(set.begin(), set.end(), row);
      std::fill(row + k, row + cap, static_cast<int32_t>(fallback_id));
      cnt_p[s] = k > 0 ? static_cast<int32_t>(k) : 1;
    }
  });
}

void window_update_cuda(at::Tensor& ring, at::Tensor& length, at::Tensor& ids, at::Tensor& cnt, const at::Tensor& rows_,
                        const at::Tensor& block_, int64_t fallback_id, int64_t vocab_size) {
  check_window_update(ring, length, ids, cnt, rows_, block_, fallback_id, vocab_size);
  c10::DeviceGuard guard(ring.device());
  const at::Tensor rows = rows_.contiguous(), block = block_.contiguous();
  // Rows out of range or listed twice cannot be checked here without a host sync: the policies pass SGLang's
  // req_pool_indices, distinct and in range by construction. Only the debug setting checks them (a host copy);
  // otherwise a row listed twice races with itself (that row's result is unspecified) and the kernel skips one
  // out of range (never an out-of-bounds access).
  if (debug_checks()) check_rows("window_update", rows, ids.size(0));
  const int code = specvocab_window_update_launch(
      ring.data_ptr<int32_t>(), length.data_ptr<int64_t>(), ids.data_ptr<int32_t>(), cnt.data_ptr<int32_t>(),
      rows.data_ptr<int64_t>(), block.data_ptr<int32_t>(), rows.size(0), ids.size(0), block.size(1), ring.stride(0),
      ids.size(1), static_cast<int32_t>(fallback_id), vocab_size, current_cuda_stream(ring.device()));
  check_launch(code, "window_update");
}

}  // namespace specvocab
