// How the logits kernels cut the hidden rows into pieces and read a table id's head row; shared by the CUDA kernel
// and the C++ CPU kernel, so the CPU tests run the same code the GPU does.
//
// A run is a maximal range of consecutive rows with one slot (a request's tree branches; a whole batch for a union
// table). A piece is one pass over the slot's candidate rows for at most P of the run's rows. A run [s, e) is cut at
// s, s + P, and then at every multiple of P after s + P, so
// * a run of at most P rows is one piece wherever it lies (its candidate rows are read once), and
// * whether row m starts a piece, and the piece's length, follow from the slots of rows [m - P - 1, m + P) alone:
//   a GPU block that owns rows [m0, m0 + P) finds its pieces in a window of 3P + 1 slots.
#pragma once

#include <stdint.h>

#ifdef __CUDACC__
#define SPECVOCAB_HD __host__ __device__ __forceinline__
#else
#define SPECVOCAB_HD inline
#endif

namespace specvocab {

// The length of the piece that starts at row m, or 0 when no piece starts there. `slot(i)` is row i's slot; it is
// called only for rows in [max(0, m - P - 1), min(M, m + P)).
template <typename SlotFn>
SPECVOCAB_HD int piece_length(const SlotFn& slot, int64_t m, int64_t M, int P) {
  auto run_start = [&](int64_t i) { return i == 0 || slot(i) != slot(i - 1); };
  int dist = P + 1;  // rows since the run's start; P + 1 stands for "more than P"
  for (int k = 0; k <= P; ++k) {
    if (run_start(m - k)) {  // a run starts at row 0, so m - k never goes below 0
      dist = k;
      break;
    }
  }
  if (!(dist == 0 || dist == P || (dist > P && m % P == 0))) return 0;
  int64_t e = m + 1;  // the run's end, looked for at most P rows ahead
  const int64_t cap = m + P < M ? m + P : M;
  while (e < cap && !run_start(e)) ++e;
  const int64_t limit = dist == 0 ? m + P : (m / P + 1) * P;  // the next cut of this run
  return static_cast<int>((e < limit ? e : limit) - m);
}

// A table id's head row: the id, or row_map[id] with a row map (a d2t draft's or a TP shard's ids to its rows). A
// negative id or map entry is a dead column; an id past the map (>= L) reads as `bad_row` (>= V: a bad entry).
SPECVOCAB_HD int64_t head_row(int64_t id, const int32_t* row_map, int64_t L, int64_t bad_row) {
  if (row_map == nullptr || id < 0) return id;
  return id >= L ? bad_row : static_cast<int64_t>(row_map[id]);
}

}  // namespace specvocab
