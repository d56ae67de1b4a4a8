// One logits row's part of compact_topk, shared by the C++ CPU op (compact_topk.cpp) and the CUDA kernels
// (compact_topk_kernel.cu) so that both run the same code: the CPU op runs a row's lanes one after the other, a
// kernel runs them as the threads of one block. The CPU tests then cover the GPU's arithmetic; only the launch
// differs. No torch header (nvcc compiles this without torch).
//
// For logits row m of [N, W] (ops/compact_topk.py::reference_compact_topk is the definition):
// - the top k columns, value descending then column ascending; -inf columns never enter (an entry left empty
//   is -inf and reads as the fallback token);
// - the logsumexp of the row's live (finite) values, -inf when none;
// - tokens: column c's target id is c (no map), ids[c] (one map for all rows) or ids[rows[m / per] * W + c]
//   (a map row per request, `per` logits rows each; a map row outside [0, R), a bad request slot, is never read: no
//   token); a -inf entry, a negative id or no token gives fallback_id;
// - values: the raw value (mode 0), the log-probability v - lse (1) or the probability exp(v - lse) (2).
//
// Two ways to the same top k, chosen by W alone:
// - rows of at most kTopkRegMaxW columns (a request's set, 1-4k): the REGISTER path. Lane t of kTopkRegLanes holds
//   columns t, t + kTopkRegLanes, ... (kTopkRegPerLane of them) in registers, read with one coalesced load each, all
//   in flight at once. Each (value, column) becomes one 64-bit key whose unsigned order is the top-k order (value
//   descending, then column ascending; 0 for a column that is not live), so a round of the top-k is one maximum
//   over the lanes' best keys (warp shuffles, then the block's warps), and only the lane that gave the winner
//   looks for its next best key below it. k rounds, stopping at the first empty one: the cost follows k and the
//   live count, with no sorted lists, no local memory and no merge tree. The register path used to be the list
//   path below for every W: its 24 dependent loads per lane, a k-entry insertion per column and a 7-level merge
//   through local memory made the top-k about 40 % of a draft step (issue 38's estimate).
// - wider rows (a batch's union, up to the draft head's rows): the LIST path. Lane t of kTopkLanes scans columns
//   t, t + kTopkLanes, ... in ascending order and keeps its top k sorted (a later column of equal value never passes
//   an earlier one, so strict > is the tie rule); the lanes' lists are then merged pairwise in a fixed tree (lane t
//   absorbs lane t + s for s = kTopkLanes/2, ..., 1).
// The keys are distinct, so the top k is exact whatever the order of the maxima or merges; the logsumexp's rounding
// follows each path's fixed (max, sum) tree (lane t absorbs lane t + s), the same on both devices.
#pragma once

#include "row_code.h"

constexpr int kTopkMaxK = 16;               // the largest k (draft top-k is 1-10 in practice)
constexpr int kTopkLanes = 128;             // lanes per row: the CUDA block size
constexpr int kTopkStride = kTopkMaxK + 1;  // a lane's list stride: odd, so the lanes' lists spread over the banks
constexpr int32_t kTopkNoColumn = 0x7fffffff;
constexpr int kTopkRegLanes = 256;                                 // the register path's block size
constexpr int kTopkRegPerLane = 16;                                // columns a lane holds in registers
constexpr int64_t kTopkRegMaxW = kTopkRegLanes * kTopkRegPerLane;  // 4096: wider rows take the list path

struct SpecvocabTopkArgs {
  const float* logits;   // [N, W], contiguous
  const int32_t* ids32;  // the column map as int32, or null
  const int64_t* ids64;  // ... as int64, or null (both null: token = column)
  const int64_t* rows;   // [bs]: each request's map row (a 2-D map), or null (one map row for all)
  float* values;         // [N, k] out
  int64_t* tokens;       // [N, k] out
  float* lse;            // [N] out
  int64_t N, W, k, per, fallback_id;
  int64_t R;     // the map's rows (a 2-D map)
  int32_t mode;  // 0 raw, 1 log-probability, 2 probability
};

// Whether entry (va, ca) comes before (vb, cb): value descending, then column ascending.
SV_HD bool sv_topk_before(float va, int32_t ca, float vb, int32_t cb) { return va > vb || (va == vb && ca < cb); }

// (am, as) absorbs (bm, bs): two (max, sum of exp(x - max)) pairs of disjoint column sets; a lane's scan adds a
// live column x as the pair (x, 1).
SV_HD void sv_lse_merge(float* am, float* as, float bm, float bs) {
  if (!(bm > -INFINITY)) return;
  if (!(*am > -INFINITY)) {
    *am = bm;
    *as = bs;
  } else if (bm > *am) {
    *as = *as * expf(*am - bm) + bs;
    *am = bm;
  } else {
    *as += bm == *am ? bs : bs * expf(bm - *am);  // both +inf: as in the lane scan
  }
}

// Lane t's scan of row m: its sorted top k (v, c; empty entries -inf / kTopkNoColumn) and the running max and
// scaled sum of exp over its live columns (max -inf, sum 0 when it has none).
SV_HD void sv_topk_lane(const SpecvocabTopkArgs& a, int64_t m, int t, float* v, int32_t* c, float* mx, float* sum) {
  const int k = static_cast<int>(a.k);
  for (int i = 0; i < k; ++i) {
    v[i] = -INFINITY;
    c[i] = kTopkNoColumn;
  }
  float M = -INFINITY, S = 0.0f, low = -INFINITY;  // low: the list's last value, kept in a register
  const float* row = a.logits + m * a.W;
  for (int64_t j = t; j < a.W; j += kTopkLanes) {
    const float x = row[j];
    if (!(x > -INFINITY)) continue;  // -inf (and NaN) columns are not live
    sv_lse_merge(&M, &S, x, 1.0f);
    if (x > low) {  // strict: an equal value from a later column stays behind
      int i = k - 1;
      for (; i > 0 && x > v[i - 1]; --i) {
        v[i] = v[i - 1];
        c[i] = c[i - 1];
      }
      v[i] = x;
      c[i] = static_cast<int32_t>(j);
      low = v[k - 1];
    }
  }
  *mx = M;
  *sum = S;
}

// (av, ac) becomes the top k of the two sorted lists (av, ac) and (bv, bc).
SV_HD void sv_topk_merge(float* av, int32_t* ac, const float* bv, const int32_t* bc, int k) {
  if (!(bv[0] > -INFINITY)) return;  // b is empty (a lane past W, or all -inf): a stays as it is
  float v[kTopkMaxK];
  int32_t c[kTopkMaxK];
  int i = 0, j = 0;
  for (int o = 0; o < k; ++o) {
    if (sv_topk_before(bv[j], bc[j], av[i], ac[i])) {
      v[o] = bv[j];
      c[o] = bc[j];
      ++j;
    } else {
      v[o] = av[i];
      c[o] = ac[i];
      ++i;
    }
  }
  for (int o = 0; o < k; ++o) {
    av[o] = v[o];
    ac[o] = c[o];
  }
}

// Entry i of row m: value x of column col (x = -inf: an empty entry), given the row's lse.
SV_HD void sv_topk_entry(const SpecvocabTopkArgs& a, int64_t m, int64_t i, float x, int32_t col, float lse) {
  const int64_t r = a.rows != nullptr ? a.rows[m / a.per] : 0;
  const bool mapped = r >= 0 && (a.rows == nullptr || r < a.R);  // a bad slot's row is never read
  const bool live = x > -INFINITY;
  int64_t token = a.fallback_id;
  if (live && mapped) {
    const int64_t map_row = r * a.W;
    token = a.ids32 != nullptr ? a.ids32[map_row + col] : a.ids64 != nullptr ? a.ids64[map_row + col] : col;
    if (token < 0) token = a.fallback_id;
  }
  float out = x;
  if (a.mode == 1) out = live ? x - lse : -INFINITY;
  if (a.mode == 2) out = live ? expf(x - lse) : 0.0f;
  a.values[m * a.k + i] = out;
  a.tokens[m * a.k + i] = token;
}

SV_HD float sv_lse(float mx, float sum) { return mx > -INFINITY ? mx + logf(sum) : -INFINITY; }

// The list path: row m's outputs from its merged top k and (max, sum).
SV_HD void sv_topk_write(const SpecvocabTopkArgs& a, int64_t m, const float* v, const int32_t* c, float mx, float sum) {
  const float lse = sv_lse(mx, sum);
  a.lse[m] = lse;
  for (int64_t i = 0; i < a.k; ++i) sv_topk_entry(a, m, i, v[i], c[i], lse);
}

// --- the register path -------------------------------------------------------------------------------------

// Column col's key: unsigned order is the top-k order (value descending, then column ascending); 0 for a column
// that is not live (-inf, NaN), below every live key. The sign of a zero does not count (-0 == +0, as in the
// reference's comparison). The high word maps the float's bits to an unsigned order; the low word is
// kTopkNoColumn - col, larger for the earlier column.
SV_HD uint64_t sv_topk_key(float x, int32_t col) {
  if (!(x > -INFINITY)) return 0;
  const uint32_t u = x == 0.0f ? 0u : sv_float_bits(x);
  const uint32_t ordered = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<uint64_t>(ordered) << 32) | static_cast<uint32_t>(kTopkNoColumn - col);
}

SV_HD int32_t sv_topk_key_column(uint64_t key) { return kTopkNoColumn - static_cast<int32_t>(key & 0xffffffffu); }

// Lane t's columns of row m into x[kTopkRegPerLane] (columns past W read as -inf) and their running (max, sum of
// exp) in ascending column order, as the list path's lane scan computes them.
SV_HD void sv_topk_reg_load(const SpecvocabTopkArgs& a, int64_t m, int t, float* x, float* mx, float* sum) {
  const float* row = a.logits + m * a.W;
  SV_UNROLL
  for (int i = 0; i < kTopkRegPerLane; ++i) {
    const int64_t j = t + static_cast<int64_t>(kTopkRegLanes) * i;
    x[i] = j < a.W ? row[j] : -INFINITY;  // independent loads: all in flight before the first use
  }
  float M = -INFINITY, S = 0.0f;
  SV_UNROLL
  for (int i = 0; i < kTopkRegPerLane; ++i) {
    sv_lse_merge(&M, &S, x[i], 1.0f);  // a column that is not live adds nothing
  }
  *mx = M;
  *sum = S;
}

// Lane t's largest key below `below` (0 when none): its best at the start (below = ~0), its next after a round won.
SV_HD uint64_t sv_topk_reg_next(const float* x, int t, uint64_t below) {
  uint64_t best = 0;
  SV_UNROLL
  for (int i = 0; i < kTopkRegPerLane; ++i) {
    const uint64_t key = sv_topk_key(x[i], t + kTopkRegLanes * i);
    if (key < below && key > best) best = key;
  }
  return best;
}

// Entry i of row m from a round's winning key (0: an empty entry).
SV_HD void sv_topk_reg_entry(const SpecvocabTopkArgs& a, int64_t m, int64_t i, uint64_t key, float lse) {
  if (key == 0) {
    sv_topk_entry(a, m, i, -INFINITY, 0, lse);
    return;
  }
  const int32_t col = sv_topk_key_column(key);
  sv_topk_entry(a, m, i, a.logits[m * a.W + col], col, lse);  // the raw value, as read
}
