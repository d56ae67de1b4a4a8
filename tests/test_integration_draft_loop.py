"""The copied draft loop (``copies/from-sglang/dynvocab_draft.py``) executed on CPU with a faked draft runner.

A tiny deterministic draft model, ``h' = tanh(h @ A + E[token])``, head ``W[V, d]`` (fp64), runs in two
ways on the same inputs:

- DYNVOCAB: the copied ``draft_forward`` / ``draft_extend_for_decode`` with the real compact
  processor (``DynVocabLogitsProcessor.wrap`` over a ``CandidateTable``; its ``_get_logits`` gives the
  ``[N, W]`` logits, its ``draft_topk`` the top-k);
- upstream: SGLang's own ``EagleDraftWorker.draft_forward`` / ``_draft_extend_for_decode`` with a
  full-width head whose logits outside each request's set are ``-inf`` and ``hot_token_id = None``.

Both must give the same ``draft_tokens``, ``parent_list`` and ``top_scores_index`` (and the same
per-step input ids, cache locations and positions), and the chain (topk = 1) must be the greedy chain
restricted to each request's set, computed in plain Python. SGLang's helpers are the real ones
(``select_top_k_tokens``, ``organize_draft_results``, ``per_step_draft_out_cache_loc``,
``forward_context``, ``renorm_draft_probs``, ``fast_topk``). Stand-ins: ``get_spec`` (no server
args: rejection sampling off), ``torch.compile`` of ``_select_top_k_tokens_later`` run eagerly
(``set_stance("force_eager")``, same Python code: no C++ compile on the CI box), and, for the decode
draft extend, ``prepare_for_draft_extend`` (it builds a real ``ForwardBatch`` from a ``ScheduleBatch``)
replaced in both runs by a stand-in that returns the predicted ids, the rows and the extend input.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
from helpers import Mode

pytestmark = pytest.mark.sglang

V, D, R, CAP = 40, 8, 6, 12
ROWS = [3, 1, 4]  # request slots (row 0: SGLang's padding row, never a request's)
SETS = {  # distinct sizes: columns past a row's count are -inf in the compact logits
    1: [2, 5, 7, 11, 13, 17, 19, 23, 29, 31],
    3: [0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 38, 39],
    4: [1, 3, 6, 9, 14, 21, 27, 33],
}


@pytest.fixture(scope="module")
def ew(torchvision_standin):
    from sglang.srt.speculative import eagle_worker_v2

    return eagle_worker_v2


@pytest.fixture(scope="module")
def draft(ew):
    from sglang_specvocab.copies import load_copy

    return load_copy("dynvocab_draft")


@pytest.fixture(autouse=True)
def _eager_and_spec(ew, monkeypatch):
    monkeypatch.setattr(ew, "get_spec", lambda: SimpleNamespace(speculative_use_rejection_sampling=False))
    with torch.compiler.set_stance("force_eager"):
        yield


class Model:
    """The fake draft model and both heads over one candidate table."""

    def __init__(self, seed=0, table=None):
        """Over ``table`` (a policy's, shared) when given, else a table holding ``SETS``."""
        from sglang_specvocab.config import HeadSection
        from sglang_specvocab.integration import logits as L
        from sglang_specvocab.table import CandidateTable
        from sglang_specvocab.vocab import VocabSpace

        g = torch.Generator().manual_seed(seed)
        self.A = torch.randn(D, D, generator=g, dtype=torch.float64) * 0.7
        self.E = torch.randn(V, D, generator=g, dtype=torch.float64)
        self.W = torch.randn(V, D, generator=g, dtype=torch.float64) * 2.0
        if table is None:
            table = CandidateTable(R, CAP, fallback_id=0)
            rows = torch.tensor(list(SETS))
            cand = torch.full((len(SETS), CAP), -1, dtype=torch.int64)
            for i, s in enumerate(SETS.values()):
                cand[i, : len(s)] = torch.tensor(s)[torch.randperm(len(s), generator=g)]  # assign sorts them
            table.assign(rows, cand)
            assert all(table.row(r) == s for r, s in SETS.items())
        self.table = table
        original = torch.nn.Module()
        original.logit_scale, original.final_logit_softcapping = None, None
        self.lm_head = SimpleNamespace(weight=self.W, tp_size=1)
        self.proc = L.DynVocabLogitsProcessor.wrap(
            original,
            self.lm_head,
            self.table,
            HeadSection(kernel="torch"),
            space=VocabSpace.build(V, fallback_id=self.table.fallback_id),
        )

    @property
    def mask(self):
        """``[R, V]``: 0 on each row's current set, ``-inf`` elsewhere (read from the table when used)."""
        mask = torch.full((self.table.ids.shape[0], V), float("-inf"), dtype=torch.float32)
        for r in range(mask.shape[0]):
            mask[r, self.table.row(r)] = 0.0
        return mask

    def step(self, tokens, hidden):
        return torch.tanh(hidden @ self.A + self.E[tokens.long()])

    def compact(self, h, rows):
        """The real compact processor's ``_get_logits`` (what the draft model's forward would call)."""
        self.proc._dv_rows = rows
        try:
            return self.proc._get_logits(h, self.lm_head, SimpleNamespace(extend_return_logprob=False))
        finally:
            self.proc._dv_rows = None

    def full(self, h, rows):
        """Upstream's head: ``[N, V]`` fp32, ``-inf`` outside each request's set."""
        n = h.shape[0] // rows.shape[0]
        return (h @ self.W.T).float() + self.mask[rows.repeat_interleave(n)]


class Runner:
    """``draft_runner``: ``forward(fb).logits_output``; records what each forward was fed."""

    def __init__(self, model, compact, arch="LlamaForCausalLMEagle3"):
        self.m, self.compact = model, compact
        self.model_config = SimpleNamespace(hf_config=SimpleNamespace(architectures=[arch]), model_is_mrope=False)
        self.canary_manager = None
        self.calls = []

    def forward(self, fb):
        from sglang.srt.model_executor.forward_context import get_forward_context

        ctx_backend = get_forward_context().attn_backend if fb.forward_mode.name == "decode" else None
        self.calls.append(
            (
                fb.input_ids.clone(),
                fb.out_cache_loc.clone() if fb.out_cache_loc is not None else None,
                fb.positions.clone() if fb.positions is not None else None,
                ctx_backend,
                self.m.proc.dv_step,
            )
        )
        h = self.m.step(fb.input_ids, fb.spec_info.hidden_states)
        if fb.forward_mode.name == "extend":  # CaptureHiddenMode.LAST: each request's last position only
            h = h[torch.cumsum(fb.extend_seq_lens, dim=0) - 1]
        rows = fb.req_pool_indices
        logits = self.m.compact(h, rows) if self.compact else self.m.full(h, rows)
        return SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=logits, hidden_states=h))


class FBMode(Mode):
    def __init__(self, name):
        super().__init__(False)
        self.name = name


def make_worker(ew, model, *, compact, topk, steps, nd, max_bs=8):
    w = object.__new__(ew.EagleDraftWorker)
    w.topk, w.speculative_num_steps, w.speculative_num_draft_tokens = topk, steps, nd
    w.hot_token_id = None
    w.device = "cpu"
    w.index_share_for_mtp_iteration = False
    w.seed_dsa_topk_from_draft_extend = False
    w.plan_stream, w.plan_stream_ctx = None, contextlib.nullcontext()
    w.cuda_graph_runner_for_draft_extend = None
    w.draft_runner = Runner(model, compact)
    w.draft_attn_backend = SimpleNamespace(attn_backends=[f"backend{i}" for i in range(steps)])
    w.dynvocab_proc = model.proc
    # base_spec_worker's topk=1 preallocations (same formula)
    parent_width = steps if steps > 1 else 0
    w._topk1_parents_prealloc = torch.arange(-1, parent_width - 1, dtype=torch.long).repeat(max_bs, 1)
    w._topk1_score_indices_prealloc = torch.arange(steps, dtype=torch.long).repeat(max_bs, 1)
    w._draft_forward_idle = lambda fb, spec: pytest.fail("not idle")
    return w


def first_topk(ew, model, h0, rows, topk, *, compact):
    """The draft extend's top-k that seeds ``draft_forward``: ``draft_topk`` / upstream's own."""
    if compact:
        return model.proc.draft_topk(model.compact(h0, rows), topk, rows)
    logits = model.full(h0, rows)
    if topk == 1:  # upstream's CPU draft extend: argmax, p = 1
        idx = torch.argmax(logits, dim=-1, keepdim=True)
        return torch.ones_like(idx, dtype=torch.float32), idx
    probs = ew.renorm_draft_probs(logits, None, False)
    return ew.fast_topk(probs, topk, dim=-1)


def decode_batch(model, rows, h0, topk_p, topk_index, steps, topk, seed=1):
    bs = rows.shape[0]
    g = torch.Generator().manual_seed(seed)
    return SimpleNamespace(
        spec_info=SimpleNamespace(topk_p=topk_p, topk_index=topk_index, hidden_states=h0),
        out_cache_loc=torch.randperm(1000, generator=g)[: bs * topk * steps],
        batch_size=bs,
        positions=torch.arange(bs * topk, dtype=torch.int64) * 7 + 20,
        req_pool_indices=rows,
        input_ids=None,
        forward_mode=FBMode("decode"),
        moe_num_token_non_padded=None,
        sampling_info=SimpleNamespace(is_all_greedy=True),
    )


def run_draft_forward(ew, draft, model, *, compact, topk, steps, nd, rows, h0, max_bs=8):
    w = make_worker(ew, model, compact=compact, topk=topk, steps=steps, nd=nd, max_bs=max_bs)
    p, idx = first_topk(ew, model, h0, rows, topk, compact=compact)
    fb = decode_batch(model, rows, h0, p, idx, steps, topk)
    fn = draft.draft_forward if compact else ew.EagleDraftWorker.draft_forward
    out = fn(w, fb)
    return out, w.draft_runner.calls, fb, (p, idx)


def greedy_chain(model, rows, h0, steps, *, restricted=True):
    """Plain-Python reference: each request's greedy draft chain over its own set (or the vocabulary)."""
    chains = []
    for b, r in enumerate(rows.tolist()):
        allowed = SETS[r] if restricted else range(V)
        h, chain = h0[b], []
        for _ in range(steps):
            if chain:
                h = torch.tanh(h @ model.A + model.E[chain[-1]])
            chain.append(max(((float(h @ model.W[v]), v) for v in allowed), key=lambda s: (s[0], -s[1]))[1])
        chains.append(chain)
    return chains


def hidden0(bs, seed=5):
    return torch.randn(bs, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("max_bs", [8, 2], ids=["prealloc", "organize"])
@pytest.mark.parametrize("steps", [1, 3, 5])
def test_chain_is_greedy_over_each_set_and_matches_upstream(ew, draft, steps, max_bs):
    model = Model()
    rows = torch.tensor(ROWS)
    h0 = hidden0(len(ROWS))
    nd = steps + 1
    got, calls, fb, _ = run_draft_forward(
        ew, draft, model, compact=True, topk=1, steps=steps, nd=nd, rows=rows, h0=h0, max_bs=max_bs
    )
    want, ucalls, ufb, _ = run_draft_forward(
        ew, draft, model, compact=False, topk=1, steps=steps, nd=nd, rows=rows, h0=h0, max_bs=max_bs
    )
    parent_list, top_scores_index, draft_tokens, draft_probs = got
    assert draft_probs is None and want[3] is None
    assert draft_tokens.tolist() == greedy_chain(model, rows, h0, steps)
    assert draft_tokens.tolist() != greedy_chain(model, rows, h0, steps, restricted=False)  # the sets matter
    for b, r in enumerate(ROWS):  # every draft token is in its request's set
        assert set(draft_tokens[b].tolist()) <= set(SETS[r])
    assert torch.equal(draft_tokens, want[2])
    assert torch.equal(parent_list, want[0]) and torch.equal(top_scores_index, want[1])
    assert len(calls) == len(ucalls) == steps - 1
    for c, u in zip(calls, ucalls, strict=True):
        assert torch.equal(c[0], u[0]) and torch.equal(c[1], u[1]) and torch.equal(c[2], u[2]) and c[3] == u[3]
    assert [c[4] for c in calls] == list(range(1, steps))  # proc.dv_step = i + 1 before step i's forward
    assert torch.equal(fb.positions, ufb.positions)


@pytest.mark.parametrize("topk,steps,nd", [(2, 3, 6), (3, 4, 8), (3, 2, 4), (4, 3, 10), (2, 1, 2)])
def test_tree_matches_upstream_on_masked_full_logits(ew, draft, topk, steps, nd):
    model = Model(seed=topk * 10 + steps)
    rows = torch.tensor(ROWS)
    h0 = hidden0(len(ROWS), seed=topk + steps)
    got, calls, fb, (p, idx) = run_draft_forward(
        ew, draft, model, compact=True, topk=topk, steps=steps, nd=nd, rows=rows, h0=h0
    )
    want, ucalls, ufb, (up, uidx) = run_draft_forward(
        ew, draft, model, compact=False, topk=topk, steps=steps, nd=nd, rows=rows, h0=h0
    )
    # the seed top-k: draft_topk (probabilities over the set, target ids) == upstream's softmax + fast_topk
    assert torch.equal(idx, uidx) and torch.allclose(p, up, rtol=1e-5, atol=1e-7)
    parent_list, top_scores_index, draft_tokens, draft_probs = got
    assert draft_probs is None
    assert torch.equal(draft_tokens, want[2]), (draft_tokens, want[2])
    assert torch.equal(parent_list, want[0])
    assert torch.equal(top_scores_index, want[1])
    assert draft_tokens.shape == (len(ROWS), nd - 1)
    for b, r in enumerate(ROWS):
        assert set(draft_tokens[b].tolist()) <= set(SETS[r])
    assert len(calls) == len(ucalls) == steps - 1
    for c, u in zip(calls, ucalls, strict=True):
        assert torch.equal(c[0], u[0]) and torch.equal(c[1], u[1]) and torch.equal(c[2], u[2]) and c[3] == u[3]
    assert torch.equal(fb.positions, ufb.positions)


def test_idle_batch_goes_to_draft_forward_idle(ew, draft):
    model = Model()
    w = make_worker(ew, model, compact=True, topk=2, steps=3, nd=6)
    seen = []
    w._draft_forward_idle = lambda fb, spec: seen.append((fb, spec)) or (None, None, None, None)
    fb = SimpleNamespace(forward_mode=Mode(True), spec_info="spec")
    assert draft.draft_forward(w, fb) == (None, None, None, None) and seen == [(fb, "spec")]


# --- the decode draft extend, eager path ------------------------------------------------------------


def extend_for_decode(ew, fn, w, monkeypatch, *, rows, predict, hidden, accept_lens):
    """``fn(w, batch, result)`` (a decode draft extend: the copy or upstream's) after a verify round that predicted
    ``predict`` with ``hidden`` and accepted ``accept_lens``; ``prepare_for_draft_extend`` is a stand-in that
    checks what it is handed (the worker's runners, int64 ids). Returns the next draft input."""
    from sglang.srt.speculative.eagle_info import EagleDraftExtendInput

    seen = {}

    def prepare(draft_extend_input, batch, next_token_ids, num_draft_tokens, runner, graph_runner, **kw):
        assert isinstance(draft_extend_input, EagleDraftExtendInput)
        assert graph_runner is w.cuda_graph_runner_for_draft_extend and runner is w.draft_runner
        assert num_draft_tokens == w.speculative_num_draft_tokens
        seen["dtype"] = next_token_ids.dtype
        batch.spec_info = draft_extend_input
        return SimpleNamespace(
            input_ids=next_token_ids,
            spec_info=draft_extend_input,
            req_pool_indices=batch.req_pool_indices,
            out_cache_loc=None,
            positions=None,
            forward_mode=FBMode("draft_extend"),
        )

    monkeypatch.setattr(ew, "prepare_for_draft_extend", prepare)
    bs = rows.shape[0]
    batch = SimpleNamespace(
        seq_lens=torch.full((bs,), 30), req_pool_indices=rows, sampling_info=SimpleNamespace(temperatures=None)
    )
    nxt = SimpleNamespace()
    result = SimpleNamespace(
        prepared_draft_extend_inputs=None,
        accept_lens=accept_lens,
        next_token_ids=predict.to(torch.int32),
        logits_output=SimpleNamespace(hidden_states=hidden),
        next_draft_input=nxt,
    )
    fn(w, batch, result)
    assert seen["dtype"] == torch.int64
    return nxt


def run_extend_for_decode(ew, draft, monkeypatch, model, *, compact, topk, nd, rows, predict, hidden, accept_lens):
    w = make_worker(ew, model, compact=compact, topk=topk, steps=3, nd=nd)
    fn = draft.draft_extend_for_decode if compact else ew.EagleDraftWorker._draft_extend_for_decode
    nxt = extend_for_decode(ew, fn, w, monkeypatch, rows=rows, predict=predict, hidden=hidden, accept_lens=accept_lens)
    assert len(w.draft_runner.calls) == 1
    assert w.draft_runner.calls[0][4] == 0  # proc.dv_step = 0 in the draft extend
    return nxt


@pytest.mark.parametrize("topk", [1, 3])
def test_draft_extend_for_decode_eager_matches_upstream(ew, draft, monkeypatch, topk):
    model = Model(seed=7)
    rows = torch.tensor(ROWS)
    bs, nd = len(ROWS), 4
    g = torch.Generator().manual_seed(11)
    predict = torch.tensor([SETS[r][j] for r in ROWS for j in torch.randint(0, 8, (nd,), generator=g).tolist()])
    hidden = torch.randn(bs * nd, D, generator=g, dtype=torch.float64)
    accept_lens = torch.tensor([2, 4, 1], dtype=torch.int32)
    same = dict(topk=topk, nd=nd, rows=rows, predict=predict, hidden=hidden, accept_lens=accept_lens)
    got = run_extend_for_decode(ew, draft, monkeypatch, model, compact=True, **same)
    want = run_extend_for_decode(ew, draft, monkeypatch, model, compact=False, **same)
    assert torch.equal(got.topk_index, want.topk_index)
    assert torch.equal(got.hidden_states, want.hidden_states) and got.hidden_states.shape == (bs, D)
    assert got.cuda_graph_compatible is True
    if topk > 1:
        assert torch.allclose(got.topk_p, want.topk_p, rtol=1e-5, atol=1e-7)
    # plain reference: each request's last accepted row, top-k over its set
    for b, r in enumerate(ROWS):
        m = b * nd + int(accept_lens[b]) - 1
        h = torch.tanh(hidden[m] @ model.A + model.E[predict[m]])
        ranked = sorted(SETS[r], key=lambda v: (-float(h @ model.W[v]), v))
        assert got.topk_index[b].tolist() == ranked[:topk]
        assert torch.equal(got.hidden_states[b], h)
