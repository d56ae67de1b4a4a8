// One request's part of window_verify, shared by the C++ CPU op (window_verify.cpp) and the CUDA
// kernel (window_verify_kernel.cu) so that both run the same code: the CPU tests cover the GPU's
// arithmetic, and only the launch differs. No torch header (nvcc compiles this without torch).
// Each entry, each committed token and the telemetry is its own function of the round's tensors, so the kernel
// computes a request's entries with one thread each; the C++ op runs them one after the other.
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
  int32_t* ids;                 // the candidate table [R, capacity]: read before this round's update, then updated
  int32_t* cnt;                 // [R]
  const int64_t* rows;          // [B]
  double* acc;                  // [4, R] telemetry accumulators, or null
  int32_t* block;               // [B, n] out (the C++ op; the kernel keeps a request's entries in shared memory)
  int64_t* accepted;            // [B, S] out
  int32_t* ring;                // the window update's state: [R, >= capacity] rows of ring_stride
  int64_t* length;              // [R]
  int64_t nd, S, kk, k, capacity, R, n_hot, vocab_size, ring_stride;
  int32_t context, compacted, fallback_id;
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

// The round's entries of a request: n_ctx draft tokens (if context), then S positions of k top-k ids.
SV_HD int64_t sv_verify_n_ctx(const SpecvocabVerifyArgs& a) { return a.context ? a.nd : 0; }
SV_HD int64_t sv_verify_n(const SpecvocabVerifyArgs& a) { return sv_verify_n_ctx(a) + a.S * a.k; }

SV_HD bool sv_position_valid(const SpecvocabVerifyArgs& a, int64_t b, int64_t s) {
  return a.accept_index[b * a.S + s] >= 0 && s < a.accept_lens[b];
}

// Entry j of request b before its segment's repeat check: the kept id, or -1.
SV_HD int32_t sv_verify_raw(const SpecvocabVerifyArgs& a, int64_t b, int64_t j) {
  const int64_t n_ctx = sv_verify_n_ctx(a);
  int64_t t = -1;
  if (j < n_ctx) {
    t = a.draft_token[b * a.nd + j];
  } else {
    const int64_t e = j - n_ctx, s = e / a.k, r = e % a.k;
    if (!sv_position_valid(a, b, s) || r >= a.kk) return -1;
    const int64_t pos = a.accept_index[b * a.S + s];
    if (!(a.topk_values[pos * a.kk + r] > -INFINITY)) return -1;
    t = a.topk_ids[pos * a.kk + r];
  }
  return sv_keep(a, t) ? static_cast<int32_t>(t) : -1;
}

// Entry j from the raw entries: a hole where an earlier entry of its segment (the draft tokens, or the top-k ids)
// holds the same id. Checking raw entries gives what checking the checked ones would: the first of equal ids stays.
SV_HD int32_t sv_verify_entry(const int32_t* raw, int64_t n_ctx, int64_t j) {
  const int32_t v = raw[j];
  if (v < 0) return -1;
  const int64_t i0 = j < n_ctx ? 0 : n_ctx;
  return sv_seen(raw + i0, j - i0, v) ? -1 : v;
}

// The token request b commits at position s (-1 where the position is not valid).
SV_HD int64_t sv_verify_token(const SpecvocabVerifyArgs& a, int64_t b, int64_t s) {
  if (!sv_position_valid(a, b, s)) return -1;
  const int64_t last = a.nd - 1;
  return a.predict[a.compacted ? b * a.nd + (s < last ? s : last) : a.accept_index[b * a.S + s]];
}

// A bad request slot reads no table row and adds no telemetry (the CPU op refuses it first); a bad count never
// takes the search past its row. live: the row's count before the update; searched: the prefix searched.
SV_HD bool sv_verify_row_ok(const SpecvocabVerifyArgs& a, int64_t row) { return row >= 0 && row < a.R; }
SV_HD int32_t sv_verify_searched(const SpecvocabVerifyArgs& a, int32_t live) {
  return live < 0 ? 0 : (live > a.capacity ? static_cast<int32_t>(a.capacity) : live);
}

// Whether committed token tok (>= 0) is in the row's set before the update (live: the row's count then).
SV_HD bool sv_verify_hit(const SpecvocabVerifyArgs& a, int64_t row, int32_t live, int64_t tok) {
  if (!sv_verify_row_ok(a, row)) return false;
  return sv_in_row(a.ids + row * a.capacity, sv_verify_searched(a, live), tok);
}

SV_HD void sv_verify_telemetry(const SpecvocabVerifyArgs& a, int64_t row, int32_t live, int64_t hit,
                               int64_t committed) {
  if (a.acc == nullptr || !sv_verify_row_ok(a, row)) return;
  a.acc[row] += static_cast<double>(live);
  a.acc[a.R + row] += 1.0;
  a.acc[2 * a.R + row] += static_cast<double>(hit);
  a.acc[3 * a.R + row] += static_cast<double>(committed);
}

// Request b's whole pass, one entry after another (the C++ op): block[b], accepted[b], the telemetry.
SV_HD void sv_verify_row(const SpecvocabVerifyArgs& a, int64_t b) {
  const int64_t n_ctx = sv_verify_n_ctx(a), n = sv_verify_n(a);
  int32_t* out = a.block + b * n;
  for (int64_t j = 0; j < n; ++j) out[j] = sv_verify_raw(a, b, j);
  for (int64_t j = n - 1; j >= 0; --j) out[j] = sv_verify_entry(out, n_ctx, j);  // entry j reads raw entries < j
  const int64_t row = a.rows[b];
  const int32_t live = sv_verify_row_ok(a, row) ? a.cnt[row] : 0;
  int64_t committed = 0, hit = 0;
  for (int64_t s = 0; s < a.S; ++s) {
    const int64_t tok = sv_verify_token(a, b, s);
    a.accepted[b * a.S + s] = tok;
    if (tok >= 0) {
      ++committed;
      hit += sv_verify_hit(a, row, live, tok) ? 1 : 0;
    }
  }
  sv_verify_telemetry(a, row, live, hit, committed);
}
