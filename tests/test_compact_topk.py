"""``compact_topk``: the draft head's top-k through its column map in one op (the draft loop's host time).

The torch reference (``ops/compact_topk.py::reference_compact_topk``) must equal a literal definition (sort each row's
(value, column) pairs); the C++ op (the lanes, rounds and merge tree the CUDA kernels run, one after the other) must
give the reference's tokens and values exactly and its logsumexp to rounding, on rows with many ties, -inf
columns, signed zeros, rows with fewer live columns than k, every kind of column map and every value mode, on
both paths (the register path up to 4,096 columns, the list path past it).
Through the head, the fused top-k must equal the unfused one for every batch plan.
"""

from __future__ import annotations

import math

import pytest
import torch

from sglang_specvocab.head import DraftHead, head_options
from sglang_specvocab.ops import _ext
from sglang_specvocab.ops.compact_topk import reference_compact_topk
from sglang_specvocab.table import CandidateTable
from sglang_specvocab.vocab import VocabSpace

needs_ext = pytest.mark.skipif(not _ext.available(), reason="the kernels extension is not built")
NEG = float("-inf")


def literal(logits, col_ids, rows, k, fallback, mode):
    """The definition, row by row in Python."""
    N, W = logits.shape
    per = N // rows.shape[0] if rows is not None and N else 1
    values, tokens, lses = [], [], []
    for m in range(N):
        row = logits[m].tolist()
        live = [x for x in row if x != NEG]
        lse = max(live) + math.log(sum(math.exp(x - max(live)) for x in live)) if live else NEG
        order = sorted(range(W), key=lambda c: (-row[c], c))[:k]  # value descending, then column ascending
        vs, ts = [], []
        for c in order:
            v = row[c]
            if col_ids is None:
                t = c
            elif col_ids.dim() == 1:
                t = int(col_ids[c])
            else:
                t = int(col_ids[int(rows[m // per]), c])
            if v == NEG or t < 0:
                t = fallback
            vs.append(
                v
                if mode == 0
                else (NEG if v == NEG else v - lse)
                if mode == 1
                else (0.0 if v == NEG else math.exp(v - lse))
            )
            ts.append(t)
        values.append(vs)
        tokens.append(ts)
        lses.append(lse)
    return torch.tensor(values, dtype=torch.float64), torch.tensor(tokens), torch.tensor(lses, dtype=torch.float64)


def random_case(g, trial):
    """Logits with many ties (small integers), -inf columns, signed zeros, an all -inf row; a random map kind."""
    bs = int(torch.randint(1, 5, (1,), generator=g))
    per = int(torch.randint(1, 5, (1,), generator=g))
    N = bs * per
    W = int(torch.randint(1, 400, (1,), generator=g))
    k = int(torch.randint(1, min(16, W) + 1, (1,), generator=g))
    logits = torch.randint(-3, 3, (N, W), generator=g).float()
    logits[torch.rand(N, W, generator=g) < 0.4] = NEG
    logits[logits == 0] = -0.0 if trial % 2 else 0.0
    if trial % 5 == 0:
        logits[-1] = NEG
    kind = trial % 3
    if kind == 0:
        return logits, None, None, k
    dtype = torch.int32 if trial % 2 else torch.int64
    if kind == 1:
        return logits, torch.randint(-2, 1000, (W,), generator=g).to(dtype), None, k
    col = torch.randint(-2, 1000, (6, W), generator=g).to(dtype)
    return logits, col, torch.randint(0, 6, (bs,), generator=g).to(dtype), k


def test_the_reference_is_the_literal_definition():
    g = torch.Generator().manual_seed(1)
    for trial in range(60):
        logits, col, rows, k = random_case(g, trial)
        for mode in (0, 1, 2):
            values, tokens, lse = reference_compact_topk(logits, col, rows, k, 7, mode)
            want_v, want_t, want_lse = literal(logits, col, rows, k, 7, mode)
            assert torch.equal(tokens, want_t), (trial, mode)
            assert torch.allclose(values.double(), want_v, rtol=1e-5, atol=1e-6), (trial, mode)
            assert torch.allclose(lse.double(), want_lse, rtol=1e-5, atol=1e-6), trial


@needs_ext
def test_the_cpp_op_equals_the_reference():
    g = torch.Generator().manual_seed(2)
    for trial in range(300):
        logits, col, rows, k = random_case(g, trial)
        for mode in (0, 1, 2):
            want = reference_compact_topk(logits, col, rows, k, 7, mode)
            got = torch.ops.specvocab.compact_topk(logits, col, rows, k, 7, mode)
            assert torch.equal(got[1], want[1]), (trial, mode)
            if mode == 0:  # raw values are the logits themselves
                assert torch.equal(got[0], want[0]), trial
            assert torch.allclose(got[0], want[0], rtol=1e-5, atol=1e-6), (trial, mode)
            assert torch.allclose(got[2], want[2], rtol=1e-5, atol=1e-6), trial


@needs_ext
def test_infinite_logits_give_the_references_logsumexp():
    """Several +inf logits in a row (in one lane and across lanes): the logsumexp is +inf, as torch's, not NaN."""
    logits = torch.randn(3, 300, generator=torch.Generator().manual_seed(4))
    logits[0, [5, 70]] = float("inf")  # two lanes, one each: the merge tree adds them
    logits[1, [7, 7 + 128, 7 + 256]] = float("inf")  # one lane, three times: the lane's scan adds them
    logits[2, 9] = float("inf")
    for mode in (0, 1, 2):
        want = reference_compact_topk(logits, None, None, 4, 0, mode)
        got = torch.ops.specvocab.compact_topk(logits, None, None, 4, 0, mode)
        assert torch.equal(got[2], want[2]) and torch.isposinf(got[2]).all(), mode
        assert torch.equal(got[1], want[1]), mode
        assert torch.allclose(got[0], want[0], equal_nan=True), mode


@needs_ext
def test_wide_rows_and_no_rows():
    """Columns far past the 128 lanes (each lane scans many), large values, and an empty batch."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 20000, generator=g) * 30
    logits[:, ::7] = NEG
    for k in (1, 4, 16):
        want = reference_compact_topk(logits, None, None, k, 0, 2)
        got = torch.ops.specvocab.compact_topk(logits, None, None, k, 0, 2)
        assert torch.equal(got[1], want[1]) and torch.allclose(got[0], want[0], rtol=1e-5, atol=1e-7)
        assert torch.allclose(got[2], want[2], rtol=1e-6)
    empty = torch.ops.specvocab.compact_topk(
        logits[:0], torch.zeros(3, 20000, dtype=torch.int32), torch.zeros(0, dtype=torch.int64), 2, 0, 1
    )
    assert [tuple(t.shape) for t in empty] == [(0, 2), (0, 2), (0,)]


@needs_ext
@pytest.mark.parametrize("W", [1, 17, 255, 256, 257, 1200, 3072, 4095, 4096, 4097, 6000])
def test_both_paths_equal_the_reference_at_their_boundary(W):
    """Widths around the register path's lanes (256) and its end (4,096 columns; past it the list path): ties
    across lanes and within one lane, -0.0 beside +0.0 in one row (equal, so the lower column first), +inf and NaN
    columns, a row with fewer live columns than k, an all -inf row, a per-request map with a bad slot."""
    g = torch.Generator().manual_seed(W)
    bs, per = 3, 3
    logits = torch.randint(-4, 4, (bs * per, W), generator=g).float()
    logits[torch.rand(bs * per, W, generator=g) < 0.3] = NEG
    zeros = logits[0] == 0
    logits[0, zeros] = torch.where(torch.rand(int(zeros.sum()), generator=g) < 0.5, -0.0, 0.0)
    logits[1, torch.randint(0, W, (3,), generator=g)] = float("inf")
    logits[2, torch.randint(0, W, (2,), generator=g)] = float("nan")
    logits[3, :] = NEG
    logits[3, W - 1] = 2.0  # one live column, the last: k - 1 empty entries
    logits[4, :] = NEG
    logits[5, :] = 1.0  # all tied: the lowest columns, whichever lanes hold them
    col = torch.randint(-1, 70000, (5, W), generator=g).to(torch.int32)
    rows = torch.tensor([4, 9, 0])  # request 1's slot is outside the map: no tokens
    for k in sorted({1, min(W, 3), min(W, 16)}):
        for mode in (0, 1, 2):
            want = reference_compact_topk(logits, col, rows, k, 11, mode)
            got = torch.ops.specvocab.compact_topk(logits, col, rows, k, 11, mode)
            keep = torch.ones(bs * per, dtype=torch.bool)
            keep[2] = False  # NaN's order is unspecified: its tokens are checked live-only below
            assert torch.equal(got[1][keep], want[1][keep]), (k, mode)
            if mode == 0:
                assert torch.equal(got[0][keep], want[0][keep]), k
            assert torch.allclose(got[0][keep], want[0][keep], rtol=1e-5, atol=1e-6, equal_nan=True), (k, mode)
            assert torch.allclose(got[2][keep], want[2][keep], rtol=1e-5, atol=1e-6), (k, mode)
            rest = torch.where(logits[2].isnan(), NEG, logits[2])  # NaN columns are never live
            assert torch.allclose(got[2][2], rest.logsumexp(0)), k
            top = rest.topk(k).values
            if mode == 0:
                assert torch.equal(got[0][2], top), k


def test_the_fake_kernel_runs_on_meta():
    """Shapes only (torch.compile, the cost model's dry runs): no values read."""
    if not _ext.available():
        pytest.skip("the kernels extension is not built")
    logits = torch.empty(12, 300, device="meta")
    values, tokens, lse = torch.ops.specvocab.compact_topk(
        logits,
        torch.empty(5, 300, dtype=torch.int32, device="meta"),
        torch.empty(3, dtype=torch.int64, device="meta"),
        4,
        0,
        2,
    )
    assert values.shape == (12, 4) and tokens.dtype == torch.int64 and lse.shape == (12,)


def head_pair(kernel: str, batch: str, hot=None, V=300):
    g = torch.Generator().manual_seed(4)
    R, W, d = 6, 24, 16
    H = V if hot is None else hot.numel()
    weight = (torch.randn(H, d, generator=g) * 2).round()  # small integers: many exact ties in the logits
    pool = hot if hot is not None else torch.arange(V)
    ids = torch.stack([pool[torch.randperm(pool.numel(), generator=g)[:W]].sort().values for _ in range(R)])
    cnt = torch.randint(1, W + 1, (R,), generator=g).to(torch.int32)
    table = CandidateTable.over(ids.to(torch.int32), cnt, int(pool[0]))
    space = VocabSpace.build(V, head_ids=hot, fallback_id=table.fallback_id) if hot is not None else None
    return DraftHead(weight, table, space, head_options(kernel=kernel, batch=batch)), torch.Generator().manual_seed(5)


@needs_ext
@pytest.mark.parametrize("batch", ["per-request", "union-indexed", "union-gemm", "stock"])
@pytest.mark.parametrize("d2t", [False, True])
def test_the_head_fused_top_k_equals_the_unfused(batch, d2t):
    """DraftHead with the extension (compact_topk) against the torch head (the reference: the exact-order top-k,
    then the column map), for every plan, full-vocabulary and d2t heads; k from 1 to past a set's live columns."""
    hot = torch.randperm(300, generator=torch.Generator().manual_seed(6))[:120].sort().values if d2t else None
    fused, g = head_pair("cuda", batch, hot)
    plain, _ = head_pair("torch", batch, hot)
    rows = torch.tensor([4, 1, 2])
    hidden = (torch.randn(3 * 4, 16, generator=g) * 2).round()
    for k in (1, 3, 16):
        a, b = fused(hidden, rows), plain(hidden, rows)
        assert torch.equal(a.logits, b.logits)
        for name in ("topk", "topk_logprobs", "topk_probs"):
            (va, ta), (vb, tb) = getattr(a, name)(k), getattr(b, name)(k)
            assert torch.equal(ta, tb), (name, k)
            # log-probabilities differ by the logsumexp's rounding, relative to logits of tens here
            assert torch.allclose(va, vb, rtol=1e-5, atol=1e-4), (name, k)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "N,W,k",
    [
        (4, 3072, 4),
        (40, 3072, 10),
        (80, 1200, 8),
        (8, 4096, 16),
        (2, 4097, 3),
        (256, 24576, 8),
        (3, 100, 16),
        (8, 16384, 1),
    ],
)
def test_cuda_op_equals_the_reference(N, W, k):
    """The CUDA kernels (one block per row, the C++ op's row code): the register path up to 4,096 columns, the
    list path past it."""
    if not _ext.has_cuda_kernels():
        pytest.skip("the extension was built without CUDA kernels")
    g = torch.Generator().manual_seed(N + W + k)
    for trial in range(6):
        logits = torch.randint(-50, 50, (N, W), generator=g).float() / 4
        logits[torch.rand(N, W, generator=g) < 0.2] = NEG
        bs = max(1, N // 4)
        col = torch.randint(-1, 200000, (bs + 3, W), generator=g).to(torch.int32)
        rows = torch.randperm(bs + 3, generator=g)[:bs]
        for mode in (0, 1, 2):
            want = reference_compact_topk(logits, col, rows, k, 5, mode)
            got = torch.ops.specvocab.compact_topk(logits.cuda(), col.cuda(), rows.cuda(), k, 5, mode)
            assert torch.equal(got[1].cpu(), want[1]), (trial, mode)
            assert torch.allclose(got[0].cpu(), want[0], rtol=1e-5, atol=1e-6), (trial, mode)
            assert torch.allclose(got[2].cpu(), want[2], rtol=1e-5, atol=1e-6), trial
