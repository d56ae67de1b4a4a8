// One request's part of window_verify, shared by the C++ CPU op (window_verify.cpp) and the CUDA
// kernel (window_verify_kernel.cu) so that both run the same code: the CPU tests cover the GPU's
// arithmetic, and only the launch differs. No torch header (nvcc compiles this without torch).
//
// For request b (S = accept_index columns, nd = draft tokens per request, kk = top-k columns held,
// k = verified top-K per position the window appends), it writes:
//   block[b, :n] (n = (context ? nd : 0) + S * k): the round's window entries, as the window policy's
//     on_verify builds them: the draft-tree tokens (if context), then per accepted position s the
//     target's top-k ids (rank order; -1 past kk, for a position not accepted, or a -inf logit); an id
//     that is not kept (outside [0, vocab_size), or outside the draft vocabulary `hot`) or that repeats
//     an earlier id of its own segment is a hole (-1);
//   accepted[b, :S]: the committed tokens (root's successor first, then the bonus), -1 padded;
// and adds the round to the telemetry rows acc[0..3][row] (set size before the update, one round,
// committed tokens in the set, committed tokens). Positions are valid where accept_index >= 0 and
// s < accept_lens[b]; compacted: token s of request b is predict[b * nd + min(s, nd - 1)] (SGLang's
// tree path moved to the front), else predict[accept_index[b, s]].
#pragma once

#include "row_code.h"

struct SpecvocabVerifyArgs {
  const int64_t* draft_token;   // [B * nd]
  const int64_t* accept_index;  // [B, S]
  const int64_t* accept_lens;   // [B]
  const int64_t* predict;       // [B * nd]
  const float* topk_values;     // [B * nd, kk]
  const int64_t* topk_ids;      // [B * nd, kk]
  const bool* hot;              // [n_hot] or null: the draft vocabulary
  const int32_t* ids;           // the candidate table [R, capacity], before this round's update
  const int32_t* cnt;           // [R]
  const int64_t* rows;          // [B]
  double* acc;                  // [4, R] telemetry accumulators, or null
  int32_t* block;               // [B, n] out
  int64_t* accepted;            // [B, S] out
  int64_t nd, S, kk, k, capacity, R, n_hot, vocab_size;
  int32_t context, compacted;
};

SV_HD bool sv_keep(const SpecvocabVerifyArgs& a, int64_t t) {
  return t >= 0 && t < a.vocab_size && (a.hot == nullptr || (t < a.n_hot && a.hot[t]));
}

// Whether v (>= 0) is among seg[0, j): segments are a few dozen entries, so a scan is cheapest.
SV_HD bool sv_seen(const int32_t* seg, int64_t j, int32_t v) {
  for (int64_t i = 0; i < j; ++i)
    if (seg[i] == v) return true;
  return false;
}

// Whether token t is in the sorted live prefix ids[0, cnt) of a table row.
SV_HD bool sv_in_row(const int32_t* row, int32_t cnt, int64_t t) {
  int32_t lo = 0, hi = cnt;
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (static_cast<int64_t>(row[mid]) < t)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < cnt && static_cast<int64_t>(row[lo]) == t;
}

SV_HD void sv_verify_row(const SpecvocabVerifyArgs& a, int64_t b) {
  const int64_t n_ctx = a.context ? a.nd : 0, n = n_ctx + a.S * a.k;
  int32_t* out = a.block + b * n;
  for (int64_t j = 0; j < n_ctx; ++j) {
    const int64_t t = a.draft_token[b * a.nd + j];
    const int32_t v = sv_keep(a, t) ? static_cast<int32_t>(t) : -1;
    out[j] = (v >= 0 && sv_seen(out, j, v)) ? -1 : v;
  }
  int32_t* seg = out + n_ctx;
  const int64_t row = a.rows[b];
  // A bad request slot reads no table row and adds no telemetry (the CPU op refuses it first); a bad count never
  // takes the search past its row.
  const bool row_ok = row >= 0 && row < a.R;
  const int32_t* table_row = a.ids + (row_ok ? row : 0) * a.capacity;
  const int32_t live = row_ok ? a.cnt[row] : 0;
  const int32_t searched = live < 0 ? 0 : (live > a.capacity ? static_cast<int32_t>(a.capacity) : live);
  int64_t committed = 0, hit = 0;
  for (int64_t s = 0; s < a.S; ++s) {
    const int64_t idx = a.accept_index[b * a.S + s];
    const bool valid = idx >= 0 && s < a.accept_lens[b];
    const int64_t pos = idx < 0 ? 0 : idx;
    int64_t tok = -1;
    if (valid) {
      const int64_t last = a.nd - 1;
      tok = a.predict[a.compacted ? b * a.nd + (s < last ? s : last) : pos];
      if (tok >= 0) {
        ++committed;
        hit += sv_in_row(table_row, searched, tok) ? 1 : 0;
      }
    }
    a.accepted[b * a.S + s] = tok;
    for (int64_t r = 0; r < a.k; ++r) {
      const int64_t j = s * a.k + r;
      int32_t v = -1;
      if (valid && r < a.kk && a.topk_values[pos * a.kk + r] > -INFINITY) {
        const int64_t t = a.topk_ids[pos * a.kk + r];
        v = sv_keep(a, t) ? static_cast<int32_t>(t) : -1;
      }
      seg[j] = (v >= 0 && sv_seen(seg, j, v)) ? -1 : v;
    }
  }
  if (a.acc != nullptr && row_ok) {
    a.acc[row] += static_cast<double>(live);
    a.acc[a.R + row] += 1.0;
    a.acc[2 * a.R + row] += static_cast<double>(hit);
    a.acc[3 * a.R + row] += static_cast<double>(committed);
  }
}
