"""The draft loop as a GPU server runs it: CUDA graphs captured per batch bucket, replayed, the eager parts after.

SGLang captures the draft decode (``draft_forward``, head and top-k inside the graph) and the decode draft extend
(the forward and the head inside the graph, the top-k eagerly after the replay) for each batch bucket, largest
first, and at run time pads a batch to its bucket and replays. ``sglang_specvocab.tools.testing.graphs`` emulates that on
a CPU: a captured function's Python runs once, at capture; a replay re-runs only its recorded tensor ops. With
``head.batch: auto`` each bucket may run another plan (per-request, union, stock), so the top-k after a replay must
read the column map of the call the graph made, never Python state a later capture or an eager call left behind.

Checked for chains and trees, full-vocabulary and d2t drafts: every drafted id is the plain-Python reference's
for the plan its bucket runs (the request's own set; the draft's whole vocabulary for ``stock``), request by
request, after captures in SGLang's order and replays of every bucket in a mixed order, eager calls in between,
the sets rewritten in place between rounds. A replay of the processor's logits sees new sets, slots and hidden
rows written in place, in every plan; a host sync in the head (the review's probe) fails the captures.
The issue-23 reproduction (bucket 4 captured as ``stock``, then bucket 1 as ``per-request``, then the top-k of a
bucket-4 replay) is ``test_extend_replay_reads_its_own_bucket_plan``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import test_integration_draft_loop as loop
import torch
from helpers import REVIEW_PROBES

from sglang_specvocab.tools.testing.graphs import HostSyncInCapture, capture
from sglang_specvocab.vocab import VocabSpace

pytestmark = pytest.mark.sglang

_eager_and_spec, draft, ew = loop._eager_and_spec, loop.draft, loop.ew

V, D, R, CAP = 40, 8, 8, 12
SIZES = {1: 10, 2: 7, 3: 12, 4: 8, 5: 9, 6: 11, 7: 5}  # request slot -> set size (slot 0: SGLang's padding row)
BUCKETS = (1, 2, 4)
# What auto might choose per bucket (one call row a request in the extend, topk rows in the decode): every plan
# appears, in an order where each capture leaves another plan behind than the next replay needs.
EXTEND_PLANS = {1: "per-request", 2: "union-indexed", 4: "stock"}
DECODE_PLANS = {1: "stock", 2: "per-request", 4: "union-gemm"}


class GModel(loop.Model):
    """The draft loop's fake model (``h' = tanh(h @ A + E[token])``, fp64, its ``step`` and ``compact``) over a
    table of ``SIZES`` sets, with a full-vocabulary head or a d2t head (``hot``: the draft's target ids, in
    draft-row order)."""

    def __init__(self, *, d2t: bool, seed: int = 0):  # its own table and head: Model.__init__ is not called
        from sglang_specvocab.config import HeadSection
        from sglang_specvocab.integration import logits as L
        from sglang_specvocab.table import CandidateTable

        g = torch.Generator().manual_seed(seed)
        self.A = torch.randn(D, D, generator=g, dtype=torch.float64) * 0.7
        self.E = torch.randn(V, D, generator=g, dtype=torch.float64)
        self.W = torch.randn(V, D, generator=g, dtype=torch.float64) * 2.0  # target-id space
        self.hot = torch.randperm(V, generator=g)[:30] if d2t else None
        self.pool = sorted(self.hot.tolist()) if d2t else list(range(V))  # what the draft can propose
        fallback = self.pool[0]
        table = CandidateTable(R, CAP, fallback_id=fallback)
        table.ids.fill_(fallback)
        self.sets = {}
        for slot, size in SIZES.items():
            pick = torch.tensor(self.pool)[torch.randperm(len(self.pool), generator=g)[:size]]
            cand = torch.full((1, CAP), -1, dtype=torch.int64)
            cand[0, :size] = pick
            table.assign(torch.tensor([slot]), cand)
            self.sets[slot] = sorted(pick.tolist())
        self.table = table
        original = torch.nn.Module()
        original.logit_scale, original.final_logit_softcapping = None, None
        weight = self.W if self.hot is None else self.W[self.hot]
        self.lm_head = SimpleNamespace(weight=weight, tp_size=1)
        self.proc = L.DynVocabLogitsProcessor.wrap(
            original,
            self.lm_head,
            table,
            HeadSection(kernel="torch", union_capacity=V),  # no overflow: the union's rows keep their whole sets
            space=VocabSpace.build(V, head_ids=self.hot, fallback_id=table.fallback_id),
        )

    def rewrite(self, slots: list[int], g: torch.Generator) -> None:
        """New sets (5 to CAP ids of the pool) for ``slots``, written into the table in place, as a policy does
        between rounds."""
        cand = torch.full((len(slots), CAP), -1, dtype=torch.int64)
        for i, slot in enumerate(slots):
            size = int(torch.randint(5, CAP + 1, (1,), generator=g))
            pick = torch.tensor(self.pool)[torch.randperm(len(self.pool), generator=g)[:size]]
            cand[i, :size] = pick
            self.sets[slot] = sorted(pick.tolist())
        self.table.assign(torch.tensor(slots), cand)

    def force_plans(self, plans: dict[tuple[int, int], str]) -> None:
        """Pin the head's plan per call shape (bs, n): what ``auto``'s cost model would pick on some device."""
        self.proc.dv_head._plans.update(plans)

    # --- plain-Python references ---------------------------------------------------------------------

    def candidates(self, slot: int, plan: str) -> list[int]:
        return self.pool if plan == "stock" else self.sets[slot]

    def ranked(self, h: torch.Tensor, slot: int, plan: str) -> list[int]:
        return sorted(self.candidates(slot, plan), key=lambda v: (-float(h @ self.W[v]), v))

    def chain(self, h: torch.Tensor, slot: int, plan: str, steps: int) -> list[int]:
        out = []
        for _ in range(steps):
            if out:
                h = torch.tanh(h @ self.A + self.E[out[-1]])
            out.append(self.ranked(h, slot, plan)[0])
        return out


def bucket_of(bs: int) -> int:
    return next(b for b in BUCKETS if b >= bs)


class ExtendGraphs:
    """SGLang's draft-extend graph runner, emulated: static buffers, one graph per bucket captured largest first
    (the forward, the row selection before the LM head, the head), ``execute`` pads to the bucket and replays."""

    def __init__(self, model: GModel, nd: int):
        self.nd, top = nd, max(BUCKETS)
        self.input_ids = torch.zeros(top * nd, dtype=torch.int64)
        self.hidden = torch.zeros(top * nd, D, dtype=torch.float64)
        self.rows = torch.zeros(top, dtype=torch.int64)
        self.select = torch.arange(top, dtype=torch.int64) * nd + nd - 1
        self.graphs, self.out, self.bs = {}, {}, None
        for bs in reversed(BUCKETS):

            def run(bs=bs):
                h = model.step(self.input_ids[: bs * nd], self.hidden[: bs * nd])[self.select[:bs]]
                return model.compact(h, self.rows[:bs]), h

            self.graphs[bs], self.out[bs] = capture(run)

    def can_run_graph(self, fb) -> bool:
        return fb.req_pool_indices.shape[0] <= max(BUCKETS)

    def execute(self, fb, select_index):
        raw = fb.req_pool_indices.shape[0]
        bs, n = bucket_of(raw), raw * self.nd
        self.rows.zero_()  # padding rows: slot 0
        self.select.copy_(torch.arange(self.rows.shape[0]) * self.nd + self.nd - 1)
        self.input_ids[:n].copy_(fb.input_ids)
        self.hidden[:n].copy_(fb.spec_info.hidden_states)
        self.rows[:raw].copy_(fb.req_pool_indices)
        self.select[:raw].copy_(select_index)
        self.bs = bs
        self.graphs[bs].replay()
        logits, h = self.out[bs]
        return SimpleNamespace(next_token_logits=logits[:raw], hidden_states=h[:raw].clone())


class DecodeGraphs:
    """SGLang's draft (multi-step) graph runner, emulated: the whole ``draft_forward`` captured per bucket."""

    def __init__(self, draft, w, topk: int, steps: int):
        top = max(BUCKETS)
        self.topk_p = torch.zeros(top, topk, dtype=torch.float32)
        self.topk_index = torch.zeros(top, topk, dtype=torch.int64)
        self.hidden = torch.zeros(top, D, dtype=torch.float64)
        self.rows = torch.zeros(top, dtype=torch.int64)
        self.positions = torch.zeros(top * topk, dtype=torch.int64)
        self.cache_loc = torch.zeros(top * topk * steps, dtype=torch.int64)
        self.graphs, self.out = {}, {}
        for bs in reversed(BUCKETS):
            fb = self._batch(bs, topk, steps)
            self.graphs[bs], self.out[bs] = capture(lambda fb=fb: draft.draft_forward(w, fb))

    def _batch(self, bs, topk, steps):
        return SimpleNamespace(
            spec_info=SimpleNamespace(
                topk_p=self.topk_p[:bs], topk_index=self.topk_index[:bs], hidden_states=self.hidden[:bs]
            ),
            out_cache_loc=self.cache_loc[: bs * topk * steps],
            batch_size=bs,
            positions=self.positions[: bs * topk],
            req_pool_indices=self.rows[:bs],
            input_ids=None,
            forward_mode=loop.FBMode("decode"),
            moe_num_token_non_padded=None,
            sampling_info=SimpleNamespace(is_all_greedy=True),
        )

    def replay(self, rows, topk_p, topk_index, hidden):
        raw = rows.shape[0]
        bs = bucket_of(raw)
        for buf in (self.topk_p, self.topk_index, self.hidden, self.rows, self.positions):
            buf.zero_()
        self.rows[:raw].copy_(rows)
        self.topk_p[:raw].copy_(topk_p)
        self.topk_index[:raw].copy_(topk_index)
        self.hidden[:raw].copy_(hidden)
        self.graphs[bs].replay()
        parents, scores, tokens, _ = self.out[bs]
        return parents[:raw], scores[:raw], tokens[:raw]


def extend_for_decode(ew, draft, monkeypatch, w, rows, predict, hidden, accept_lens):
    """The copied decode draft extend (graph or eager, as the worker's runner decides): the next draft input."""
    return loop.extend_for_decode(
        ew,
        draft.draft_extend_for_decode,
        w,
        monkeypatch,
        rows=rows,
        predict=predict,
        hidden=hidden,
        accept_lens=accept_lens,
    )


def round_inputs(model: GModel, rows: torch.Tensor, nd: int, seed: int):
    """A verify round's output: predicted ids (from each request's set), hidden rows, accept lengths."""
    g = torch.Generator().manual_seed(seed)
    bs = rows.shape[0]
    predict = torch.tensor(
        [
            model.sets[r][j % len(model.sets[r])]
            for r in rows.tolist()
            for j in torch.randint(0, 99, (nd,), generator=g).tolist()
        ]
    )
    hidden = torch.randn(bs * nd, D, generator=g, dtype=torch.float64)
    accept = torch.randint(1, nd + 1, (bs,), generator=g, dtype=torch.int32)
    return predict, hidden, accept


def expected_extend(model, rows, predict, hidden, accept, nd, plan, topk):
    want = []
    for b, r in enumerate(rows.tolist()):
        m = b * nd + int(accept[b]) - 1
        h = torch.tanh(hidden[m] @ model.A + model.E[predict[m]])
        want.append(model.ranked(h, r, plan)[:topk])
    return want


@pytest.mark.parametrize("d2t", [False, True], ids=["full", "d2t"])
@pytest.mark.parametrize("topk", [1, 3])
def test_extend_replay_reads_its_own_bucket_plan(ew, draft, monkeypatch, d2t, topk):
    """Issue 23's reproduction: bucket 4 captured as stock, bucket 1 last (per-request); a 3-request batch replays
    bucket 4, and its eager top-k must read the stock head's columns (it crashed, or read another row's ids)."""
    nd = 4
    model = GModel(d2t=d2t, seed=topk)
    model.force_plans({(bs, 1): plan for bs, plan in EXTEND_PLANS.items()})
    w = loop.make_worker(ew, model, compact=True, topk=topk, steps=3, nd=nd)
    graphs = ExtendGraphs(model, nd)
    w.cuda_graph_runner_for_draft_extend = graphs
    for seed, rows in enumerate([[3, 1, 4], [5], [2, 6], [7, 3, 2, 1], [4]]):
        rows = torch.tensor(rows)
        predict, hidden, accept = round_inputs(model, rows, nd, seed)
        nxt = extend_for_decode(ew, draft, monkeypatch, w, rows, predict, hidden, accept)
        plan = EXTEND_PLANS[bucket_of(rows.shape[0])]
        assert graphs.bs == bucket_of(rows.shape[0])
        assert nxt.topk_index.tolist() == expected_extend(model, rows, predict, hidden, accept, nd, plan, topk)
        if plan != "stock":
            for b, r in enumerate(rows.tolist()):
                assert set(nxt.topk_index[b].tolist()) <= set(model.sets[r])
        if topk > 1:  # probabilities over what the plan scores, in the ids' order
            assert torch.all(nxt.topk_p[:, :-1] >= nxt.topk_p[:, 1:]) and torch.all(nxt.topk_p > 0)


@pytest.mark.parametrize("d2t", [False, True], ids=["full", "d2t"])
def test_eager_extend_reads_the_call_over_every_draft_token(ew, draft, monkeypatch, d2t):
    """A batch past the largest bucket runs eagerly: the head scores every draft token's row (bs, nd) and only
    the selected rows reach the top-k, whose column map is that call's, not the kept rows' shape."""
    nd, topk = 4, 2
    model = GModel(d2t=d2t, seed=9)
    rows = torch.tensor([1, 2, 3, 4, 5])  # 5 > the largest bucket: eager
    model.force_plans({(5, nd): "union-indexed", (5, 1): "stock"})
    w = loop.make_worker(ew, model, compact=True, topk=topk, steps=3, nd=nd)
    w.cuda_graph_runner_for_draft_extend = ExtendGraphs(model, nd)
    predict, hidden, accept = round_inputs(model, rows, nd, 3)
    nxt = extend_for_decode(ew, draft, monkeypatch, w, rows, predict, hidden, accept)
    assert nxt.topk_index.tolist() == expected_extend(model, rows, predict, hidden, accept, nd, "union", topk)


@pytest.mark.parametrize("d2t", [False, True], ids=["full", "d2t"])
@pytest.mark.parametrize("topk,steps", [(1, 4), (2, 3)])
def test_server_rounds_over_captured_buckets(ew, draft, monkeypatch, d2t, topk, steps):
    """Both graph runners captured in SGLang's order (decode buckets, then extend buckets, largest first), then
    rounds of mixed batch sizes, the policy rewriting some sets in place before each: extend replay, its eager
    top-k, decode replay. Every round's tree equals an eager run of the same plans, and chains equal the plain
    greedy chain over what each plan scores (the round's sets)."""
    nd = 6 if topk > 1 else steps + 1
    model = GModel(d2t=d2t, seed=10 + topk)
    if topk > 1:
        model.force_plans({(bs, 1): plan for bs, plan in EXTEND_PLANS.items()})
    # a chain's decode calls have one row a request too: there both graphs share the (bs, 1) plans
    model.force_plans({(bs, topk): plan for bs, plan in DECODE_PLANS.items()})
    w = loop.make_worker(ew, model, compact=True, topk=topk, steps=steps, nd=nd)
    decode = DecodeGraphs(draft, w, topk, steps)
    w.cuda_graph_runner_for_draft_extend = ExtendGraphs(model, nd)
    plans = dict(model.proc.dv_head._plans)
    g = torch.Generator().manual_seed(topk)
    for seed, rows in enumerate([[3, 1, 4], [5], [2, 6], [7, 3, 2, 1], [1, 2], [4]]):
        model.rewrite(sorted(set(torch.randperm(8, generator=g)[:3].tolist()) | {rows[0]}), g)
        rows = torch.tensor(rows)
        raw, bucket = rows.shape[0], bucket_of(rows.shape[0])
        predict, hidden, accept = round_inputs(model, rows, nd, 100 + seed)
        nxt = extend_for_decode(ew, draft, monkeypatch, w, rows, predict, hidden, accept)
        extend_plan = plans[(bucket, 1)]
        assert nxt.topk_index.tolist() == expected_extend(model, rows, predict, hidden, accept, nd, extend_plan, topk)
        parents, scores, tokens = decode.replay(rows, nxt.topk_p, nxt.topk_index, nxt.hidden_states)
        decode_plan = plans[(bucket, topk)]
        # the eager reference: the same copy, without graphs, with the bucket's plan at the raw shape
        model.force_plans({(raw, topk): decode_plan})
        fb = loop.decode_batch(model, rows, nxt.hidden_states, nxt.topk_p, nxt.topk_index, steps, topk)
        want = draft.draft_forward(w, fb)
        model.proc.dv_head._plans.clear()
        model.proc.dv_head._plans.update(plans)
        assert torch.equal(tokens, want[2]) and torch.equal(parents, want[0]) and torch.equal(scores, want[1])
        for b, r in enumerate(rows.tolist()):
            if topk == 1:
                first = int(nxt.topk_index[b, 0])
                h = torch.tanh(nxt.hidden_states[b] @ model.A + model.E[first])
                assert tokens[b].tolist() == [first] + model.chain(h, r, decode_plan, steps - 1)
            if decode_plan != "stock" and extend_plan != "stock":
                assert set(tokens[b].tolist()) <= set(model.sets[r])


@pytest.mark.parametrize("d2t", [False, True], ids=["full", "d2t"])
@pytest.mark.parametrize("plan", ["per-request", "union-indexed", "union-gemm", "stock"])
def test_a_processor_replay_sees_the_table_slots_and_hidden_rows_written_in_place(ew, plan, d2t):
    """The compact processor's logits (``_get_logits``, what the draft model's forward calls) captured once for 3
    requests of 2 rows; then new sets, slots and hidden rows written in place before each replay. The replayed
    logits equal an eager call's on the new values, and their eager top-k (``draft_topk`` and ``draft_topk1`` with
    the call's key, as the draft extend reads them) are the plain ranking over each request's new set."""
    bs, n, k = 3, 2, 2
    model = GModel(d2t=d2t, seed=20 + d2t)
    model.force_plans({(bs, n): plan})
    g = torch.Generator().manual_seed(1)
    hidden, rows = torch.randn(bs * n, D, generator=g, dtype=torch.float64), torch.tensor([1, 4, 6])
    graph, logits = capture(lambda: model.compact(hidden, rows))
    for _ in range(4):
        slots = torch.randperm(7, generator=g)[:bs] + 1
        model.rewrite(sorted(set(slots.tolist()) | set(rows.tolist())), g)
        rows.copy_(slots)
        hidden.copy_(torch.randn(bs * n, D, generator=g, dtype=torch.float64))
        graph.replay()
        got = logits.clone()
        probs, tokens = model.proc.draft_topk(got, k, rows, head_key=(bs, n))
        _, top1 = model.proc.draft_topk1(got, rows, head_key=(bs, n))
        assert torch.equal(got, model.compact(hidden, rows))
        assert torch.equal(tokens, model.proc.draft_topk(got, k, rows)[1]) and torch.all(probs > 0)
        for m, r in enumerate(rows.repeat_interleave(n).tolist()):
            assert tokens[m].tolist() == model.ranked(hidden[m], r, plan)[:k]
            assert int(top1[m, 0]) == int(tokens[m, 0])


@pytest.mark.parametrize(
    "probe",
    REVIEW_PROBES,
    ids=["tolist", "nonzero", "mask-index"],
)
def test_the_reviews_probe_in_the_head_fails_the_graph_runners_captures(ew, draft, monkeypatch, probe):
    """The review's probe (``rows.tolist(); (rows >= 0).nonzero(); hidden[mask]`` inside ``DraftHead.__call__``)
    left every test above green; each of its lines now fails both graph runners' captures (the extend's, the
    decode's), so those tests would fail too."""
    from sglang_specvocab.head import DraftHead

    read, names = probe
    real = DraftHead.__call__

    def probed(self, hidden, rows, weight=None):
        read(hidden, rows)
        return real(self, hidden, rows, weight)

    model = GModel(d2t=False)
    w = loop.make_worker(ew, model, compact=True, topk=2, steps=3, nd=6)
    ExtendGraphs(model, 6)  # without the probe: captured
    DecodeGraphs(draft, w, 2, 3)
    monkeypatch.setattr(DraftHead, "__call__", probed)
    with pytest.raises(HostSyncInCapture, match=names):
        ExtendGraphs(model, 6)
    with pytest.raises(HostSyncInCapture, match=names):
        DecodeGraphs(draft, w, 2, 3)


def test_a_host_sync_in_a_captured_head_is_caught(ew, draft):
    """The emulation is strict: reading a tensor on the host inside a capture (a GPU capture error) raises."""
    model = GModel(d2t=False)
    rows = torch.tensor([1, 2])
    h = torch.randn(2, D, dtype=torch.float64)
    capture(lambda: model.compact(h, rows))  # the head itself: no host read
    with pytest.raises(HostSyncInCapture):
        capture(lambda: model.proc.check_table())  # a debugging check that reads the table on the host


def test_sglang_runner_records_the_replayed_bucket(ew):
    """The decode extend names the replayed graph by ``cuda_graph_runner_for_draft_extend.bs``: SGLang's runner
    sets it to the padded bucket before each replay, and captures the head on one row per request."""
    import inspect

    from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import EAGLEDraftExtendCudaGraphRunner as G

    execute = inspect.getsource(G.execute)
    assert "bs = self._pad_to_bucket(raw_bs, self.capture_bs)" in execute and "self.bs = bs" in execute
    assert execute.index("self.bs = bs") < execute.index("self._replay_graph(")
    assert "num_tokens_for_logprob = bs" in inspect.getsource(G.capture_one_shape)
