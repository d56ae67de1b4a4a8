"""Candidate-table entries that break the table's contract (a slot outside [0, R), a count outside [1, W], an id >= V)
read alike on every backend that runs here (the torch reference, the C++ CPU kernels, Triton under the interpreter):
-inf logits where they would give columns, the same count added to the int64 counter, and under the debug setting
(``SGLANG_DYNVOCAB_DEBUG_CHECKS``) the same ValueError; plus the ``rows`` the in-place updates trust.

Triton runs in one child process under ``TRITON_INTERPRET=1`` (as in test_triton_ops.py), started with the debug
variable set, so it also shows the variable is read once at import. Run as a script, this file is that child:
``TRITON_INTERPRET=1 SGLANG_DYNVOCAB_DEBUG_CHECKS=1 python tests/test_bad_entries.py OUT.pt``.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import run_interpreted
from literal import literal_table_reads  # the child finds it too: a script's folder is on sys.path

from sglang_specvocab import ops
from sglang_specvocab.head import DraftHead, head_options
from sglang_specvocab.ops import _ext, checks
from sglang_specvocab.ops.compact_topk import reference_compact_topk
from sglang_specvocab.ops.indexed_logits import (
    reference_indexed_logits,
    reference_packed_logits,
    triton_indexed_logits,
    triton_packed_logits,
)
from sglang_specvocab.ops.pack_update import reference_pack_update
from sglang_specvocab.ops.window_update import reference_window_update
from sglang_specvocab.ops.window_verify import WindowRound, reference_window_verify
from sglang_specvocab.table import CandidateTable, head_reads

# the torch and Triton backends of the ops, by op name, as torch.ops.specvocab holds the compiled ones
reference = SimpleNamespace(
    indexed_logits=reference_indexed_logits,
    packed_logits=reference_packed_logits,
    window_update=reference_window_update,
    pack_update=reference_pack_update,
)
triton = SimpleNamespace(indexed_logits=triton_indexed_logits, packed_logits=triton_packed_logits)

REPO = Path(__file__).resolve().parents[1]

R, W, D, V = 5, 6, 8, 20
# hidden rows: runs of one slot (a request's branches) and slots shared between runs
SLOTS = [0, 0, 1, 2, 2, 2, 3, 4, 1]
KINDS = {  # name -> what breaks (the count and messages below are the literal expectation)
    "valid": {},
    "slot_high": {"slot": {2: R, 7: 1 << 30}},
    "slot_negative": {"slot": {0: -1}},
    "cnt_zero": {"cnt": {2: 0}},
    "cnt_negative": {"cnt": {3: -3}},
    "cnt_above_w": {"cnt": {2: W + 4}},
    "id_at_v": {"ids": {(1, 2): V}},
    "id_far": {"ids": {(3, 0): 1 << 30, (3, 1): V + 1}},
    "id_past_count": {"ids": {(4, W - 1): V + 5}},  # past cnt[4]: never read, not counted
    "everything": {
        "slot": {8: -7},
        "cnt": {0: 0, 2: W + 1},
        "ids": {(1, 0): V, (2, 5): V + 2, (3, 4): -1},
    },
}
EXPECTED_BAD = {  # indexed, packed
    "valid": (0, 0),
    "slot_high": (2, 2),
    "slot_negative": (1, 1),
    "cnt_zero": (3, 3),  # slot 2 has three hidden rows
    "cnt_negative": (1, 1),
    "cnt_above_w": (3, 3),
    "id_at_v": (2, 0),  # slot 1: hidden rows 2 and 8
    "id_far": (2, 0),
    "id_past_count": (0, 0),
    "everything": (2 + 3 + 1 + 1 + 3, 2 + 3 + 1),  # cnt[0]: 2 rows, cnt[2]: 3, ids[1, 0]: 1 row, slot: 1; ids[2, 5]: 3
}
DEBUG_MESSAGES = {  # indexed; packed reads no ids
    "slot_high": "row_to_slot must be in [0, R=5), got row_to_slot[2] = 5",
    "slot_negative": "row_to_slot must be in [0, R=5), got row_to_slot[0] = -1",
    "cnt_zero": "cnt must be in [1, W=6], got cnt[2] = 0 (the slot of hidden row 3)",
    "cnt_negative": "cnt must be in [1, W=6], got cnt[3] = -3 (the slot of hidden row 6)",
    "cnt_above_w": "cnt must be in [1, W=6], got cnt[2] = 10 (the slot of hidden row 3)",
    "id_at_v": "ids must be below V=20 (a negative id is a dead column), got ids[1, 2] = 20 (a live column of hidden "
    "row 2)",
    "id_far": "ids must be below V=20 (a negative id is a dead column), got ids[3, 0] = 1073741824 (a live column of "
    "hidden row 6)",
    "everything": "cnt must be in [1, W=6], got cnt[0] = 0 (the slot of hidden row 0)",
}
OPS = ("indexed_logits", "packed_logits")


def case(kind: str):
    """(hidden, weight, ids, cnt, row_to_slot, packed) for one kind; small integers: every dot product is exact in
    fp32, so the backends agree bitwise."""
    g = torch.Generator().manual_seed(3)
    weight = torch.randint(-3, 4, (V, D), generator=g).float()
    hidden = torch.randint(-3, 4, (len(SLOTS), D), generator=g).float()
    ids = torch.stack([torch.randperm(V, generator=g)[:W].sort().values for _ in range(R)]).to(torch.int32)
    cnt = torch.tensor([W, 4, 5, 2, 3], dtype=torch.int32)
    slot = torch.tensor(SLOTS, dtype=torch.int32)
    change = KINDS[kind]
    for m, s in change.get("slot", {}).items():
        slot[m] = s
    for r, c in change.get("cnt", {}).items():
        cnt[r] = c
    for (r, j), t in change.get("ids", {}).items():
        ids[r, j] = t
    packed = weight[ids.long().clamp(0, V - 1)]  # [R, W, D]: packed rows are read by position, not by id
    return hidden, weight, ids, cnt, slot, packed


def args_of(op: str, kind: str) -> tuple:
    hidden, weight, ids, cnt, slot, packed = case(kind)
    return (hidden, weight, ids, cnt, slot) if op == "indexed_logits" else (hidden, packed, cnt, slot)


def literal(op: str, kind: str):
    hidden, weight, ids, cnt, slot, packed = case(kind)
    if op == "packed_logits":
        return literal_table_reads(hidden, lambda s, j: packed[s, j], cnt, slot, W)

    def rows_of(s, j):
        t = int(ids[s, j])
        return None if t < 0 else ("bad" if t >= V else weight[t])

    return literal_table_reads(hidden, rows_of, cnt, slot, W)


def run(fn, op: str, kind: str):
    """(logits, count) of one backend's function with a fresh counter."""
    bad = torch.zeros((), dtype=torch.int64)
    out = fn(*args_of(op, kind), bad=bad)
    return out, int(bad)


def debug_message(fn, op: str, kind: str) -> str | None:
    """The first line of the ValueError the backend raises under the debug setting, None if it raises none."""
    try:
        fn(*args_of(op, kind))
    except ValueError as exc:
        return str(exc).splitlines()[0]
    return None


def cpu_backends():
    out = [("torch", reference)]
    if _ext.available():
        out.append(("cuda", torch.ops.specvocab))  # its C++ kernels on CPU tensors
    return out


# --- the definition, and every backend against it ---------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_reference_is_the_literal_statement(op, kind):
    want, count = literal(op, kind)
    got, got_count = run(getattr(reference, op), op, kind)
    assert torch.equal(got, want.float())
    assert got_count == count == EXPECTED_BAD[kind][OPS.index(op)]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_cpu_kernels_read_and_count_as_the_reference(op, kind):
    if not _ext.available():
        pytest.skip(_ext.reason())
    want = run(getattr(reference, op), op, kind)
    got = run(getattr(torch.ops.specvocab, op), op, kind)
    assert torch.equal(got[0], want[0]) and got[1] == want[1]
    # without a counter: the same logits
    assert torch.equal(getattr(torch.ops.specvocab, op)(*args_of(op, kind)), want[0])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_backend_refuses_alike_under_the_debug_setting(op, kind, debug):
    want = DEBUG_MESSAGES.get(kind) if op == "indexed_logits" or not kind.startswith("id") else None
    for name, mod in cpu_backends():
        got = debug_message(getattr(mod, op), op, kind)
        assert got == (None if want is None else f"{op}: {want}"), name


def test_the_counter_accumulates_and_is_optional():
    bad = torch.zeros((), dtype=torch.int64)
    args = args_of("indexed_logits", "everything")
    for name, mod in cpu_backends():
        before = int(bad)
        mod.indexed_logits(*args, bad=bad)
        mod.indexed_logits(*args, bad=bad)
        mod.indexed_logits(*args)  # no counter: nothing is added anywhere
        assert int(bad) - before == 2 * EXPECTED_BAD["everything"][0], name
    one = torch.zeros(1, dtype=torch.int64)  # a [1] counter works as well as a 0-d one
    reference.packed_logits(*args_of("packed_logits", "cnt_zero"), bad=one)
    assert one.tolist() == [3]


def test_a_bad_counter_argument_is_refused():
    args = args_of("indexed_logits", "valid")
    for bad in (torch.zeros((), dtype=torch.int32), torch.zeros(2, dtype=torch.int64)):
        with pytest.raises(ValueError, match=re.escape("indexed_logits: bad must be an int64 counter of one element")):
            reference.indexed_logits(*args, bad=bad)
        if _ext.available():
            with pytest.raises(RuntimeError, match=re.escape("bad must be an int64 counter of one element")):
                torch.ops.specvocab.indexed_logits(*args, bad=bad)
    with pytest.raises(ValueError, match="all tensors must be on one device"):
        reference.indexed_logits(*args, bad=torch.zeros((), dtype=torch.int64, device="meta"))


def test_implementation_counts_into_the_device_counter():
    """What the head holds (``ops.implementation``) counts into ``ops.bad_entries(device)``, which telemetry reads."""
    counter = ops.bad_entries("cpu")
    assert counter is ops.bad_entries(torch.device("cpu")) and counter.dtype == torch.int64
    for backend in ops.available_backends("cpu"):
        if backend == "triton":
            continue  # interpreted in the child
        before = int(counter)
        ops.implementation(backend, "cpu", "indexed_logits")(*args_of("indexed_logits", "cnt_zero"))
        ops.packed_logits(*args_of("packed_logits", "slot_high"), backend=backend)
        own = torch.zeros((), dtype=torch.int64)
        ops.indexed_logits(*args_of("indexed_logits", "id_at_v"), backend=backend, bad=own)  # its own counter
        assert int(counter) - before == 3 + 2 and int(own) == 2, backend


def test_the_head_counts_a_broken_table_row():
    """A policy bug that leaves a slot's count at 0: that request's logits are -inf and the device counter says so."""
    weight, hidden = case("valid")[1], case("valid")[0][:6]
    table = CandidateTable(R, W, fallback_id=1)
    table.assign(torch.arange(R), torch.arange(R * W).view(R, W) % V)
    table.cnt[3] = 0
    counter = ops.bad_entries("cpu")
    for kernel in ("torch", "cuda") if _ext.available() else ("torch",):
        before = int(counter)
        logits = DraftHead(weight, table, head=head_options(kernel=kernel, batch="per-request"))(
            hidden, torch.tensor([0, 3, 1])
        ).logits
        assert torch.isneginf(logits[2:4]).all() and torch.isfinite(logits[:2, 0]).all()
        assert int(counter) - before == 2, kernel  # request 1 has two hidden rows


def test_meta_tensors_count_without_reading_values(debug):
    """On meta nothing can be read (no sync anywhere): the ops run, even under the debug setting."""
    args = tuple(t.to("meta") for t in args_of("indexed_logits", "everything"))
    bad = torch.zeros((), dtype=torch.int64, device="meta")
    assert reference.indexed_logits(*args, bad=bad).shape == (len(SLOTS), W)
    if _ext.available():
        assert torch.ops.specvocab.indexed_logits(*args, bad=bad).shape == (len(SLOTS), W)


# --- the head: one rule on every plan and backend -----------------------------------------------------------------

PLANS = ("per-request", "union-indexed", "union-gemm", "stock")
TABLE_PLANS = PLANS[:3]  # stock reads no table: nothing to count or refuse
HEAD_ROWS = [0, 1, 2, 3, 4, 1]  # the requests' slots (request-major), slot 1 twice
PER, K, FALLBACK = 2, 4, 1  # hidden rows a request, top-k, the table's fallback id
HEAD_KINDS = {  # KINDS by request b (rows[b]) and table slot, with the head's own cases; the literal expectation below
    **KINDS,
    "slot_high": {"slot": {2: R, 4: 1 << 40}},  # an int64 slot that an int32 cast would wrap to 0
    "id_negative": {"ids": {(1, 0): -1}},  # a dead column by design (see ops/checks.py), not counted
    "everything": {**KINDS["everything"], "slot": {5: -7}, "ids": {(1, 0): V, (2, 5): V + 2, (3, 1): -1}},
}
HEAD_BAD = {  # per table plan (stock: 0); two hidden rows a request
    "valid": 0,
    "slot_high": 4,  # requests 2 and 4
    "slot_negative": 2,
    "cnt_zero": 2,
    "cnt_negative": 2,
    "cnt_above_w": 2,  # it reads W columns, all valid ids
    "id_at_v": 4,  # slot 1: requests 1 and 5
    "id_far": 4,  # two bad columns of request 3
    "id_past_count": 0,
    "id_negative": 0,
    "everything": 2 + 2 + 2 + 2 + 2,  # rows[5]; cnt[0]; cnt[2] and its bad column 5 (W read); ids[1, 0] (request 1)
}
HEAD_MESSAGES = {  # under the debug setting, every table plan on every backend
    "slot_high": "DraftHead: rows must be in [0, R=5), got rows[2] = 5",
    "slot_negative": "DraftHead: rows must be in [0, R=5), got rows[0] = -1",
    "cnt_zero": "DraftHead: cnt must be in [1, W=6], got cnt[2] = 0 (the slot of hidden row 4)",
    "cnt_negative": "DraftHead: cnt must be in [1, W=6], got cnt[3] = -3 (the slot of hidden row 6)",
    "cnt_above_w": "DraftHead: cnt must be in [1, W=6], got cnt[2] = 10 (the slot of hidden row 4)",
    "id_at_v": "DraftHead: ids must be below V=20 (a negative id is a dead column), got ids[1, 2] = 20 (a live column "
    "of hidden row 2)",
    "id_far": "DraftHead: ids must be below V=20 (a negative id is a dead column), got ids[3, 0] = 1073741824 (a live "
    "column of hidden row 6)",
    "everything": "DraftHead: cnt must be in [1, W=6], got cnt[0] = 0 (the slot of hidden row 0)",
}


def head_case(kind: str):
    """(weight, table, rows, hidden) for one kind: the table of ``case`` (sorted sets, so column order is id order
    in every plan) broken as ``HEAD_KINDS`` says; small integers, so every plan's logits agree bitwise."""
    _, weight, ids, cnt, _, _ = case("valid")
    table = CandidateTable.over(ids, cnt, fallback_id=FALLBACK)
    rows = torch.tensor(HEAD_ROWS, dtype=torch.int64)  # SGLang's req_pool_indices
    change = HEAD_KINDS[kind]
    for b, s in change.get("slot", {}).items():
        rows[b] = s
    for r, c in change.get("cnt", {}).items():
        cnt[r] = c
    for (r, j), t in change.get("ids", {}).items():
        ids[r, j] = t
    hidden = torch.randint(-3, 4, (len(HEAD_ROWS) * PER, D), generator=torch.Generator().manual_seed(5)).float()
    return weight, table, rows, hidden


def literal_head(kind: str, plan: str):
    """The head's top-k ``[(value, token)] * K`` per hidden row and its bad-entry count, as stated: a table plan reads
    each request's set as ``literal_table_reads`` does, stock every head row; best value first, then the lower id;
    past the live columns ``(-inf, FALLBACK)``."""
    weight, table, rows, hidden = head_case(kind)
    ids = table.ids
    slot = rows.repeat_interleave(PER)
    if plan == "stock":
        scored = [[(float(weight[t].double() @ h.double()), t) for t in range(V)] for h in hidden]
        count = 0
    else:

        def rows_of(s, j):
            t = int(ids[s, j])
            return None if t < 0 else ("bad" if t >= V else weight[t])

        out, count = literal_table_reads(hidden, rows_of, table.cnt, slot, W)
        scored = [
            [(float(out[m, j]), int(ids[int(slot[m]), j])) for j in range(W) if out[m, j] > float("-inf")]
            for m in range(len(hidden))
        ]
    top = []
    for row in scored:
        row = sorted(row, key=lambda p: (-p[0], p[1]))[:K]
        top.append(row + [(float("-inf"), FALLBACK)] * (K - len(row)))
    return top, count


def head_kernels():
    return ["torch"] + (["cuda"] if _ext.available() else [])


def head_message(kind: str, plan: str, kernel: str) -> str | None:
    """The ValueError of one head call under the debug setting, None if it raises none."""
    weight, table, rows, hidden = head_case(kind)
    try:
        DraftHead(weight, table, head=head_options(kernel=kernel, batch=plan))(hidden, rows).topk(K)
    except ValueError as exc:
        return str(exc)
    return None


def head_run(kind: str, plan: str, kernel: str, fused: bool = True):
    """(top-k as ``[(value, token)]`` rows, probabilities, bad entries counted) of one head call."""
    weight, table, rows, hidden = head_case(kind)
    head = DraftHead(weight, table, head=head_options(kernel=kernel, batch=plan))
    counter = ops.bad_entries("cpu")
    before = int(counter)
    out = head(hidden, rows)
    count = int(counter) - before
    if not fused:
        out.topk_op = None  # the torch top-k: column_tokens and local_topk
    values, tokens = out.topk(K)
    probs, prob_tokens = out.topk_probs(K)
    assert torch.equal(prob_tokens, tokens)
    top = [list(zip(v, t)) for v, t in zip(values.tolist(), tokens.tolist())]
    return top, probs, count


@pytest.mark.parametrize("fused", [True, False], ids=["compact_topk", "torch_topk"])
@pytest.mark.parametrize("kernel", ["torch", "cuda"])
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("kind", sorted(HEAD_KINDS))
def test_every_plan_reads_and_counts_bad_entries_as_stated(kind, plan, kernel, fused):
    """A bad slot, count or id never raises on any plan or backend: the request reads what ``table.head_reads``
    says (nothing for a bad slot or a count <= 0, W columns for a count > W, a bad id as a dead column), its
    top-k past its live columns is the fallback id with probability 0, and the device counter adds the same count
    (stock reads no table: nothing)."""
    if kernel == "cuda" and not _ext.available():
        pytest.skip(_ext.reason())
    want, want_count = literal_head(kind, plan)
    got, probs, count = head_run(kind, plan, kernel, fused)
    assert got == want
    assert count == want_count == (0 if plan == "stock" else HEAD_BAD[kind])
    dead = torch.tensor([[v == float("-inf") for v, _ in row] for row in want])
    assert torch.all(probs[dead] == 0) and torch.all(probs[~dead] > 0)


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("kind", sorted(HEAD_KINDS))
def test_every_plan_refuses_alike_under_the_debug_setting(kind, plan, debug):
    want = None if plan == "stock" else HEAD_MESSAGES.get(kind)
    for kernel in head_kernels():
        assert head_message(kind, plan, kernel) == want, (plan, kernel)


def test_compact_topk_reads_a_bad_slot_as_no_token_on_every_backend():
    """The top-k's map row of a request with a bad slot (outside [0, R)) is never read: its entries are the fallback
    id, their values as the logits say; on the CPU it was refused, on a GPU read out of bounds."""
    logits = torch.tensor([[0.5, 2.0, -1.0], [1.0, float("-inf"), 3.0], [0.0, 1.0, 2.0], [2.0, 1.0, 0.0]])
    col_ids = torch.tensor([[10, 11, 12], [20, 21, 22]], dtype=torch.int32)
    for rows in (torch.tensor([1, 2]), torch.tensor([-1, 0]), torch.tensor([1 << 40, 1])):
        ok = (rows >= 0) & (rows < 2)
        want_tokens = []
        for m in range(4):
            b = m // 2
            order = sorted(range(3), key=lambda j: (-float(logits[m, j]), j))[:2]
            want_tokens.append([int(col_ids[rows[b], j]) if ok[b] else 7 for j in order])
        backends = [reference_compact_topk] + ([torch.ops.specvocab.compact_topk] if _ext.available() else [])
        for fn in backends:
            values, tokens, _ = fn(logits, col_ids, rows, 2, 7, 0)
            assert tokens.tolist() == want_tokens, (fn, rows)
            assert torch.equal(values, logits.sort(1, descending=True).values[:, :2])


FUZZ_ROUNDS = 10_000


def _break(g: torch.Generator, rows: torch.Tensor, cnt: torch.Tensor, ids: torch.Tensor, V_: int) -> None:
    """Break a random part of a request's slots and of the table, in place: slots out of range (high, negative),
    counts outside [1, W] (0, negative, above W), ids at or past V and negative ones, or nothing."""

    def some(n: int) -> torch.Tensor:
        return torch.rand(n, generator=g) < float(torch.rand((), generator=g)) * 0.5

    R_, W_ = ids.shape
    wild = torch.tensor([-(1 << 40), -7, -1, R_, R_ + 3, 1 << 40])
    rows[:] = torch.where(some(rows.numel()), wild[torch.randint(0, 6, rows.shape, generator=g)], rows)
    counts = torch.tensor([-(1 << 30), -2, 0, W_ + 1, 3 * W_, (1 << 31) - 1], dtype=torch.int32)
    cnt[:] = torch.where(some(R_), counts[torch.randint(0, 6, (R_,), generator=g)], cnt)
    bad_ids = torch.tensor([-(1 << 31), -1, V_, V_ + 1, (1 << 31) - 1], dtype=torch.int32)
    ids[:] = torch.where(some(ids.numel()).view(ids.shape), bad_ids[torch.randint(0, 5, ids.shape, generator=g)], ids)


class _Fuzz:
    """Heads of every plan and every CPU backend over one table, fuzzed round after round."""

    R, W, V, D = 6, 5, 24, 4

    def __init__(self, seed: int):
        self.g = torch.Generator().manual_seed(seed)
        self.weight = torch.randint(-2, 3, (self.V, self.D), generator=self.g).float()
        self.table = CandidateTable(self.R, self.W, fallback_id=3)
        self.heads = {
            (plan, kernel): DraftHead(self.weight, self.table, head=head_options(kernel=kernel, batch=plan))
            for plan in PLANS
            for kernel in head_kernels()
        }
        self.counter = ops.bad_entries("cpu")

    def round(self, step: int):
        """A fresh table (random sets), broken at random; a random batch: (kernel, rows, hidden, k, the reference's
        count of the bad entries a table plan reads, the hidden rows whose read ids ascend: there the table plans'
        tie orders coincide; a count above W also reads the padding, out of order or repeated)."""
        g, t = self.g, self.table
        t.assign(torch.arange(self.R), torch.randint(-1, self.V, (self.R, self.W + 2), generator=g))
        bs, n = (int(x) for x in torch.randint(1, 4, (2,), generator=g))
        rows = torch.randint(0, self.R, (bs,), generator=g)
        _break(g, rows, t.cnt, t.ids, self.V)
        hidden = torch.randint(-2, 3, (bs * n, self.D), generator=g).float()
        k = int(torch.randint(1, self.W + 1, (), generator=g))
        reads = head_reads(t.ids, t.cnt, rows, self.W, self.V, rows=bs * n)
        seen = torch.where(reads.live, reads.ids, -1).cummax(1).values
        before = torch.cat([torch.full_like(seen[:, :1], -1), seen[:, :-1]], 1)
        ascending = (~reads.live | (reads.ids > before)).all(1)
        kernels = head_kernels()
        count = int(reads.row_bad.sum() + reads.id_bad.sum())
        return kernels[step % len(kernels)], rows, hidden, k, count, ascending

    def check(self, values, tokens, k, N):
        """Finite values or -inf with the fallback token; every token a vocabulary id."""
        assert values.shape == tokens.shape == (N, k)
        assert not torch.isnan(values).any() and not torch.isposinf(values).any()
        assert torch.all((tokens >= 0) & (tokens < self.V))
        assert torch.all(tokens[torch.isneginf(values)] == self.table.fallback_id)


def test_a_fuzz_of_bad_slots_counts_and_ids_never_raises_on_any_plan(one_thread):
    """10^4 rounds, each every plan on one of the CPU backends (by turns), of a table and request slots broken at
    random: no exception leaves the head or its top-k, every entry is a finite value or the fallback, the table
    plans count what ``table.head_reads`` says (stock nothing) and agree bitwise (small integers) where a row's
    ids ascend."""
    fz = _Fuzz(36)
    for step in range(FUZZ_ROUNDS):
        kernel, rows, hidden, k, want, ascending = fz.round(step)
        seen = {}
        for plan in PLANS:
            before = int(fz.counter)
            out = fz.heads[plan, kernel](hidden, rows)
            assert int(fz.counter) - before == (0 if plan == "stock" else want), (step, plan, kernel)
            values, tokens = out.topk(k)
            probs, _ = out.topk_probs(k)
            fz.check(values, tokens, k, hidden.shape[0])
            assert torch.all((probs >= 0) & (probs <= 1)) and torch.all((probs == 0) == torch.isneginf(values))
            seen[plan] = (values, tokens)
        for plan in TABLE_PLANS[1:]:
            same = [torch.equal(a[ascending], b[ascending]) for a, b in zip(seen[plan], seen["per-request"])]
            assert all(same), (step, plan, kernel)


@pytest.mark.sglang
def test_a_fuzz_of_bad_tables_never_raises_in_the_servers_processor(torchvision_standin, one_thread):
    """The same fuzz through what SGLang's draft loop calls (``integration/logits.py``): ``draft_topk`` and
    ``draft_topk1`` on each plan's logits, request slots as ``req_pool_indices``; a quarter of the rounds (each
    runs more ops, and SGLang's import takes seconds)."""
    from sglang_specvocab.integration.logits import DynVocabLogitsProcessor

    def processor(head):
        proc = DynVocabLogitsProcessor.__new__(DynVocabLogitsProcessor)
        torch.nn.Module.__init__(proc)
        proc.dv_head = head
        return proc

    fz = _Fuzz(37)
    procs = {key: processor(head) for key, head in fz.heads.items()}
    for step in range(FUZZ_ROUNDS // 4):
        kernel, rows, hidden, k, want, _ = fz.round(step)
        for plan in PLANS:
            before = int(fz.counter)
            logits = fz.heads[plan, kernel](hidden, rows).logits
            assert int(fz.counter) - before == (0 if plan == "stock" else want), (step, plan, kernel)
            proc = procs[plan, kernel]
            probs, tokens = proc.draft_topk(logits, k, rows)
            assert torch.all((probs >= 0) & (probs <= 1)) and torch.all((tokens >= 0) & (tokens < fz.V))
            if plan != "stock":  # EAGLE3's own top-k there (its tie order)
                assert torch.all(tokens[probs == 0] == fz.table.fallback_id)
            chain = torch.full((hidden.shape[0], 2), -5, dtype=torch.int64)
            ones, top1 = proc.draft_topk1(logits, rows, chain, column=1)
            assert torch.all(ones == 1) and torch.all((top1 >= 0) & (top1 < fz.V))
            assert torch.equal(chain[:, 1], top1.view(-1))
            if plan != "stock":
                assert torch.equal(top1, tokens[:, :1]), (step, plan, kernel)


# --- Triton, interpreted in a child -------------------------------------------------------------------------------


def _child(out_path: str) -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1"
    results = {"debug_from_env": checks.debug_checks()}
    for op in OPS:
        for kind in KINDS:
            results["debug", op, kind] = debug_message(getattr(triton, op), op, kind)
    for plan in PLANS:
        for kind in HEAD_KINDS:
            results["head-debug", plan, kind] = head_message(kind, plan, "triton")
    ops.set_debug_checks(False)
    for op in OPS:
        for kind in KINDS:
            results["run", op, kind] = run(getattr(triton, op), op, kind)
            results["plain", op, kind] = getattr(triton, op)(*args_of(op, kind))
    for plan in PLANS:
        for kind in HEAD_KINDS:
            top, _, count = head_run(kind, plan, "triton")
            results["head", plan, kind] = (top, count)
    torch.save(results, out_path)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    pytest.importorskip("triton")
    out = tmp_path_factory.mktemp("bad_entries") / "out.pt"
    return run_interpreted(__file__, out, SGLANG_DYNVOCAB_DEBUG_CHECKS="1")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_triton_reads_counts_and_refuses_as_the_reference(interpreted, op, kind):
    want = run(getattr(reference, op), op, kind)
    got = interpreted["run", op, kind]
    assert torch.equal(got[0], want[0]) and got[1] == want[1]
    assert torch.equal(interpreted["plain", op, kind], want[0])  # COUNT off: the same logits
    was = checks.debug_checks()
    ops.set_debug_checks(True)
    try:
        assert interpreted["debug", op, kind] == debug_message(getattr(reference, op), op, kind)
    finally:
        ops.set_debug_checks(was)


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("kind", sorted(HEAD_KINDS))
def test_a_triton_head_reads_counts_and_refuses_as_stated(interpreted, kind, plan):
    """The head on Triton's logits op (per-request, union-indexed): the literal top-k and count, and under the
    debug setting the message of every other backend."""
    want, want_count = literal_head(kind, plan)
    assert interpreted["head", plan, kind] == (want, want_count)
    assert interpreted["head-debug", plan, kind] == (None if plan == "stock" else HEAD_MESSAGES.get(kind))


def test_the_debug_variable_is_read_at_import(interpreted):
    assert interpreted["debug_from_env"] is True
    assert checks._env_flag("1") and checks._env_flag(" On ") and not checks._env_flag("0")
    assert not checks._env_flag("") and not checks._env_flag(None)


# --- rows of the in-place updates -----------------------------------------------------------------------------------


def _window_args(rows):
    return (
        torch.full((R, W + 1), -1, dtype=torch.int32),
        torch.zeros(R, dtype=torch.int64),
        torch.zeros(R, W, dtype=torch.int32),
        torch.ones(R, dtype=torch.int32),
        torch.tensor(rows),
        torch.tensor([[3, 4, -1]] * len(rows), dtype=torch.int32),
        0,
        V,
    )


def _pack_args(rows):
    _, weight, ids, cnt, _, _ = case("valid")
    return (torch.zeros(R, W, D), torch.full((R, W), -1, dtype=torch.int32), weight, ids, cnt, torch.tensor(rows))


ROWS_BROKEN = [
    ([2, 0, 2], "rows must be distinct, got 2 twice (rows[0] and rows[2])"),
    ([1, R], f"rows must be in [0, R={R}), got rows[1] = {R}"),
    ([-1], f"rows must be in [0, R={R}), got rows[0] = -1"),
]


@pytest.mark.parametrize("rows, msg", ROWS_BROKEN)
@pytest.mark.parametrize("op", ["window_update", "pack_update"])
def test_broken_rows_are_refused_on_the_cpu_before_anything_is_written(op, rows, msg):
    """On the CPU (where reading them is free) every backend names the first bad row and its value; the state is
    unchanged. On a GPU they are trusted (see ops/checks.py) unless the debug setting is on."""
    make = _window_args if op == "window_update" else _pack_args
    backends = [(reference, ValueError)] + ([(torch.ops.specvocab, RuntimeError)] if _ext.available() else [])
    for mod, error in backends:
        args = make(rows)
        before = [t.clone() for t in args if isinstance(t, torch.Tensor)]
        with pytest.raises(error, match=re.escape(f"{op}: {msg}")):
            getattr(mod, op)(*args)
        assert all(torch.equal(a, b) for a, b in zip(before, [t for t in args if isinstance(t, torch.Tensor)]))


def _verify_round(rows, state=None):
    """A window_verify round over ``state`` (a fresh window of R rows by default) for ``rows``."""
    g = torch.Generator().manual_seed(11)
    B, nd, S = len(rows), 4, 3
    if state is None:
        ring = torch.full((R, W + 1), -1, dtype=torch.int32)
        ring[:, :W] = torch.randint(-1, V, (R, W), generator=g).to(torch.int32)
        ids, cnt, length = torch.zeros(R, W, dtype=torch.int32), torch.ones(R, dtype=torch.int32), torch.zeros(R).long()
        reference_window_update(ring, length, ids, cnt, torch.arange(R), torch.empty(R, 0, dtype=torch.int32), 0, V)
        state = {"ring": ring, "length": length, "ids": ids, "cnt": cnt, "acc": torch.zeros(4, R, dtype=torch.float64)}
    logits = torch.randn(B * nd, V, generator=g)
    values, top = logits.topk(2, dim=-1)
    index = torch.arange(B * nd).view(B, nd)[:, :S].to(torch.int32)
    return WindowRound(
        **state, rows=torch.tensor(rows), draft_token=torch.randint(0, V, (B * nd,), generator=g),
        accept_index=index, accept_lens=torch.full((B,), S, dtype=torch.int32),
        predict=torch.randint(0, V, (B * nd,), generator=g), topk_values=values, topk_ids=top, hot=None, k=2,
        context=True, compacted=False, fallback_id=0, vocab_size=V,
    )  # fmt: skip


def test_where_rows_are_trusted_a_bad_one_is_skipped(monkeypatch):
    """Where rows are not read on the host (a GPU without the debug setting: here ``readable`` says so), the torch
    updates skip a row outside [0, R) as the CUDA kernels do: the other rows get what a call without it gives,
    nothing else changes (it was an IndexError, a device assert on a GPU, and in the kernels an out-of-bounds
    write)."""
    window_update_module = importlib.import_module("sglang_specvocab.ops.window_update")  # not ops.window_update
    monkeypatch.setattr(window_update_module, "readable", lambda t: False)
    with_bad, clean = _verify_round([1, R + 2, -1, 3]), _verify_round([1, R + 2, -1, 3])
    want = dataclasses.replace(
        clean,
        rows=clean.rows[[0, 3]],
        accept_index=clean.accept_index[:2],  # node rows: request b's nodes start at b * nd
        accept_lens=clean.accept_lens[[0, 3]],
        draft_token=clean.draft_token.view(4, -1)[[0, 3]].flatten(),
        predict=clean.predict.view(4, -1)[[0, 3]].flatten(),
        topk_values=clean.topk_values.view(4, -1, 2)[[0, 3]].flatten(0, 1),
        topk_ids=clean.topk_ids.view(4, -1, 2)[[0, 3]].flatten(0, 1),
    )
    got = reference_window_verify(with_bad)
    assert torch.equal(got[[0, 3]], reference_window_verify(want))  # the committed tokens: every request's
    for name in ("ring", "length", "ids", "cnt", "acc"):
        assert torch.equal(getattr(with_bad, name), getattr(want, name)), name


@pytest.mark.parametrize("made", ["own", "over"])
def test_a_table_with_bad_rows_skips_them(made):
    """``CandidateTable``'s per-round methods with request slots: a slot outside [0, R) is skipped by the writes
    (``reset``, ``assign``) and holds nothing (``contains``); the listed rows in range are as without it. A table
    of its own writes a bad slot to its spare row, one over given tensors skips it (``table.put_rows``)."""

    def table():
        t = CandidateTable(R, W, fallback_id=2)
        t.assign(torch.arange(R), torch.arange(R * W).view(R, W) % V)
        return t if made == "own" else CandidateTable.over(t.ids.clone(), t.cnt.clone(), fallback_id=2)

    rows, good = torch.tensor([3, R, -4, 1 << 40, 0]), torch.tensor([3, 0])
    tokens = torch.tensor([[15, 3, -1]] * 5)
    got, want = table().contains(rows, tokens), table().contains(good, tokens[:2])
    assert torch.equal(got[[0, 4]], want) and not got[1:4].any()
    cands = torch.randint(-1, V, (5, W + 2), generator=torch.Generator().manual_seed(4))
    for call in ("assign", "reset"):
        t, u = table(), table()
        getattr(t, call)(rows, *([cands] if call == "assign" else []))
        getattr(u, call)(good, *([cands[[0, 4]]] if call == "assign" else []))
        assert torch.equal(t.ids, u.ids) and torch.equal(t.cnt, u.cnt), call


def test_window_verify_never_searches_past_a_bad_count():
    """A listed row whose count is above its capacity (a broken table) is searched over its own columns only, on
    every backend (the compiled op's search ran on into the next rows: a wrong hit, out of bounds for the last)."""
    backends = [reference_window_verify] + (
        [ops.implementation("cuda", "cpu", "window_verify")] if _ext.available() else []
    )
    results = []
    for fn in backends:
        r = _verify_round([1, 2])
        r.ids[1] = torch.arange(W, dtype=torch.int32)  # 0..5
        r.ids[2] = torch.arange(W, 2 * W, dtype=torch.int32)  # 6..11: past row 1's columns
        r.cnt[1], r.cnt[2] = 2 * W, -3
        r.predict[:4] = 7  # request 0 commits 7, which only the next row holds
        fn(r)
        results.append(r.acc.clone())
        assert r.acc[2, 1] == 0 and r.acc[0, 1] == 2 * W and r.acc[0, 2] == -3  # no hit; the counts as they were
    assert all(torch.equal(a, results[0]) for a in results)


@pytest.mark.gpu
def test_cuda_updates_skip_a_bad_row(monkeypatch):
    """The CUDA kernels of the in-place updates skip a listed row outside [0, R) (they wrote out of bounds): the
    other rows as the reference gives them, nothing else touched."""
    window_update_module = importlib.import_module("sglang_specvocab.ops.window_update")  # not ops.window_update
    if not _ext.has_cuda_kernels():
        pytest.skip("no CUDA kernels in this build")
    rows = [1, R + 2, -1, 3]
    r = _verify_round(rows)
    on_gpu = {f.name: getattr(r, f.name) for f in dataclasses.fields(r)}
    gpu = type(r)(**{k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in on_gpu.items()})
    monkeypatch.setattr(window_update_module, "readable", lambda t: False)  # the reference as on a GPU
    want = reference_window_verify(r)
    assert torch.equal(ops.window_verify(gpu, backend="cuda").cpu(), want)
    for name in ("ring", "length", "ids", "cnt", "acc"):
        assert torch.equal(getattr(gpu, name).cpu(), getattr(r, name)), name
    args = [t.cuda() for t in _pack_args(rows)]
    before = [t.clone() for t in args]
    ops.pack_update(*args, backend="cuda")
    cpu = _pack_args([1, 3])
    reference_pack_update(*cpu)
    assert torch.equal(args[0].cpu(), cpu[0]) and torch.equal(args[1].cpu(), cpu[1])
    assert all(torch.equal(a, b) for a, b in zip(args[2:], before[2:]))


def test_rows_on_meta_are_trusted_even_under_the_debug_setting(debug):
    """Where values cannot be read (meta) nothing is checked and nothing syncs: the documented GPU behaviour without
    the debug setting (a row listed twice is a data race on that row, one out of range is skipped)."""
    args = [t.to("meta") if isinstance(t, torch.Tensor) else t for t in _window_args([2, 2])]
    reference.window_update(*args)
    if _ext.available():
        torch.ops.specvocab.window_update(*args)


@pytest.mark.gpu
def test_cuda_backends_check_rows_and_entries_only_under_the_debug_setting(debug):
    """On a GPU the checks need a host copy: the debug setting's; the messages are the CPU ones."""
    if not _ext.has_cuda_kernels():
        pytest.skip("no CUDA kernels in this build")
    dev = "cuda"
    args = [t.to(dev) if isinstance(t, torch.Tensor) else t for t in _window_args([2, 0, 2])]
    for backend in ("cuda", "torch"):
        with pytest.raises((ValueError, RuntimeError), match=re.escape("rows must be distinct, got 2 twice")):
            ops.window_update(*args[:6], fallback_id=0, vocab_size=V, backend=backend)
    for op in OPS:
        gpu_args = [t.to(dev) for t in args_of(op, "cnt_zero")]
        for backend in ("cuda", "triton", "torch"):
            with pytest.raises(ValueError, match=re.escape(DEBUG_MESSAGES["cnt_zero"])):
                getattr(ops, op)(*gpu_args, backend=backend)
    ops.set_debug_checks(False)
    for op in OPS:
        gpu_args = [t.to(dev) for t in args_of(op, "everything")]
        want = run(getattr(reference, op), op, "everything")
        for backend in ("cuda", "triton", "torch"):
            bad = torch.zeros((), dtype=torch.int64, device=dev)
            got = getattr(ops, op)(*gpu_args, backend=backend, bad=bad)
            assert torch.equal(got.cpu(), want[0]) and int(bad) == want[1], (op, backend)


if __name__ == "__main__":
    _child(sys.argv[1])
