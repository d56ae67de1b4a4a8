"""``testing.graphs``, the CPU emulation of CUDA-graph capture: it refuses what a CUDA capture refuses (every host
sync of the review's probe list, named in the error), lets through what a capture allows (and replays it on new
values), and a head captured once sees, at each replay, every in-place change of the candidate table, the request
slots and the hidden rows: the replay's logits and top-k equal an eager call's on the new values, for every head
plan, a full-vocabulary head and a d2t head. (The draft loop's graphs through SGLang: ``test_graph_replay.py``.)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import REVIEW_PROBES
from torch.utils._pytree import tree_leaves

from sglang_specvocab import ops
from sglang_specvocab.head import PLANS, DraftHead, head_options
from sglang_specvocab.table import CandidateTable
from sglang_specvocab.tools.testing.graphs import HostSyncInCapture, capture
from sglang_specvocab.vocab import VocabSpace

# Device stand-ins: tensors made outside any capture.
X = torch.arange(6.0)
MASK = X > 2
IDX = torch.tensor([1, 2, 0])


def _write_through_mask():
    y = X.clone()
    y[MASK] = X[:3]


# The review's probe list and its kin: each a host sync on a GPU, and what the error must name.
SYNCS = {
    "tolist": (lambda: IDX.tolist(), r"torch\.Tensor\.tolist copies a device tensor to the host"),
    "item": (lambda: X[0].item(), r"torch\.Tensor\.item: aten\._local_scalar_dense"),
    "bool": (lambda: bool(X[1]), r"torch\.Tensor\.__bool__: aten\._local_scalar_dense"),
    "int": (lambda: int(IDX[0]), r"torch\.Tensor\.__int__: aten\._local_scalar_dense"),
    "if-any": (lambda: 1 if MASK.any() else 0, r"torch\.Tensor\.__bool__: aten\._local_scalar_dense"),
    "in": (lambda: 3 in IDX, r"torch\.Tensor\.__contains__: aten\._local_scalar_dense"),
    "nonzero": (lambda: MASK.nonzero(), r"torch\.Tensor\.nonzero: aten\.nonzero"),
    "where-one-arg": (lambda: torch.where(MASK), r"torch\.where: aten\.nonzero"),
    "argwhere": (lambda: torch.argwhere(MASK), r"torch\.argwhere: aten\.nonzero"),
    "mask-index": (lambda: X[MASK], r"torch\.Tensor\.__getitem__: aten\.index\.Tensor indexes with a boolean mask"),
    "mask-write": (_write_through_mask, r"torch\.Tensor\.__setitem__: aten\.index_put_\.default writes through"),
    "masked_select": (lambda: X.masked_select(MASK), r"aten\.masked_select"),
    "repeat_interleave": (lambda: IDX.repeat_interleave(IDX), r"aten\.repeat_interleave\.Tensor has an output shape"),
    "unique": (lambda: torch.unique(IDX), r"torch\.functional\.unique: aten\._unique2"),
    "unique_consecutive": (lambda: torch.unique_consecutive(IDX), r"aten\.unique_consecutive"),
    "bincount": (lambda: torch.bincount(IDX), r"torch\.bincount: aten\.bincount"),
    "equal": (lambda: torch.equal(X, X), r"torch\.equal: aten\.equal"),
    "allclose": (lambda: torch.allclose(X, X), r"torch\.allclose: aten\.allclose"),
    "cpu": (lambda: X.cpu(), r"torch\.Tensor\.cpu copies a device tensor to the host"),
    "to-cpu": (lambda: X.to("cpu"), r"torch\.Tensor\.to copies a device tensor to the host"),
    "to-device-cpu": (lambda: X.to(device="cpu", dtype=torch.float64), r"torch\.Tensor\.to copies a device tensor"),
    "numpy": (lambda: X.numpy(), r"torch\.Tensor\.numpy copies a device tensor to the host"),
    "np.asarray": (lambda: np.asarray(X), r"torch\.Tensor\.__array__ copies a device tensor to the host"),
    "repr": (lambda: repr(X), r"torch\.Tensor\.__repr__ copies a device tensor to the host"),
    "format": (lambda: f"{X[0]:.2f}", r"torch\.Tensor\.__format__ copies a device tensor to the host"),
    "copy-to-host": (lambda: torch.zeros(6).copy_(X), r"aten\.copy_\.default copies a device tensor to the host"),
    "masked_fill-device-value": (lambda: X.masked_fill(MASK, X[0]), r"aten\.masked_fill\.Tensor reads its device"),
    "to-device": (lambda: torch.arange(3).to(X.device), r"torch\.Tensor\.to copies a host tensor to the device"),
    "tensor-on-device": (lambda: torch.tensor([1, 2], device=X.device), r"torch\.tensor copies Python data"),
    "list-index": (lambda: X[[0, 2]], r"aten\.index\.Tensor takes a host tensor with device tensors"),
}


@pytest.mark.parametrize("name", list(SYNCS))
def test_a_host_sync_is_refused_at_capture_naming_the_op(name):
    fn, names = SYNCS[name]
    with pytest.raises(HostSyncInCapture, match=names):
        capture(fn)


def _inputs():
    """Static inputs of the legal ops (device stand-ins); ``reps`` keeps its sum 3 (the output_size)."""
    return {
        "x": torch.tensor([0.5, -1.0, 2.0, 3.5, -0.25, 1.0]),
        "idx": torch.tensor([4, 0, 2]),
        "mask": torch.tensor([True, False, True, False, False, True]),
        "reps": torch.tensor([1, 2, 0]),
        "sorted": torch.tensor([-1.0, 0.0, 1.0, 2.0]),
    }


def _scatter(x, idx):
    return torch.zeros(6, device=x.device).scatter_(0, idx, x[:3])


def _write_scalar(x, mask):
    y = x.clone()
    y[mask] = 0.0  # a Python number: torch runs masked_fill_, no indices
    return y


# Ops a CUDA capture allows (static shapes, no host read): captured, then replayed on new values.
LEGAL = {
    "index_select": lambda t: t["x"].index_select(0, t["idx"]),
    "gather": lambda t: t["x"].gather(0, t["idx"]),
    "integer-index": lambda t: t["x"][t["idx"]],
    "scatter_": lambda t: _scatter(t["x"], t["idx"]),
    "index_fill_": lambda t: t["x"].clone().index_fill_(0, t["idx"], -2.0),
    "cumsum": lambda t: t["x"].cumsum(0),
    "topk": lambda t: t["x"].topk(2),
    "sort": lambda t: t["x"].sort(stable=True),
    "argmax": lambda t: t["x"].argmax(),
    "searchsorted": lambda t: torch.searchsorted(t["sorted"], t["x"]),
    "masked_fill": lambda t: t["x"].masked_fill(t["mask"], float("-inf")),
    "masked_fill-host-value": lambda t: t["x"].masked_fill(t["mask"], torch.tensor(7.0)),
    "mask-write-number": lambda t: _write_scalar(t["x"], t["mask"]),
    "where-three-args": lambda t: torch.where(t["mask"], t["x"], 0.0),
    "any-as-a-tensor": lambda t: t["mask"].any(),
    "nonzero_static": lambda t: torch.nonzero_static(t["mask"], size=6),
    "repeat_interleave-output_size": lambda t: t["idx"].repeat_interleave(t["reps"], output_size=3),
    "to-its-device": lambda t: t["x"].to(t["x"].device, copy=True),
    "to-a-dtype": lambda t: t["x"].to(torch.float64),
    "zeros-on-its-device": lambda t: torch.zeros(3, device=t["x"].device) + t["x"][:3],
    "host-scalar": lambda t: t["x"] * torch.tensor(2.0),
}


def _leaves(x):
    return [t for t in tree_leaves(x) if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("name", list(LEGAL))
def test_an_op_a_capture_allows_is_recorded_and_replays_on_new_values(name):
    fn, t = LEGAL[name], _inputs()
    graph, out = capture(lambda: fn(t))
    new = {
        "x": torch.tensor([3.0, 2.5, -4.0, 0.0, 9.0, -1.5]),
        "idx": torch.tensor([5, 3, 1]),
        "mask": torch.tensor([False, True, True, True, False, False]),
        "reps": torch.tensor([0, 1, 2]),
        "sorted": torch.tensor([-3.0, 0.5, 2.5, 5.0]),
    }
    for k, v in new.items():
        t[k].copy_(v)
    graph.replay()
    got, want = _leaves(out), _leaves(fn(t))
    assert got and len(got) == len(want)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), name


def test_host_tensors_alone_are_host_work():
    """A tensor made in the capture from Python data, or by a factory without a device, is on the host (torch's
    default device): reading it is no sync (``table._earlier_in_segment`` builds its masks so, then copied over)."""
    capture(lambda: torch.repeat_interleave(torch.arange(3), torch.tensor([1, 2, 1])).tolist())
    capture(lambda: int(torch.tensor(3)) + torch.zeros(2, device="cpu").nonzero().numel())


def test_only_the_ops_value_checks_may_read_cpu_tensors():
    """``check_*`` of ``ops/`` read CPU tensors only (none on a device): their reads are let through, and only
    theirs."""
    from sglang_specvocab.ops.checks import check_rows

    capture(lambda: check_rows("op", IDX, 5))  # reads rows.tolist()

    def check_rows_here(rows):  # the same name pattern outside ops/: refused
        return rows.tolist()

    with pytest.raises(HostSyncInCapture, match="tolist"):
        capture(lambda: check_rows_here(IDX))


# --- the head: replays over in-place changes -------------------------------------------------------------------

V, D, R, CAP, BS, N, K = 40, 8, 8, 6, 3, 2, 3
KERNELS = [k for k in ("torch", "cuda") if k in ops.available_backends("cpu")]


def _fill(table: CandidateTable, slots: list[int], pool: list[int], g: torch.Generator) -> None:
    """New sets (1 to CAP ids of ``pool``) for ``slots``, written in place (``assign``: ids and cnt)."""
    cand = torch.full((len(slots), CAP), -1, dtype=torch.int64)
    for i in range(len(slots)):
        size = int(torch.randint(1, CAP + 1, (1,), generator=g))
        cand[i, :size] = torch.tensor(pool)[torch.randperm(len(pool), generator=g)[:size]]
    table.assign(torch.tensor(slots), cand)


def _head(plan: str, d2t: bool, kernel: str, g: torch.Generator):
    W = torch.randn(V, D, generator=g)
    hot = torch.randperm(V, generator=g)[:28] if d2t else None  # the d2t map: draft row j -> target id hot[j]
    pool = sorted(hot.tolist()) if d2t else list(range(V))
    table = CandidateTable(R, CAP, fallback_id=pool[0])
    _fill(table, list(range(R)), pool, g)
    head = DraftHead(
        W if hot is None else W[hot],
        table,
        VocabSpace.build(V, head_ids=hot, fallback_id=table.fallback_id),
        head_options(kernel=kernel, batch=plan, union_capacity=CAP + 3),
        logit_scale=0.5,
        logit_softcap=4.0,
    )
    return head, table, pool


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("d2t", [False, True], ids=["full", "d2t"])
@pytest.mark.parametrize("plan", PLANS)
def test_a_head_replay_sees_the_table_slots_and_hidden_rows_written_in_place(plan, d2t, kernel):
    """The head and its top-k captured once (as SGLang's draft decode); then, round after round, new sets in the
    table, new slots and new hidden rows written in place, and a replay: its logits, top-k and union-overflow count
    equal an eager call's on the new values, the eager top-k of the replayed logits (the draft extend's) too, and
    every token is in its request's new set (the fallback where the set has fewer than K ids)."""
    g = torch.Generator().manual_seed(PLANS.index(plan) * 4 + 2 * d2t + KERNELS.index(kernel))
    head, table, pool = _head(plan, d2t, kernel, g)
    hidden = torch.randn(BS * N, D, generator=g)
    rows = torch.tensor([1, 4, 6])

    def step():
        out = head(hidden, rows)
        return (out.logits, *out.topk(K))

    graph, (logits, values, tokens) = capture(step)
    at_capture, ids, cnt = logits.clone(), table.ids, table.cnt
    for rnd in range(4):
        slots = torch.randperm(R, generator=g)[:BS]  # padding slot 0 among them at times
        _fill(table, sorted(set(slots.tolist()) | {int(rows[0])}), pool, g)
        rows.copy_(slots)
        hidden.copy_(torch.randn(BS * N, D, generator=g))
        overflow = head.union_overflow.clone()
        graph.replay()
        got = (logits.clone(), values.clone(), tokens.clone())
        grew = head.union_overflow - overflow
        after = head.output(logits, rows, (BS, N)).topk(K)  # the eager top-k after a replay
        want = head(hidden, rows)
        assert torch.equal(got[0], want.logits), rnd
        assert all(torch.equal(a, b) for a, b in zip(got[1:], want.topk(K), strict=True)), rnd
        assert all(torch.equal(a, b) for a, b in zip(got[1:], after, strict=True)), rnd
        union = set().union(*(table.row(r) for r in rows.tolist()))
        assert int(grew) == int(plan.startswith("union") and len(union) > head.union_capacity), rnd
        for m, r in enumerate(rows.repeat_interleave(N).tolist()):
            allowed = set(pool) if plan == "stock" else set(table.row(r)) | {table.fallback_id}
            assert set(got[2][m].tolist()) <= allowed, (rnd, m)
    assert table.ids is ids and table.cnt is cnt  # written in place, never rebound
    assert not torch.equal(logits, at_capture)


@pytest.mark.parametrize(
    "probe",
    REVIEW_PROBES,
    ids=["tolist", "nonzero", "mask-index"],
)
def test_the_reviews_probe_in_the_head_fails_its_capture(monkeypatch, probe):
    """The review's probe (``rows.tolist(); (rows >= 0).nonzero(); hidden[mask]`` inside ``DraftHead.__call__``)
    passed every replay test; each of its lines now fails the capture."""
    read, names = probe
    g = torch.Generator().manual_seed(0)
    head, _, _ = _head("per-request", False, "torch", g)
    hidden, rows = torch.randn(BS * N, D, generator=g), torch.tensor([1, 4, 6])
    capture(lambda: head(hidden, rows))
    real = DraftHead.__call__

    def probed(self, hidden, rows, weight=None):
        read(hidden, rows)
        return real(self, hidden, rows, weight)

    monkeypatch.setattr(DraftHead, "__call__", probed)
    with pytest.raises(HostSyncInCapture, match=names):
        capture(lambda: head(hidden, rows))
