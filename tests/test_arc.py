"""BatchedARC against a literal, per-request ARC written straight from the paper's pseudo-code."""

import random

import pytest
import torch
from helpers import pad
from hypothesis import given, settings
from hypothesis import strategies as st
from literal import LiteralARC

from sglang_specvocab.policies.arc import BatchedARC

CAPACITIES = [1, 2, 3, 5, 8]


def check(arc, lit, rows_n):
    """Every row: the four lists in recency order, p bit for bit, members and contains."""
    all_rows = torch.arange(rows_n)
    mem = arc.members(all_rows)
    assert mem.shape == (rows_n, arc.capacity) and mem.dtype == torch.int64
    probe = torch.arange(-1, 3 * arc.capacity + 2).repeat(rows_n, 1)
    got_contains = arc.contains(all_rows, probe)
    for r in range(rows_n):
        assert arc.lists(r) == lit[r].lists(), f"row {r}"
        sizes = [len(v) for v in lit[r].lists().values()]
        assert arc.cnt[r, 1:].tolist() == sizes, f"row {r}"  # the incremental list sizes (T1, T2, B1, B2)
        assert arc.p[r].item() == lit[r].p, f"row {r}"
        ids = [t for t in mem[r].tolist() if t >= 0]
        assert ids == sorted(lit[r].members())
        assert mem[r].tolist()[len(ids) :] == [-1] * (arc.capacity - len(ids))
        assert got_contains[r].tolist() == [t in lit[r].members() for t in probe[r].tolist()]


def run_ops(arc, lit, rows_n, ops):
    for kind, rows, cols in ops:
        t_rows = torch.tensor(rows, dtype=torch.int64)
        if kind == "reset":
            arc.reset(t_rows)
            for r in rows:
                lit[r] = LiteralARC(arc.capacity)
        else:
            width = max(len(col) for col in cols)
            arc.access(t_rows, pad(cols, width))
            for r, col in zip(rows, cols, strict=True):
                for t in col + [-1] * (width - len(col)):
                    if t >= 0:
                        lit[r].access(t)
        check(arc, lit, rows_n)


# -- exact cases, checkable by hand ------------------------------------------------------------


def test_capacity_2_b1_ghost_hit_raises_p():
    arc = BatchedARC(1, 2)
    row = torch.tensor([0])
    # 1, 2 fill T1. 3: Case IV(A) (|T1|+|B1| = 2 = c, |T1| = c) drops 1 outright.
    arc.access(row, torch.tensor([[1, 2, 3]]))
    assert arc.lists(0) == {"T1": [2, 3], "T2": [], "B1": [], "B2": []}
    # 2 hits T1 (Case I) -> T2. 4: Case IV(B) (total 2 >= c): REPLACE, |T1| = 1 > p = 0, so 3 -> B1.
    arc.access(row, torch.tensor([[2, 4]]))
    assert arc.lists(0) == {"T1": [4], "T2": [2], "B1": [3], "B2": []}
    assert arc.p.tolist() == [0.0]
    # 3 is a B1 ghost (Case II): p = min(0 + max(0/1, 1), 2) = 1; REPLACE: |T1| = 1 > 1 is false,
    # so LRU of T2 (2) -> B2; 3 -> MRU of T2.
    arc.access(row, torch.tensor([[3]]))
    assert arc.lists(0) == {"T1": [4], "T2": [3], "B1": [], "B2": [2]}
    assert arc.p.tolist() == [1.0]
    assert arc.members(row).tolist() == [[3, 4]]
    # 2 is a B2 ghost (Case III): p = max(1 - max(0/1, 1), 0) = 0; REPLACE: |T1| = 1 > 0, 4 -> B1.
    arc.access(row, torch.tensor([[2]]))
    assert arc.lists(0) == {"T1": [], "T2": [3, 2], "B1": [4], "B2": []}
    assert arc.p.tolist() == [0.0]


def test_b2_hit_with_t1_equal_to_p_takes_the_tie_branch():
    """REPLACE's tie rule: x in B2 and |T1| == p demotes the LRU of T1, not of T2."""
    arc = BatchedARC(1, 3)
    row = torch.tensor([0])
    # 1, 1 -> T2 = [1]; 2, 3 -> T1 = [2, 3]; total = 3 = c.
    # 4: Case IV(B), REPLACE: |T1| = 2 > p = 0 -> 2 to B1.
    arc.access(row, torch.tensor([[1, 1, 2, 3, 4]]))
    assert arc.lists(0) == {"T1": [3, 4], "T2": [1], "B1": [2], "B2": []}
    # 2: Case II, p = 0 + max(0/1, 1) = 1; REPLACE: |T1| = 2 > 1 -> 3 to B1; 2 -> T2.
    arc.access(row, torch.tensor([[2]]))
    assert arc.lists(0) == {"T1": [4], "T2": [1, 2], "B1": [3], "B2": []}
    assert arc.p.item() == 1.0
    # 3: Case II, p = 1 + 1 = 2; REPLACE: |T1| = 1 > 2 false -> 1 (LRU of T2) to B2; 3 -> T2.
    arc.access(row, torch.tensor([[3]]))
    assert arc.lists(0) == {"T1": [4], "T2": [2, 3], "B1": [], "B2": [1]}
    assert arc.p.item() == 2.0
    # 1: Case III, p = 2 - max(0/1, 1) = 1 = |T1| and 1 is in B2: the tie -> 4 (LRU of T1) to B1.
    # (Without the tie rule, 2 would go to B2 instead.)
    arc.access(row, torch.tensor([[1]]))
    assert arc.lists(0) == {"T1": [], "T2": [2, 3, 1], "B1": [4], "B2": []}
    assert arc.p.item() == 1.0


def test_capacity_1():
    arc = BatchedARC(2, 1)
    arc.access(torch.tensor([0, 1]), torch.tensor([[5, 6, 5], [7, 7, -1]]))
    # row 0: 5 -> T1; 6: IV(A) with |T1| = c -> 5 dropped (no ghost); 5: IV(A) again -> 6 dropped.
    assert arc.lists(0) == {"T1": [5], "T2": [], "B1": [], "B2": []}
    # row 1: 7 -> T1, 7 hit -> T2; -1 is a no-op.
    assert arc.lists(1) == {"T1": [], "T2": [7], "B1": [], "B2": []}
    assert arc.members(torch.tensor([1, 0])).tolist() == [[7], [5]]
    got = arc.contains(torch.tensor([0, 1]), torch.tensor([[5, 6, -1], [7, 5, -3]]))
    assert got.tolist() == [[True, False, False], [True, False, False]]


def test_negative_tokens_are_no_ops_and_reset_empties():
    arc = BatchedARC(3, 2)
    rows = torch.tensor([2, 0])
    # row 2: 1 -> T2, 2 -> T1; 3: Case IV(B), |T1| = 1 > p = 0 -> 2 to B1. Row 0 sees only no-ops.
    arc.access(rows, torch.tensor([[1, -1, 1, 2, 3], [-1, -1, -1, -1, -1]]))
    assert arc.lists(2) == {"T1": [3], "T2": [1], "B1": [2], "B2": []}
    assert arc.lists(0) == {"T1": [], "T2": [], "B1": [], "B2": []}
    before = (arc.ids.clone(), arc.key.clone(), arc.cnt.clone(), arc.p.clone())
    arc.access(rows, torch.full((2, 3), -1))
    for a, b in zip(before, (arc.ids, arc.key, arc.cnt, arc.p), strict=True):
        assert torch.equal(a, b)
    arc.access(torch.tensor([2]), torch.tensor([[2]]))  # 2 is a B1 ghost: p = 0 + max(0/1, 1)
    assert arc.p[2].item() == 1.0
    arc.reset(torch.tensor([2]))
    assert arc.lists(2) == {"T1": [], "T2": [], "B1": [], "B2": []}
    assert arc.p[2].item() == 0.0
    assert arc.members(torch.tensor([2])).tolist() == [[-1, -1]]


def test_empty_column_block_is_a_no_op():
    arc = BatchedARC(2, 3)
    arc.access(torch.tensor([0, 1]), torch.zeros((2, 0), dtype=torch.int64))
    assert arc.contains(torch.tensor([0]), torch.zeros((1, 0), dtype=torch.int64)).shape == (1, 0)


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, None])
def test_bad_capacity(bad):
    with pytest.raises(ValueError, match=rf"capacity = {bad!r}"):
        BatchedARC(4, bad)


@pytest.mark.parametrize("bad", [0, -1, 1.0])
def test_bad_num_rows(bad):
    with pytest.raises(ValueError, match=rf"num_rows = {bad!r}"):
        BatchedARC(bad, 4)


def test_bad_token_shapes():
    arc = BatchedARC(2, 2)
    with pytest.raises(ValueError, match="tokens"):
        arc.access(torch.tensor([0, 1]), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="tokens"):
        arc.access(torch.tensor([0, 1]), torch.tensor([[1.0], [2.0]]))
    with pytest.raises(ValueError, match="rows"):
        arc.access(torch.tensor([[0]]), torch.tensor([[1]]))


# -- no host sync ------------------------------------------------------------------------------


def test_no_host_sync_on_meta_device():
    """On the meta device there is no data: any .item()/.tolist()/bool(tensor) would raise."""
    meta = torch.device("meta")
    arc = BatchedARC(6, 4, device=meta)
    rows = torch.tensor([0, 3, 5], device=meta)
    arc.reset(rows)
    arc.access(rows, torch.zeros((3, 7), dtype=torch.int64, device=meta))
    arc.access(rows, torch.zeros((3, 2), dtype=torch.int32, device=meta))
    mem = arc.members(rows)
    got = arc.contains(rows, torch.zeros((3, 5), dtype=torch.int64, device=meta))
    assert mem.device == meta and mem.shape == (3, 4) and mem.dtype == torch.int64
    assert got.device == meta and got.shape == (3, 5) and got.dtype == torch.bool
    assert arc.p.device == meta and arc.key.shape == (6, 8)


def test_memory_is_independent_of_vocabulary():
    arc = BatchedARC(3, 5)
    arc.access(torch.tensor([0, 1, 2]), torch.tensor([[10**12], [7], [2**40]]))
    for t in (arc.ids, arc.key):
        assert t.shape == (3, 10)
    assert arc.contains(torch.tensor([0, 2]), torch.tensor([[10**12], [2**40]])).tolist() == [[True], [True]]


# -- fuzz --------------------------------------------------------------------------------------


def random_ops(rng, rows_n, cap, steps):
    vocab = 3 * cap + 1  # small: forces ghost hits in B1 and B2
    ops = []
    for _ in range(steps):
        rows = rng.sample(range(rows_n), rng.randint(1, rows_n))
        if rng.random() < 0.06:
            ops.append(("reset", rows, None))
            continue
        width = rng.randint(1, 6)
        cols = [
            [rng.randrange(vocab) if rng.random() > 0.15 else -1 for _ in range(rng.randint(0, width))] for _ in rows
        ]
        if all(len(col) == 0 for col in cols):
            cols[0] = [rng.randrange(vocab)]
        ops.append(("access", rows, cols))
    return ops


@pytest.mark.parametrize("cap", CAPACITIES)
def test_seeded_fuzz_matches_literal(cap):
    rng = random.Random(1000 + cap)
    rows_n = 4
    arc = BatchedARC(rows_n, cap)
    lit = {r: LiteralARC(cap) for r in range(rows_n)}
    run_ops(arc, lit, rows_n, random_ops(rng, rows_n, cap, 500))


def test_seeded_fuzz_reaches_every_case():
    """The fuzz distribution really exercises ghost hits, both REPLACE branches and the tie rule."""
    seen = set()

    class Probe(LiteralARC):
        def replace(self, x):
            from_t1 = self.T1 and ((x in self.B2 and len(self.T1) == self.p) or len(self.T1) > self.p)
            if self.T1 and x in self.B2 and len(self.T1) == self.p:
                seen.add("tie")
            seen.add("replace T1" if from_t1 else "replace T2")
            super().replace(x)

        def access(self, x):
            for name, lst in (("B1 hit", self.B1), ("B2 hit", self.B2), ("T hit", self.T1 | self.T2)):
                if x in lst:
                    seen.add(name)
            miss = x not in (self.T1 | self.T2 | self.B1 | self.B2)
            l1, total = len(self.T1) + len(self.B1), len(self.T1) + len(self.T2) + len(self.B1) + len(self.B2)
            if miss and l1 == self.c:
                seen.add("IV(A) drop T1" if len(self.T1) == self.c else "IV(A) drop B1")
            if miss and l1 != self.c and total == 2 * self.c:
                seen.add("IV(B) drop B2")
            super().access(x)
            if self.p != int(self.p):
                seen.add("fractional p")

    for cap in CAPACITIES:
        rng = random.Random(1000 + cap)
        lit = {r: Probe(cap) for r in range(4)}
        for kind, rows, cols in random_ops(rng, 4, cap, 500):
            for r, col in zip(rows, cols or [], strict=False):
                if kind == "access":
                    for t in col:
                        if t >= 0:
                            lit[r].access(t)
            if kind == "reset":
                for r in rows:
                    lit[r] = Probe(cap)
    assert seen >= {
        "B1 hit",
        "B2 hit",
        "T hit",
        "replace T1",
        "replace T2",
        "tie",
        "IV(A) drop T1",
        "IV(A) drop B1",
        "IV(B) drop B2",
        "fractional p",
    }, seen


@settings(max_examples=120)
@given(data=st.data())
def test_hypothesis_matches_literal(data):
    cap = data.draw(st.sampled_from(CAPACITIES))
    rows_n = data.draw(st.integers(1, 5))
    vocab = data.draw(st.integers(1, 3 * cap + 1))
    arc = BatchedARC(rows_n, cap)
    lit = {r: LiteralARC(cap) for r in range(rows_n)}
    ops = []
    for _ in range(data.draw(st.integers(1, 12))):
        rows = data.draw(st.lists(st.integers(0, rows_n - 1), min_size=1, max_size=rows_n, unique=True))
        if data.draw(st.integers(0, 9)) == 0:
            ops.append(("reset", rows, None))
        else:
            tok = st.one_of(st.integers(0, vocab - 1), st.just(-1))
            ops.append(("access", rows, [data.draw(st.lists(tok, min_size=1, max_size=8)) for _ in rows]))
    run_ops(arc, lit, rows_n, ops)
