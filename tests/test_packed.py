"""The packed head mode: pack_update (MicroSpec's asynchronous gathering) and packed_logits."""

import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from literal import literal_pack_update

from sglang_specvocab.ops.indexed_logits import reference_indexed_logits, reference_packed_logits
from sglang_specvocab.ops.pack_update import reference_pack_update

KINDS = ("random", "grow", "shrink", "disjoint", "identical", "one", "full", "swap")
_BITS = {
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.float64: torch.int64,
}


def bits(t):
    """Bitwise view, so comparisons are exact (and NaN garbage in don't-care rows compares equal)."""
    return t.view(_BITS[t.dtype])


def next_set(rng, kind, prev, V, W):
    """A slot's next set (ascending), related to its previous one as ``kind`` says."""
    prev_set = set(prev)  # once: V may be 520k (the CUDA test), and a set per candidate made that O(V * W)
    others = [t for t in range(V) if t not in prev_set]
    if not prev or kind == "random":
        return sorted(rng.sample(range(V), rng.randint(1, W)))
    if kind == "identical":
        return sorted(prev)
    if kind == "one":
        return [rng.randrange(V)]
    if kind == "full":
        return sorted(rng.sample(range(V), W))
    if kind == "grow":
        return sorted(prev + rng.sample(others, rng.randint(0, min(W - len(prev), len(others)))))
    if kind == "shrink":
        return sorted(rng.sample(prev, rng.randint(1, len(prev))))
    if kind == "disjoint":
        return sorted(rng.sample(others, rng.randint(1, min(W, len(others)))))
    keep = rng.sample(prev, rng.randint(0, len(prev)))  # swap: some leave, some enter
    return sorted(keep + rng.sample(others, rng.randint(0 if keep else 1, min(W - len(keep), len(others)))))


class State:
    """A table plus packed buffers; ``step`` writes new sets for some rows and returns the rows tensor."""

    def __init__(self, R, W, V, d, dtype, seed):
        self.R, self.W, self.V = R, W, V
        self.gen = torch.Generator().manual_seed(seed)
        self.weight = torch.randn(V, d, generator=self.gen).to(dtype)
        self.ids = torch.zeros(R, W, dtype=torch.int32)  # tail holds fallback id 0
        self.cnt = torch.ones(R, dtype=torch.int32)
        self.packed = torch.randn(R, W, d, generator=self.gen).to(dtype)  # garbage: fresh rows are all don't-care
        self.packed_ids = torch.full((R, W), -1, dtype=torch.int32)
        self.sets = [[] for _ in range(R)]

    def step(self, rng, kinds=KINDS, rows=None):
        if rows is None:
            rows = rng.sample(range(self.R), rng.randint(1, self.R))  # distinct, any order
        for s in rows:
            self.sets[s] = next_set(rng, rng.choice(kinds), self.sets[s], self.V, self.W)
            c = len(self.sets[s])
            self.ids[s] = 0
            self.ids[s, :c] = torch.tensor(self.sets[s], dtype=torch.int32)
            self.cnt[s] = c
        return torch.tensor(rows, dtype=torch.int64)

    def new_weight(self):
        self.weight = torch.randn(self.weight.shape, generator=self.gen).to(self.weight.dtype)

    def buffers(self):
        return self.packed.clone(), self.packed_ids.clone()


def check_invariants(before, after, weight, ids, cnt, rows):
    """What a user of the packed buffers relies on after an update (weight unchanged since the last one)."""
    (p0, pid0), (p1, pid1) = before, after
    listed = set(rows.tolist())
    for s in range(pid1.shape[0]):
        if s not in listed:
            assert torch.equal(pid1[s], pid0[s]) and torch.equal(bits(p1[s]), bits(p0[s])), "unlisted row touched"
            continue
        c, c_old = int(cnt[s]), int((pid0[s] >= 0).sum())
        live = pid1[s, :c].long()
        assert sorted(live.tolist()) == ids[s, :c].tolist(), "packed ids are not the table's set"
        assert (pid1[s, c:] == -1).all()
        assert torch.equal(bits(p1[s, :c]), bits(weight[live])), "a packed row is not its id's weight row"
        new_set = set(ids[s, :c].tolist())
        for j in range(min(c, c_old)):
            if int(pid0[s, j]) in new_set:  # a survivor below the new count keeps its slot and row
                assert int(pid1[s, j]) == int(pid0[s, j])
                assert torch.equal(bits(p1[s, j]), bits(p0[s, j]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@settings(max_examples=60)
@given(data=st.data())
def test_reference_matches_literal(dtype, data):
    R = data.draw(st.integers(1, 4), label="R")
    W = data.draw(st.integers(1, 12), label="W")
    V = data.draw(st.integers(2 * W, 3 * W + 4), label="V")
    d = data.draw(st.integers(1, 5), label="d")
    rng = data.draw(st.randoms(use_true_random=False))
    state = State(R, W, V, d, dtype, seed=rng.randrange(2**31))
    lit = state.buffers()
    for _ in range(data.draw(st.integers(1, 6), label="steps")):
        rows = state.step(rng)
        if rng.random() < 0.5:
            state.new_weight()  # which rows are read from weight (entering ids only) then shows in the result
        reference_pack_update(state.packed, state.packed_ids, state.weight, state.ids, state.cnt, rows)
        literal_pack_update(*lit, state.weight, state.ids, state.cnt, rows)
        assert torch.equal(state.packed_ids, lit[1])
        assert torch.equal(bits(state.packed), bits(lit[0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kinds", [KINDS, ("grow", "shrink"), ("disjoint", "identical"), ("one", "full")])
def test_invariants_over_long_sequences(dtype, kinds):
    rng = random.Random("".join(kinds) + str(dtype))
    state = State(R=6, W=48, V=160, d=8, dtype=dtype, seed=1)
    lit = state.buffers()
    for _ in range(30):
        rows = state.step(rng, kinds)
        before = state.buffers()
        reference_pack_update(state.packed, state.packed_ids, state.weight, state.ids, state.cnt, rows)
        check_invariants(before, state.buffers(), state.weight, state.ids, state.cnt, rows)
        literal_pack_update(*lit, state.weight, state.ids, state.cnt, rows)
        assert torch.equal(state.packed_ids, lit[1]) and torch.equal(bits(state.packed), bits(lit[0]))


def _one_row(old, new, W=6, d=2):
    """Row 0 holds ``old`` ids (row k = weight1[k]); update to ``new`` with weight2 = weight1 + 100."""
    V = 20
    weight1 = torch.arange(V * d, dtype=torch.float32).view(V, d)
    packed = torch.full((2, W, d), float("nan"))
    packed_ids = torch.full((2, W), -1, dtype=torch.int32)
    packed_ids[0, : len(old)] = torch.tensor(old, dtype=torch.int32)
    packed[0, : len(old)] = weight1[packed_ids[0, : len(old)].long()]
    ids = torch.zeros(2, W, dtype=torch.int32)
    ids[0, : len(new)] = torch.tensor(new, dtype=torch.int32)
    cnt = torch.tensor([len(new), 1], dtype=torch.int32)
    rows = torch.tensor([0])
    lit = (packed.clone(), packed_ids.clone())
    reference_pack_update(packed, packed_ids, weight1 + 100, ids, cnt, rows)
    literal_pack_update(*lit, weight1 + 100, ids, cnt, rows)
    assert torch.equal(packed_ids, lit[1]) and torch.equal(bits(packed), bits(lit[0]))
    live = packed_ids[0, : len(new)].long()
    from_weight2 = (packed[0, : len(new), 0] >= 100).tolist()  # the row was read from the LM head now
    return packed_ids[0].tolist(), [int(t) for t, w2 in zip(live, from_weight2, strict=True) if w2]


def test_hand_examples():
    # 5 and 7 leave; 9 and 2 stay in place; 8 enters into the first free slot (0).
    assert _one_row([5, 9, 2, 7], [2, 8, 9]) == ([8, 9, 2, -1, -1, -1], [8])
    # Nothing enters; 2 and 7 sit at slots >= c = 2 and move down into the freed slots 0 and 1 (not re-read).
    assert _one_row([5, 9, 2, 7], [2, 7]) == ([2, 7, -1, -1, -1, -1], [])
    # Growth: survivors keep slots 0 and 1, the entering ids take slots 2 and 3 in ascending order.
    assert _one_row([5, 9], [1, 5, 6, 9]) == ([5, 9, 1, 6, -1, -1], [1, 6])
    # Same set, permuted slots: nothing changes and nothing is read.
    assert _one_row([9, 2, 5], [2, 5, 9]) == ([9, 2, 5, -1, -1, -1], [])
    # Fresh row: the whole set in table order. Shrink to one id: 19 moves down to slot 0.
    assert _one_row([], [3, 4, 11, 12, 13, 19]) == ([3, 4, 11, 12, 13, 19], [3, 4, 11, 12, 13, 19])
    assert _one_row([3, 4, 11, 12, 13, 19], [19]) == ([19, -1, -1, -1, -1, -1], [])
    # Full row: 3 and 4 keep slots 0 and 1, the entering ids fill the leaving slots 2..5 in table order.
    assert _one_row([3, 4, 11, 12, 13, 19], [0, 1, 2, 3, 4, 5]) == ([3, 4, 0, 1, 2, 5], [0, 1, 2, 5])


def test_fresh_state_copies_the_whole_set_in_table_order():
    state = State(R=3, W=10, V=50, d=4, dtype=torch.float32, seed=3)
    rows = state.step(random.Random(0))
    reference_pack_update(state.packed, state.packed_ids, state.weight, state.ids, state.cnt, rows)
    for s in rows.tolist():
        c = int(state.cnt[s])
        assert torch.equal(state.packed_ids[s, :c], state.ids[s, :c])
        assert torch.equal(state.packed[s, :c], state.weight[state.ids[s, :c].long()])


def test_only_entering_ids_read_the_weight():
    state = State(R=4, W=16, V=60, d=3, dtype=torch.float32, seed=4)
    rng = random.Random(4)
    for _ in range(5):
        reference_pack_update(state.packed, state.packed_ids, state.weight, state.ids, state.cnt, state.step(rng))
    old_weight = state.weight
    old_ids = state.packed_ids.clone()
    rows = state.step(rng, ("swap", "shrink", "grow"))
    state.weight = old_weight + 1000  # a different LM head: rows read from it now are recognizable
    reference_pack_update(state.packed, state.packed_ids, state.weight, state.ids, state.cnt, rows)
    for s in rows.tolist():
        c_old = int((old_ids[s] >= 0).sum())
        old_set = set(old_ids[s, :c_old].tolist())
        for j in range(int(state.cnt[s])):
            t = int(state.packed_ids[s, j])
            want = old_weight[t] if t in old_set else state.weight[t]
            assert torch.equal(state.packed[s, j], want)


def test_runs_on_meta():
    R, W, V, d = 3, 7, 40, 5
    packed = torch.empty(R, W, d, device="meta", dtype=torch.bfloat16)
    packed_ids = torch.empty(R, W, device="meta", dtype=torch.int32)
    weight = torch.empty(V, d, device="meta", dtype=torch.bfloat16)
    ids = torch.empty(R, W, device="meta", dtype=torch.int32)
    cnt = torch.empty(R, device="meta", dtype=torch.int32)
    reference_pack_update(packed, packed_ids, weight, ids, cnt, torch.empty(2, device="meta", dtype=torch.int64))
    hidden = torch.empty(4, d, device="meta", dtype=torch.bfloat16)
    out = reference_packed_logits(hidden, packed, cnt, torch.empty(4, device="meta", dtype=torch.int32))
    assert out.shape == (4, W) and out.dtype == torch.float32


def test_empty_rows_is_a_no_op():
    state = State(R=2, W=4, V=10, d=2, dtype=torch.float32, seed=5)
    before = state.buffers()
    reference_pack_update(
        state.packed, state.packed_ids, state.weight, state.ids, state.cnt, torch.empty(0, dtype=torch.int64)
    )
    assert torch.equal(state.packed_ids, before[1]) and torch.equal(state.packed, before[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_logits_equal_indexed_logits_up_to_column_order(dtype):
    rng = random.Random(6)
    state = State(R=5, W=24, V=90, d=16, dtype=dtype, seed=6)
    state.packed.fill_(float("nan"))  # dead slots hold garbage; the head must mask them
    reference_pack_update(
        state.packed, state.packed_ids, state.weight, state.ids, state.cnt, state.step(rng, rows=range(5))
    )
    for _ in range(8):
        reference_pack_update(state.packed, state.packed_ids, state.weight, state.ids, state.cnt, state.step(rng))
    M = 11
    hidden = torch.randn(M, 16, generator=torch.Generator().manual_seed(7)).to(dtype)
    row_to_slot = torch.tensor([rng.randrange(5) for _ in range(M)], dtype=torch.int32)
    got = reference_packed_logits(hidden, state.packed, state.cnt, row_to_slot)
    want = reference_indexed_logits(hidden, state.weight, state.ids, state.cnt, row_to_slot)
    assert got.dtype == torch.float32 and got.shape == (M, 24)
    for m in range(M):
        s = int(row_to_slot[m])
        c = int(state.cnt[s])
        assert torch.isinf(got[m, c:]).all() and (got[m, c:] < 0).all()
        col = torch.searchsorted(state.ids[s, :c], state.packed_ids[s, :c])  # packed column j is table column col[j]
        assert torch.equal(state.ids[s, :c][col], state.packed_ids[s, :c])
        torch.testing.assert_close(got[m, :c], want[m, col], rtol=1e-5, atol=1e-5)


def _pack_args(**over):
    R, W, V, d = 3, 6, 10, 4
    base = dict(
        packed=torch.zeros(R, W, d),
        packed_ids=torch.full((R, W), -1, dtype=torch.int32),
        weight=torch.zeros(V, d),
        ids=torch.arange(R * W, dtype=torch.int32).view(R, W) % W,
        cnt=torch.ones(R, dtype=torch.int32),
        rows=torch.tensor([0, 2]),
    )
    base.update(over)
    return base


_PID_GAP = torch.tensor([[3, -1, 4, -1, -1, -1]] * 3, dtype=torch.int32)
_BAD_PACK = [
    (dict(packed=torch.zeros(3, 6)), "packed must be \\[R, W, d\\], got shape \\(3, 6\\)"),
    (dict(weight=torch.zeros(10, 5)), "packed has d=4 but weight has d=5"),
    (dict(weight=torch.zeros(10)), "weight must be \\[V, d\\]"),
    (dict(weight=torch.zeros(10, 4, dtype=torch.float16)), "weight dtype torch.float16 must equal packed dtype"),
    (
        dict(packed=torch.zeros(3, 6, 4, dtype=torch.int32), weight=torch.zeros(10, 4, dtype=torch.int32)),
        "packed dtype torch.int32 must be one of",
    ),
    (dict(packed_ids=torch.full((3, 6), -1)), "packed_ids must be int32 \\[R=3, W=6\\], got torch.int64"),
    (dict(packed_ids=torch.full((3, 5), -1, dtype=torch.int32)), "packed_ids must be int32 \\[R=3, W=6\\]"),
    (dict(ids=torch.zeros(3, 7, dtype=torch.int32)), "ids must be int32 \\[R=3, W=6\\], got torch.int32 \\(3, 7\\)"),
    (dict(cnt=torch.ones(2, dtype=torch.int32)), "cnt must be int32 \\[R=3\\]"),
    (dict(rows=torch.tensor([0, 1], dtype=torch.int32)), "rows must be int64 \\[B\\], got torch.int32"),
    (dict(rows=torch.tensor([[0]])), "rows must be int64 \\[B\\]"),
    (dict(rows=torch.tensor([0, 3])), "rows must be in \\[0, R=3\\)"),
    (dict(rows=torch.tensor([-1])), "rows must be in \\[0, R=3\\)"),
    (dict(rows=torch.tensor([2, 0, 2])), "rows must be distinct"),
    (dict(cnt=torch.tensor([0, 1, 1], dtype=torch.int32)), "cnt\\[rows\\] must be in \\[1, W=6\\]"),
    (dict(cnt=torch.tensor([1, 1, 7], dtype=torch.int32)), "cnt\\[rows\\] must be in \\[1, W=6\\]"),
    (dict(ids=torch.full((3, 6), 10, dtype=torch.int32)), "ids\\[rows, :cnt\\] must be in \\[0, V=10\\)"),
    (
        dict(ids=torch.tensor([[1, 1, 2, 3, 4, 5]] * 3, dtype=torch.int32), cnt=torch.full((3,), 3, dtype=torch.int32)),
        "ids\\[rows, :cnt\\] must be strictly ascending",
    ),
    (dict(packed_ids=_PID_GAP), "packed_ids\\[rows\\] must be live ids >= 0 followed by -1"),
    (dict(packed_ids=torch.full((3, 6), -2, dtype=torch.int32)), "packed_ids\\[rows\\] must be live ids"),
    (dict(packed_ids=torch.full((3, 6), 10, dtype=torch.int32)), "packed_ids\\[rows\\] must be in \\[-1, V=10\\)"),
    (dict(rows=torch.tensor([0], device="meta")), "all tensors must be on one device"),
]


@pytest.mark.parametrize("args,msg", _BAD_PACK)
def test_pack_update_refuses_bad_input(args, msg):
    with pytest.raises(ValueError, match="pack_update: " + msg):
        reference_pack_update(**_pack_args(**args))


def test_bad_rows_not_listed_are_not_checked():
    """Values are checked on the listed rows only: row 1's table and packed ids may be anything, and stay as they
    were; the listed rows are updated as stated (each gets its set {0}: id 0 with weight row 0)."""
    from sglang_specvocab.ops import _ext

    ids = torch.arange(18, dtype=torch.int32).view(3, 6) % 6
    ids[1] = 99
    pid = torch.full((3, 6), -1, dtype=torch.int32)
    pid[1, 2] = 5
    weight = torch.arange(40, dtype=torch.float32).view(10, 4) + 1
    ops = [reference_pack_update] + ([torch.ops.specvocab.pack_update] if _ext.available() else [])
    for op in ops:
        args = _pack_args(ids=ids, packed_ids=pid.clone(), weight=weight)
        op(*args.values())
        want_ids = torch.full((3, 6), -1, dtype=torch.int32)
        want_ids[0, 0] = want_ids[2, 0] = 0
        want_ids[1, 2] = 5  # untouched
        want = torch.zeros(3, 6, 4)
        want[0, 0] = want[2, 0] = weight[0]
        assert torch.equal(args["packed_ids"], want_ids), op
        assert torch.equal(args["packed"], want), op
        literal = _pack_args(ids=ids, packed_ids=pid.clone(), weight=weight)
        literal_pack_update(*literal.values())
        assert torch.equal(literal["packed_ids"], want_ids) and torch.equal(literal["packed"], want)


@pytest.mark.parametrize(
    "args,msg",
    [
        (dict(hidden=torch.zeros(2, 3, 4)), "hidden must be \\[M, d\\]"),
        (dict(packed=torch.zeros(3, 6)), "packed must be \\[R, W, d\\]"),
        (dict(packed=torch.zeros(3, 6, 5)), "hidden has d=4 but packed has d=5"),
        (dict(packed=torch.zeros(3, 6, 4, dtype=torch.float16)), "packed dtype torch.float16 must equal hidden dtype"),
        (dict(cnt=torch.ones(2, dtype=torch.int32)), "cnt must be int32 \\[R=3\\]"),
        (
            dict(row_to_slot=torch.zeros(3, dtype=torch.int32)),
            "row_to_slot must be int32 or int64 \\[B\\] with B dividing M=2",
        ),
    ],
)
def test_packed_logits_refuses_bad_input(args, msg):
    base = dict(
        hidden=torch.zeros(2, 4),
        packed=torch.zeros(3, 6, 4),
        cnt=torch.ones(3, dtype=torch.int32),
        row_to_slot=torch.zeros(2, dtype=torch.int32),
    )
    base.update(args)
    with pytest.raises(ValueError, match="packed_logits: " + msg):
        reference_packed_logits(**base)


@pytest.mark.parametrize(
    "args,msg",
    [
        (dict(cnt=torch.tensor([1, 0, 1], dtype=torch.int32)), "cnt must be in [1, W=6], got cnt[1] = 0 (the slot"),
        (
            dict(row_to_slot=torch.tensor([3, 0], dtype=torch.int32)),
            "row_to_slot must be in [0, R=3), got row_to_slot[0] = 3",
        ),
    ],
)
def test_packed_logits_reads_bad_table_values_as_minus_inf_and_refuses_them_under_debug(args, msg):
    """A bad count or slot is read as a row with no live column and counted (ops/checks.py); the debug setting
    refuses it instead."""
    from sglang_specvocab import ops
    from sglang_specvocab.ops import checks

    base = dict(
        hidden=torch.ones(2, 4),
        packed=torch.ones(3, 6, 4),
        cnt=torch.ones(3, dtype=torch.int32),
        row_to_slot=torch.tensor([1, 0], dtype=torch.int32),
    )
    base.update(args)
    bad = torch.zeros((), dtype=torch.int64)
    out = reference_packed_logits(**base, bad=bad)
    assert torch.isneginf(out[0]).all() and int(bad) == 1  # the first hidden row reads the bad entry
    assert out[1].tolist() == [4.0] + [float("-inf")] * 5
    was = checks.debug_checks()
    ops.set_debug_checks(True)
    try:
        with pytest.raises(ValueError, match=re.escape("packed_logits: " + msg)):
            reference_packed_logits(**base)
    finally:
        ops.set_debug_checks(was)


# --- The compiled op (csrc/pack_update.cpp, .cu), once the extension is built --------------------


def _compiled_matches_reference(device, dtypes, shapes, steps):
    op = torch.ops.specvocab.pack_update
    for dtype in dtypes:
        for R, W, V, d in shapes:
            rng = random.Random(R * 1000 + W + d)
            state = State(R, W, V, d, dtype, seed=W)
            dev = tuple(t.to(device) for t in state.buffers())
            for _ in range(steps):
                rows = state.step(rng)
                if rng.random() < 0.3:
                    state.new_weight()
                reference_pack_update(state.packed, state.packed_ids, state.weight, state.ids, state.cnt, rows)
                op(*dev, state.weight.to(device), state.ids.to(device), state.cnt.to(device), rows.to(device))
                assert torch.equal(dev[1].cpu(), state.packed_ids), (dtype, R, W, V, d)
                assert torch.equal(bits(dev[0].cpu()), bits(state.packed)), (dtype, R, W, V, d)


_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


# Before the CPU tests: on the first GPU machine test_cpu_op_matches_reference crashed the process (see
# test_cpu_op_in_a_16_thread_process), and a crash must not take this file's only GPU test with it.
@pytest.mark.gpu
def test_cuda_op_matches_reference():
    from sglang_specvocab.ops import _ext

    if not _ext.available():
        pytest.skip("the specvocab extension is not built")
    shapes = [
        (4, 9, 30, 3),  # rows of 12 / 6 bytes: the scalar copy path
        (5, 40, 130, 8),  # rows of 32 / 16 bytes: 16-byte vectors
        (3, 3000, 520_000, 8),  # W over several scan chunks, a vocab bitmap over 48 KB of shared memory
        (2, 1, 3, 1),
    ]
    _compiled_matches_reference("cuda", _DTYPES, shapes, steps=6)


def test_cpu_op_matches_reference():
    from sglang_specvocab.ops import _ext

    if not _ext.available():
        pytest.skip("the specvocab extension is not built")
    _compiled_matches_reference("cpu", _DTYPES, [(4, 9, 30, 3), (5, 40, 130, 8), (2, 1, 3, 1)], steps=12)
    for args, msg in _BAD_PACK[:-1]:  # the compiled op checks values on the CPU too, with the same messages
        msg = msg.split(", got")[0].replace("torch.float16", "Half").replace("torch.int32", "Int")  # c10's names
        with pytest.raises(RuntimeError, match="pack_update: " + msg):
            torch.ops.specvocab.pack_update(*_pack_args(**args).values())
    # Every listed row is checked before any is written: a refused call changes nothing.
    state = State(R=3, W=6, V=20, d=2, dtype=torch.float32, seed=8)
    state.step(random.Random(8), rows=[0, 2])
    state.ids[2, :2] = torch.tensor([5, 5], dtype=torch.int32)
    state.cnt[2] = 2
    before = state.buffers()
    with pytest.raises(RuntimeError, match="pack_update: ids\\[rows, :cnt\\] must be strictly ascending"):
        torch.ops.specvocab.pack_update(
            state.packed, state.packed_ids, state.weight, state.ids, state.cnt, torch.tensor([0, 2])
        )
    assert torch.equal(state.packed_ids, before[1]) and torch.equal(state.packed, before[0])


def test_cpu_op_in_a_16_thread_process():
    """The op of test_cpu_op_matches_reference, plus the CUDA test's largest shape, in a child with 16 threads.

    The GPU machine (16 cores, torch 2.11) reported a segfault in test_cpu_op_matches_reference that
    2 to 64 threads, valgrind and an ASan/UBSan build (torch 2.11 and 2.13) do not show here. In a
    child, a crash is this test's failure with the child's faulthandler trace, not the end of the run.
    """
    from sglang_specvocab.ops import _ext

    if not _ext.available():
        pytest.skip("the specvocab extension is not built")
    code = (
        "import sys, torch; torch.set_num_threads(16); sys.path.insert(0, sys.argv[1]); import test_packed as t; "
        "t.test_cpu_op_matches_reference(); "
        "t._compiled_matches_reference('cpu', t._DTYPES[:1], [(3, 3000, 520_000, 8)], steps=6)"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "16"}
    run = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", code, str(Path(__file__).parent)],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, f"child exit {run.returncode}\n{run.stdout[-2000:]}\n{run.stderr[-6000:]}"
