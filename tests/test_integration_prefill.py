"""The prefill path on CPU: the copied ``_forward_prefill_batch`` (``copies/.../dynvocab_worker.py``)
and the copied ``draft_extend_for_prefill`` (``copies/.../dynvocab_draft.py``), end to end through
the real ``DynVocabWorkerV2`` / ``DynVocabDraftWorker`` methods, the real window policy and the real
compact processor.

The target forward is a recorded stand-in (``forward_batch_generation`` returns fixed hidden states,
last hidden states, next tokens and a KV plan); the draft model is the fake of
``test_integration_draft_loop`` (``h' = tanh(h @ A + E[token])``, last position per request);
``ForwardBatch.init_new`` is replaced, in both runs, by a stand-in built from the batch. Checked:

- the policy is seeded from the *unrotated* prompt ids and the target's top-K of every prompt
  position, exactly as the literal MicroSpec window (slot reuse resets, a later chunk appends);
- the first draft top-k of every request is the plain-Python top-k over its freshly seeded set;
- everything else equals upstream ``EAGLEWorkerV2._forward_prefill_batch`` +
  ``EagleDraftWorker._draft_extend_for_prefill`` with a full-width head masked to the same sets:
  rotated ids (chunked-prefill tail token, multimodal embeddings), top-k ids and probabilities,
  hidden states, ``new_seq_lens``, the publish fence, the KV plan handed to the draft and cleared.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
from helpers import GenerationPool, Mode, sglang_req, window_config
from literal import LiteralWindow

pytestmark = pytest.mark.sglang

HT = 6  # the target's hidden size (its LM head input)
CAP, KPRE = 12, 2


@pytest.fixture(scope="module")
def mods(torchvision_standin):
    import test_integration_draft_loop as loop
    from sglang.srt.speculative import eagle_worker_v2

    from sglang_specvocab.integration import worker

    return SimpleNamespace(ew=eagle_worker_v2, W=worker, loop=loop)


@pytest.fixture(autouse=True)
def _stand_ins(mods, monkeypatch):
    ew = mods.ew
    monkeypatch.setattr(ew, "get_spec", lambda: SimpleNamespace(speculative_use_rejection_sampling=False))
    init_calls = []

    def init_new(batch, runner, capture_hidden_mode=None, return_hidden_states_before_norm=None, kv_loc_plan=None):
        init_calls.append((capture_hidden_mode, kv_loc_plan, return_hidden_states_before_norm))
        return SimpleNamespace(
            input_ids=batch.input_ids,
            spec_info=batch.spec_info,
            req_pool_indices=batch.req_pool_indices,
            extend_seq_lens=torch.tensor(batch.extend_lens),
            forward_mode=mods.loop.FBMode("extend"),
            out_cache_loc=None,
            positions=None,
            batch_size=len(batch.reqs),
        )

    monkeypatch.setattr(ew, "ForwardBatch", SimpleNamespace(init_new=init_new))
    # MoE backend switches read the server's global flags (absent here); they do nothing for a dense draft.
    monkeypatch.setattr(ew, "speculative_moe_backend_context", contextlib.nullcontext)
    monkeypatch.setattr(ew, "speculative_moe_a2a_backend_context", contextlib.nullcontext)
    return init_calls


class Target:
    """``target_worker``: ``forward_batch_generation`` returns recorded outputs, one per call."""

    def __init__(self, weight):
        self.outputs = []
        self.calls = []
        self.model_runner = SimpleNamespace(
            model_config=SimpleNamespace(vocab_size=None), model=SimpleNamespace(lm_head=SimpleNamespace(weight=weight))
        )

    def forward_batch_generation(
        self, batch, pp_proxy_tensors=None, capture_hidden_mode=None, return_kv_loc_plan=False
    ):
        self.calls.append((capture_hidden_mode, return_kv_loc_plan, batch.input_ids.clone()))
        return self.outputs.pop(0)


def target_output(n, bs, seed, *, mm=False):
    g = torch.Generator().manual_seed(seed)
    return dict(
        last_hidden_states=torch.randn(n, HT, generator=g, dtype=torch.float64),
        next_token_ids=torch.randint(0, 40, (bs,), generator=g),
        mm_input_embeds=torch.randn(n, 3, generator=g) if mm else None,
        seed=seed,
    )


def as_batch_output(rec, draft_dim):
    g = torch.Generator().manual_seed(rec["seed"] + 1000)
    n = rec["last_hidden_states"].shape[0]
    lo = SimpleNamespace(
        hidden_states=torch.randn(n, draft_dim, generator=g, dtype=torch.float64),  # the aux hidden states
        last_hidden_states=rec["last_hidden_states"],
        mm_input_embeds=rec["mm_input_embeds"],
    )
    return SimpleNamespace(logits_output=lo, next_token_ids=rec["next_token_ids"].clone(), kv_loc_plan="kv-plan")


def req(rid, row, ids, extend_end=None):
    return sglang_req(rid, row, ids, extend_end=extend_end)


def req_out(rid, row, ids, output):
    return sglang_req(rid, row, ids, output=output)


def schedule_batch(reqs, ids, prefix_lens, extend_lens, *, chunked=None, next_prompt_token=None):
    return SimpleNamespace(
        reqs=reqs,
        input_ids=torch.tensor(ids, dtype=torch.int64),
        req_pool_indices=torch.tensor([r.kv.req_pool_idx for r in reqs]),
        extend_lens=list(extend_lens),
        prefix_lens=list(prefix_lens),
        seq_lens=torch.tensor([p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]),
        forward_mode=Mode(),
        sampling_info=SimpleNamespace(temperatures=None),
        chunked_req=chunked,
        chunked_req_next_prompt_token=next_prompt_token,
        global_num_tokens=None,
        spec_info=None,
    )


def clone_batch(b):
    c = SimpleNamespace(**vars(b))
    c.input_ids = b.input_ids.clone()
    return c


class Setup:
    """Both stacks over one window policy's table: ours (DYNVOCAB) and upstream's (masked full head)."""

    def __init__(self, mods, topk, seed=0):
        from sglang_specvocab.integration.telemetry import Gauges, Telemetry
        from sglang_specvocab.policies import build_policy

        loop, W, ew = mods.loop, mods.W, mods.ew
        self.mods, self.topk = mods, topk
        self.policy = build_policy(window_config(CAP, KPRE, KPRE), num_rows=loop.R, fallback_id=0)
        self.model = loop.Model(seed=seed, table=self.policy.table)
        g = torch.Generator().manual_seed(seed + 1)
        self.target_weight = torch.randn(loop.V, HT, generator=g, dtype=torch.float64)
        steps, nd = 3, 4 if topk == 1 else 6

        base = loop.make_worker(ew, self.model, compact=True, topk=topk, steps=steps, nd=nd)
        dw = object.__new__(W.DynVocabDraftWorker)
        dw.__dict__.update(vars(base))
        dw.dynvocab_policy = self.policy
        dw.dynvocab_telemetry = Telemetry(loop.R)
        dw.parallel_layout = SimpleNamespace(tp_group=None, local_dp=True)
        self.draft_worker = dw
        self.target = Target(self.target_weight)
        self.target.model_runner.model_config.vocab_size = loop.V
        dw.dynvocab_target_head = W.prefill_head(self.target.model_runner.model.lm_head, None)
        w = object.__new__(W.DynVocabWorkerV2)
        w._draft_worker, w._target_worker = dw, self.target
        w.speculative_algorithm = SimpleNamespace(is_standalone=lambda: False)
        w.topk, w.speculative_num_draft_tokens = topk, nd
        w.req_to_token_pool = GenerationPool(loop.R)
        w._dv_seen = w._dv_fed = None
        w._dv_live, w._dv_row_rid = {}, {}
        w.dynvocab_gauges = Gauges(False)
        self.worker = w

        # upstream: SGLang's own classes, a full-width head masked to the same (live) table rows
        ubase = loop.make_worker(ew, self.model, compact=False, topk=topk, steps=steps, nd=nd)
        ubase.speculative_algorithm = w.speculative_algorithm
        ubase.parallel_layout = dw.parallel_layout
        self.upstream_target = Target(self.target_weight)
        uw = object.__new__(ew.EAGLEWorkerV2)
        uw._draft_worker, uw._target_worker = ubase, self.upstream_target
        uw.speculative_algorithm = w.speculative_algorithm
        self.upstream = uw

    def run(self, batch, rec, publish=None):
        self.target.outputs.append(as_batch_output(rec, self.mods.loop.D))
        return self.worker._forward_prefill_batch(batch, on_publish=publish)

    def run_upstream(self, batch, rec, publish=None):
        self.upstream_target.outputs.append(as_batch_output(rec, self.mods.loop.D))
        return self.upstream._forward_prefill_batch(batch, on_publish=publish)


def target_topk(setup, hidden, k=KPRE):
    return [
        sorted(range(setup.mods.loop.V), key=lambda v, h=h: (-float(h @ setup.target_weight[v]), v))[:k] for h in hidden
    ]


def expected_first_topk(setup, out, extend_lens, tails, topk):
    """Plain Python: each request's last rotated position through the fake draft, top-k over its set."""
    m = setup.model
    hidden = out.logits_output.hidden_states
    ends = torch.cumsum(torch.tensor(extend_lens), 0) - 1
    res = []
    for end, tail, r in zip(ends.tolist(), tails, setup.rows, strict=True):
        h = torch.tanh(hidden[end] @ m.A + m.E[tail])
        s = setup.policy.table.row(r)
        res.append(sorted(s, key=lambda v, h=h: (-float(h @ m.W[v]), v))[:topk])
    return res


@pytest.mark.parametrize("mm", [False, True], ids=["text", "mm"])
@pytest.mark.parametrize("topk", [1, 3])
def test_prefill_seeds_policy_then_draft_extend_reads_it_and_matches_upstream(mods, _stand_ins, topk, mm):
    s = Setup(mods, topk, seed=topk + 2 * mm)
    V = mods.loop.V
    g = torch.Generator().manual_seed(40 + topk)
    prompts = {
        3: torch.randint(0, V, (7,), generator=g).tolist(),
        1: torch.randint(0, V, (4,), generator=g).tolist(),
        4: torch.randint(0, V, (9,), generator=g).tolist(),
    }
    s.rows = list(prompts)
    reqs = [req(f"r{r}", r, p) for r, p in prompts.items()]
    for r in prompts:
        s.worker.req_to_token_pool.alloc(r)
    ids = [t for p in prompts.values() for t in p]
    lens = [len(p) for p in prompts.values()]
    batch = schedule_batch(reqs, ids, [0] * 3, lens)
    ubatch = clone_batch(batch)
    rec = target_output(len(ids), 3, seed=5 + topk, mm=mm)
    published, upublished = [], []

    out = s.run(batch, rec, published.append)

    # the target ran once on the unrotated ids, FULL capture, asked for the KV plan
    assert len(s.target.calls) == 1
    mode, want_plan, seen_ids = s.target.calls[0]
    assert mode == mods.ew.CaptureHiddenMode.FULL and want_plan is True and seen_ids.tolist() == ids
    # the policy: the literal window over the unrotated prompt and the target top-K of every position
    pos = 0
    for r, p in prompts.items():
        lw = LiteralWindow(CAP, KPRE, KPRE, ["context", "extension"])
        lw.prefill(p, target_topk(s, rec["last_hidden_states"][pos : pos + len(p)]))
        pos += len(p)
        assert s.policy.table.row(r) == lw.active(), f"row {r}"
    # the draft extend: rotated ids (tail = the target's next token), dv_step 0, LAST capture, the plan
    tails = rec["next_token_ids"].tolist()
    rotated = [t for p, tail in zip(prompts.values(), tails, strict=True) for t in p[1:] + [tail]]
    calls = s.draft_worker.draft_runner.calls
    assert len(calls) == 1 and calls[0][0].tolist() == rotated and calls[0][4] == 0
    assert _stand_ins[0] == (mods.ew.CaptureHiddenMode.LAST, "kv-plan", False)
    nxt = out.next_draft_input
    assert nxt.topk_index.tolist() == expected_first_topk(s, out, lens, tails, topk)
    for b, r in enumerate(prompts):
        assert set(nxt.topk_index[b].tolist()) <= set(s.policy.table.row(r))
    assert nxt.draft_probs is None and nxt.cuda_graph_compatible is True
    assert torch.equal(nxt.bonus_tokens, rec["next_token_ids"])
    assert out.kv_loc_plan is None and out.new_seq_lens is batch.seq_lens
    assert published == [batch.seq_lens]

    # upstream on the same inputs and the same (seeded) sets
    uout = s.run_upstream(ubatch, rec, upublished.append)
    unxt = uout.next_draft_input
    assert torch.equal(nxt.topk_index, unxt.topk_index)
    assert torch.allclose(nxt.topk_p, unxt.topk_p.to(nxt.topk_p.dtype), rtol=1e-5, atol=1e-7)
    assert torch.equal(nxt.hidden_states, unxt.hidden_states)
    assert torch.equal(batch.input_ids, ubatch.input_ids)
    ucalls = s.upstream._draft_worker.draft_runner.calls
    assert torch.equal(calls[0][0], ucalls[0][0])
    assert _stand_ins[1] == _stand_ins[0]
    assert uout.kv_loc_plan is None and upublished == [ubatch.seq_lens]
    assert s.target.calls[0][:2] == s.upstream_target.calls[0][:2]
    if mm:
        # the multimodal embeddings are rotated like the ids (the last position filled by the draft itself)
        n = len(ids)
        got = s.draft_worker.draft_runner.mm_seen
        want = s.upstream._draft_worker.draft_runner.mm_seen
        starts = [0] + torch.cumsum(torch.tensor(lens), 0).tolist()[:-1]
        for st, ln in zip(starts, lens, strict=True):
            assert torch.equal(got[st : st + ln - 1], rec["mm_input_embeds"][st + 1 : st + ln])
            assert torch.equal(got[st : st + ln - 1], want[st : st + ln - 1])
        assert got.shape == (n, 3)


@pytest.fixture(autouse=True)
def _record_mm(mods, monkeypatch):
    """The runner also keeps the forward batch's multimodal embeddings (set by the draft extend)."""
    loop = mods.loop
    original = loop.Runner.forward

    def forward(self, fb):
        self.mm_seen = getattr(fb, "mm_input_embeds", None)
        return original(self, fb)

    monkeypatch.setattr(loop.Runner, "forward", forward)


def test_chunked_prefill_tail_token_slot_reuse_and_second_chunk(mods, _stand_ins):
    """A chunked request's tail is its next prompt token (upstream's rule); its next chunk appends to
    the same row; a slot given to a new request is reset first."""
    s = Setup(mods, topk=2, seed=11)
    V = mods.loop.V
    g = torch.Generator().manual_seed(77)
    long_prompt = torch.randint(0, V, (10,), generator=g).tolist()
    short = torch.randint(0, V, (5,), generator=g).tolist()
    s.rows = [2, 5]
    pool = s.worker.req_to_token_pool
    pool.alloc(2)
    pool.alloc(5)
    a, b = req("a", 2, short), req("b", 5, long_prompt, extend_end=6)
    chunk1 = long_prompt[:6]
    batch = schedule_batch([a, b], short + chunk1, [0, 0], [5, 6], chunked=b, next_prompt_token=long_prompt[6])
    ubatch = clone_batch(batch)
    rec = target_output(11, 2, seed=3)
    out = s.run(batch, rec)
    tails = [int(rec["next_token_ids"][0]), long_prompt[6]]
    rotated = short[1:] + [tails[0]] + chunk1[1:] + [tails[1]]
    assert s.draft_worker.draft_runner.calls[0][0].tolist() == rotated
    lw = {
        2: LiteralWindow(CAP, KPRE, KPRE, ["context", "extension"]),
        5: LiteralWindow(CAP, KPRE, KPRE, ["context", "extension"]),
    }
    lw[2].prefill(short, target_topk(s, rec["last_hidden_states"][:5]))
    lw[5].prefill(chunk1, target_topk(s, rec["last_hidden_states"][5:]))
    assert s.policy.table.row(2) == lw[2].active() and s.policy.table.row(5) == lw[5].active()
    assert out.next_draft_input.topk_index.tolist() == expected_first_topk(s, out, [5, 6], tails, 2)
    uout = s.run_upstream(ubatch, rec)
    assert torch.equal(out.next_draft_input.topk_index, uout.next_draft_input.topk_index)
    assert torch.equal(batch.input_ids, ubatch.input_ids)

    # b's second chunk (same slot, same generation: appended), while slot 2 goes to a new request c
    pool.alloc(2)
    c_prompt = torch.randint(0, V, (3,), generator=g).tolist()
    c = req("c", 2, c_prompt)
    chunk2 = long_prompt[6:]
    b.extend_end = 10
    batch2 = schedule_batch([c, b], c_prompt + chunk2, [0, 6], [3, 4])
    rec2 = target_output(7, 2, seed=4)
    s.rows = [2, 5]
    out2 = s.run(batch2, rec2)
    lw[2] = LiteralWindow(CAP, KPRE, KPRE, ["context", "extension"])
    lw[2].prefill(c_prompt, target_topk(s, rec2["last_hidden_states"][:3]))
    lw[5].prefill(chunk2, target_topk(s, rec2["last_hidden_states"][3:]))
    assert s.policy.table.row(2) == lw[2].active() and s.policy.table.row(5) == lw[5].active()
    assert s.worker._dv_live["c"][0] == 2 and "a" not in s.worker._dv_live
    tails2 = rec2["next_token_ids"].tolist()
    assert out2.next_draft_input.topk_index.tolist() == expected_first_topk(s, out2, [3, 4], tails2, 2)


def test_prefix_hit_is_seeded_from_the_request_ids(mods, _stand_ins):
    """A radix-cache hit: the cached prefix is seeded from the request's ids (no target top-K for it)."""
    s = Setup(mods, topk=1, seed=21)
    V = mods.loop.V
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, V, (8,), generator=g).tolist()
    s.rows = [3]
    s.worker.req_to_token_pool.alloc(3)
    batch = schedule_batch([req("x", 3, prompt)], prompt[5:], [5], [3])
    rec = target_output(3, 1, seed=8)
    s.run(batch, rec)
    lw = LiteralWindow(CAP, KPRE, KPRE, ["context", "extension"])
    lw.prefill(prompt[:5], [])
    lw.prefill(prompt[5:], target_topk(s, rec["last_hidden_states"]))
    assert s.policy.table.row(3) == lw.active()
    # the 5 cached positions got no top-K: counted per request and reported with its telemetry
    from sglang_specvocab.integration.telemetry import UNSEEDED_KEY

    tel = s.draft_worker.dynvocab_telemetry
    assert tel.unseeded_positions(3) == 5
    r = req("x", 3, prompt)
    s.worker._dv_live["x"] = (3, r)
    s.worker.dynvocab_report("x")
    assert r.customized_info[UNSEEDED_KEY] == [5]
    # a later chunk of the same request (prefix == what was fed) and an uncached prompt count nothing
    s.rows = [4]
    s.worker.req_to_token_pool.alloc(4)
    s.run(schedule_batch([req("y", 4, prompt)], prompt, [0], [8]), target_output(8, 1, seed=9))
    assert tel.unseeded_positions(4) == 0


def test_no_draft_worker_returns_the_target_output_untouched(mods, _stand_ins):
    """A rank without the draft (prefill-side PP): the target output, no policy event, no draft extend."""
    s = Setup(mods, topk=1, seed=2)
    s.worker._draft_worker = None
    before = s.policy.table.ids.clone()
    batch = schedule_batch([req("x", 3, [1, 2, 3])], [1, 2, 3], [0], [3])
    published = []
    out = s.run(batch, target_output(3, 1, seed=1), published.append)
    assert not hasattr(out, "next_draft_input") and out.kv_loc_plan is None
    assert published == [batch.seq_lens] and batch.input_ids.tolist() == [1, 2, 3]
    assert torch.equal(s.policy.table.ids, before) and s.draft_worker.draft_runner.calls == []
    assert s.target.calls[0][1] is False  # no KV plan asked for without a draft


def test_idle_prefill_batch_runs_the_draft_without_a_policy_event(mods, _stand_ins, monkeypatch):
    """An idle batch (DP attention padding) skips the rotation and the policy event."""
    s = Setup(mods, topk=1, seed=2)
    before = s.policy.table.ids.clone()
    called = []
    monkeypatch.setattr(s.draft_worker, "_draft_extend_for_prefill", lambda *a, **k: called.append(a[0]) or "next")
    empty = torch.zeros(0, dtype=torch.int64)
    batch = SimpleNamespace(reqs=[], forward_mode=Mode(True), seq_lens=empty, req_pool_indices=empty, input_ids=empty)
    out = s.run(batch, target_output(0, 0, seed=1))
    assert out.next_draft_input == "next" and called == [batch]
    assert torch.equal(s.policy.table.ids, before)


def test_reused_slot_gets_the_set_a_fresh_server_gives_after_abort_and_retract(mods, _stand_ins):
    """Prefill event sequences: a slot whose request was aborted mid-decode goes to a new request, and a
    retracted request comes back (its refill: prompt + output, uncached or with a radix hit); each gets
    exactly the set and telemetry a fresh worker gives the same prefill."""
    V = mods.loop.V
    g = torch.Generator().manual_seed(99)
    ids = lambda n: torch.randint(0, V, (n,), generator=g).tolist()

    def dirty(s, row):  # decode rounds on the row: verify events change its set and telemetry
        rows = torch.tensor([row])
        for _ in range(3):
            drafts, accepted = torch.tensor([ids(4)]), torch.tensor([ids(2)])
            s.draft_worker.dynvocab_telemetry.record_verify(s.policy.table, rows, accepted)
            s.policy.on_verify(rows, drafts, torch.tensor([[ids(KPRE) for _ in range(2)]]), accepted)

    def prefill(s, rid, row, prompt, output=(), prefix=0, seed=0):
        s.rows = [row]
        s.worker.req_to_token_pool.alloc(row)
        fill = list(prompt) + list(output)
        s.run(
            schedule_batch([req_out(rid, row, prompt, output)], fill[prefix:], [prefix], [len(fill) - prefix]),
            target_output(len(fill) - prefix, 1, seed=seed),
        )

    def state(s, row):
        tel = s.draft_worker.dynvocab_telemetry
        return s.policy.table.row(row), tel.unseeded_positions(row), tel.acc[:4, row].tolist()

    a_prompt, b_prompt, c_prompt, c_out = ids(9), ids(6), ids(7), ids(4)
    s = Setup(mods, topk=1, seed=31)
    prefill(s, "a", 3, a_prompt, seed=1)
    dirty(s, 3)
    prefill(s, "b", 3, b_prompt, seed=2)  # a aborted: its slot goes to b
    fresh = Setup(mods, topk=1, seed=31)
    prefill(fresh, "b", 3, b_prompt, seed=2)
    assert state(s, 3) == state(fresh, 3)

    prefill(s, "c", 4, c_prompt, seed=3)
    dirty(s, 4)
    for prefix, seed in ((0, 4), (len(c_prompt), 5)):  # c retracted, refilled uncached, then with a radix hit
        prefill(s, "c", 4, c_prompt, c_out, prefix=prefix, seed=seed)
        fresh = Setup(mods, topk=1, seed=31)
        prefill(fresh, "c", 4, c_prompt, c_out, prefix=prefix, seed=seed)
        assert state(s, 4) == state(fresh, 4)
        assert state(s, 4)[1] == prefix  # a radix hit is counted
