"""The compact draft logits processor fed SGLang's own objects: a real ``LlamaForCausalLMEagle3``
(its ``LogitsProcessor`` and ``ParallelLMHead``), real ``ForwardBatch``es in decode, extend,
draft-extend and idle modes; compact logits equal the torch reference head and the top-k token
ids equal ``DraftHead(...)(...).topk(k)``, for a full-vocabulary head and a d2t draft, in every ``head.batch``
mode.

SGLang runs in a child process (it initialises torch.distributed and stubs torchvision and vllm,
as tests/test_eagle3_draft.py does)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import free_port

from sglang_specvocab.head import DraftHead, head_options
from sglang_specvocab.table import CandidateTable
from sglang_specvocab.tools.testing.standins import CHILD_PREAMBLE
from sglang_specvocab.vocab import VocabSpace

ROOT = Path(__file__).resolve().parents[1]
V, D, R, W, HOT = 512, 64, 6, 16, 128
SOFTCAP = 3.0

pytestmark = pytest.mark.sglang

_CHILD = CHILD_PREAMBLE + textwrap.dedent(
    """
    import sys
    import types

    import torch
    from sglang.test.layer_ut_utils import init_single_process_dist

    init_single_process_dist(master_port=int(sys.argv[1]))
    from sglang.srt.layers import logits_processor as lp_mod
    from sglang.srt.layers.vocab_parallel_embedding import VocabParallelEmbedding
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3
    from transformers import LlamaConfig

    from sglang_specvocab.config import HeadSection
    from sglang_specvocab.integration import logits as L
    from sglang_specvocab.ops import topk as T
    from sglang_specvocab.table import CandidateTable
    from sglang_specvocab.vocab import VocabSpace

    torch.set_num_threads(1)
    inp = torch.load(sys.argv[2])
    out = {}

    # The shard layout of ops.topk.vocab_shard is SGLang's.
    layout = []
    for vocab in (1000, 300, 128256, 32000, 151936):
        for tp in (1, 2, 3, 4, 8):
            pad = 64 * (tp if T._pad(vocab, 64) % tp else 1)  # VocabParallelEmbedding.__init__
            for rank in range(tp):
                si = VocabParallelEmbedding._get_indices(T._pad(vocab, pad), T._pad(vocab, pad), vocab, vocab, rank, tp)
                layout.append(((si.org_vocab_start_index, si.org_vocab_end_index), T.vocab_shard(vocab, tp, rank)))
    out["layout"] = layout


    def draft(space, softcap=None):
        cfg = LlamaConfig(
            vocab_size=inp["V"], hidden_size=inp["D"], intermediate_size=128, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        )
        cfg.draft_vocab_size = inp["HOT"] if space == "d2t" else None  # None: the full-vocabulary head
        if softcap:
            cfg.final_logit_softcapping = softcap
        model = LlamaForCausalLMEagle3(cfg)
        with torch.no_grad():
            if space == "d2t":
                model.lm_head.weight.copy_(inp["head_d2t"])
                model.hot_token_id = inp["hot"]
            else:
                model.lm_head.weight.copy_(inp["weight"])
        return model


    def batch(mode, n_rows, rpi, extend_lens=None):
        bs = rpi.shape[0]
        kw = {}
        if extend_lens is not None:
            kw = dict(extend_seq_lens=extend_lens, extend_seq_lens_cpu=extend_lens.tolist(),
                      extend_logprob_start_lens_cpu=[0] * bs, extend_num_tokens=int(extend_lens.sum()))
        return ForwardBatch(
            forward_mode=mode, batch_size=bs, input_ids=torch.zeros(n_rows, dtype=torch.long),
            req_pool_indices=rpi, seq_lens=torch.full((bs,), 8), out_cache_loc=torch.zeros(n_rows, dtype=torch.long),
            seq_lens_sum=8 * bs, return_logprob=False, capture_hidden_mode=CaptureHiddenMode.LAST, **kw,
        )


    for space in ("full", "d2t"):
        t = inp["table_" + space]
        table = CandidateTable.over(t["ids"], t["cnt"], inp["fallback_" + space])  # the parent's table, rebuilt
        for softcap in (None, inp["SOFTCAP"]):
            model = draft(space, softcap)
            original = model.logits_processor
            kw = {}
            if space == "d2t":
                kw.update(space=VocabSpace.build(inp["V"], head_ids=model.hot_token_id, fallback_id=table.fallback_id))
            proc = L.install(model, table, HeadSection(kernel="torch"), **kw)
            assert model.logits_processor is proc and isinstance(proc, lp_mod.LogitsProcessor)
            assert proc.final_logit_softcapping == original.final_logit_softcapping
            proc.check_table()
            h, rpi = inp["hidden"], inp["rpi"]
            res = {}
            # Multi-step draft: topk rows per request (decode mode).
            o = proc(None, h, model.lm_head, batch(ForwardMode.DECODE, h.shape[0], rpi))
            res["decode"] = o.next_token_logits
            res["decode_hidden"] = o.hidden_states
            for k in (1, 3, 16):
                res["topk", k] = proc.draft_topk(o.next_token_logits, k, rpi)
            # Prefill draft-extend: extend mode, logits at each request's last row.
            lens = torch.tensor([2, 4, 1, 3, 2, 2])
            order = torch.cumsum(lens, 0) - 1
            he = torch.zeros(int(lens.sum()), h.shape[1])
            he[order] = h[::2]
            o = proc(None, he, model.lm_head, batch(ForwardMode.EXTEND, he.shape[0], rpi, lens))
            res["extend"] = o.next_token_logits
            # Eager decode draft-extend: num_draft_tokens rows per request, no select_index.
            fb = batch(ForwardMode.DRAFT_EXTEND_V2, h.shape[0], rpi)
            fb.spec_info = types.SimpleNamespace(select_index=None)
            res["draft_extend"] = proc(None, h, model.lm_head, fb).next_token_logits
            # Idle batch.
            o = proc(None, h[:0], model.lm_head, batch(ForwardMode.IDLE, 0, rpi[:0]))
            res["idle"] = o.next_token_logits
            res["idle_topk"] = proc.draft_topk(o.next_token_logits, 3, rpi[:0])
            # FlashInfer autotune pass without LM head.
            with lp_mod.autotune_dummy_run_mode(run_lm_head=False):
                o = proc(None, h, model.lm_head, batch(ForwardMode.DECODE, h.shape[0], rpi))
            res["autotune"] = (o.next_token_logits, proc.draft_topk(o.next_token_logits, 3, rpi))
            # The original processor on the same head, for the full-width reference.
            # (Its softcapping is a Triton kernel on a non-CPU-engine build: no reference here then.)
            if not softcap:
                fb = batch(ForwardMode.DECODE, h.shape[0], rpi)
                res["original"] = original(None, h, model.lm_head, fb).next_token_logits
            if space == "d2t":
                res["in_vocab"] = proc.dv_head.space.contains(torch.arange(-1, inp["V"] + 1))
            out[space, softcap] = res
        # Every batch mode through the processor (head.batch), the decode rows and the eager draft extend's
        # select_index rows (logits of several rows per request, then one row each).
        for mode in ("union-indexed", "union-gemm", "stock"):
            model = draft(space)
            kw = {}
            if space == "d2t":
                kw.update(space=VocabSpace.build(inp["V"], head_ids=model.hot_token_id, fallback_id=table.fallback_id))
            # a plan's name forces that plan (no config file can name one)
            head = HeadSection(kernel="torch").model_copy(update={"batch": mode})
            proc = L.install(model, table, head, **kw)
            h, rpi = inp["hidden"], inp["rpi"]
            o = proc(None, h, model.lm_head, batch(ForwardMode.DECODE, h.shape[0], rpi))
            got = {k: proc.draft_topk(o.next_token_logits, k, rpi) for k in (1, 3)}
            # the kept rows are read by the call that scored them all: head_key names it
            key = (rpi.shape[0], h.shape[0] // rpi.shape[0])
            got["select"] = proc.draft_topk(o.next_token_logits[1::2], 3, rpi, head_key=key)
            out[space, mode] = got
        # The stock plan is EAGLE3's own code path: the aten ops of the head call and its draft top-k (tree: k 3;
        # chain: top-1), in order, against the original processor's and EAGLE3's draft step (renorm_draft_probs
        # without rejection sampling, fast_topk, the d2t map; the argmax for chains).
        from sglang.srt.speculative.spec_utils import renorm_draft_probs
        from sglang.srt.utils.common import fast_topk

        from sglang_specvocab.tools.bench.host import LaunchCounter as Ops

        model = draft(space)
        original = model.logits_processor
        kw = {}
        if space == "d2t":
            kw.update(space=VocabSpace.build(inp["V"], head_ids=model.hot_token_id, fallback_id=table.fallback_id))
        proc = L.install(model, table, HeadSection(kernel="torch", batch="stock"), **kw)
        h, rpi = inp["hidden"], inp["rpi"]
        fb = batch(ForwardMode.DECODE, h.shape[0], rpi)
        ops = {}
        for who in ("EAGLE3", "DYNVOCAB"):
            with Ops() as tree:
                if who == "EAGLE3":
                    logits = original(None, h, model.lm_head, fb).next_token_logits
                    p, idx = fast_topk(renorm_draft_probs(logits, None, False), 3, dim=-1)
                    if space == "d2t":
                        idx = model.hot_token_id[idx]
                else:
                    logits = proc(None, h, model.lm_head, fb).next_token_logits
                    p, idx = proc.draft_topk(logits, 3, rpi)
            with Ops() as chain:
                if who == "EAGLE3":
                    one = torch.argmax(logits, dim=-1, keepdim=True)
                    if space == "d2t":
                        one = model.hot_token_id[one]
                    torch.ones_like(one, dtype=torch.float32)
                else:
                    one = proc.draft_topk1(logits, rpi)[1]
            ops[who] = (tree.order, chain.order, idx, one)
        out[space, "stock_ops"] = ops
    torch.save(out, sys.argv[3])
    """
)


def _inputs():
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(V, D, generator=g)
    hot = torch.randperm(V, generator=g)[:HOT]
    tables, fallbacks = {}, {}
    for space, pool in (("full", torch.arange(V)), ("d2t", hot)):
        t = CandidateTable(R, W, fallback_id=int(pool[0]))
        sizes = [0, W, 3, 7, W - 2, 1]  # row 0: the padding row keeps its fallback set
        cands = torch.full((R, W), -1)
        for r, n in enumerate(sizes):
            cands[r, :n] = pool[torch.randperm(pool.numel(), generator=g)[:n]]
        t.assign(torch.arange(1, R), cands[1:])
        tables[space], fallbacks[space] = {"ids": t.ids, "cnt": t.cnt}, t.fallback_id
    hidden = torch.randn(12, D, generator=g)
    rpi = torch.tensor([2, 0, 5, 1, 4, 3])  # request-major, 2 rows each; request 2 is a padded row (slot 0)
    return {
        "V": V, "D": D, "HOT": HOT, "SOFTCAP": SOFTCAP, "weight": weight, "hot": hot, "head_d2t": weight[hot],
        "table_full": tables["full"], "table_d2t": tables["d2t"],
        "fallback_full": fallbacks["full"], "fallback_d2t": fallbacks["d2t"],
        "hidden": hidden, "rpi": rpi,
    }  # fmt: skip


@pytest.fixture(scope="module")
def sglang_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dynvocab_logits")
    inp = _inputs()
    torch.save(inp, tmp / "in.pt")
    (tmp / "child.py").write_text(_CHILD)
    env = {
        **os.environ,
        "PYTHONWARNINGS": "ignore",
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    argv = [sys.executable, str(tmp / "child.py"), str(free_port()), str(tmp / "in.pt"), str(tmp / "out.pt")]
    run = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, cwd=tmp)
    assert run.returncode == 0, run.stderr[-4000:]
    return inp, torch.load(tmp / "out.pt")


def _table(inp, space):
    t = CandidateTable(R, W, fallback_id=inp["fallback_" + space])
    t.ids.copy_(inp["table_" + space]["ids"])
    t.cnt.copy_(inp["table_" + space]["cnt"])
    return t


def _reference(inp, space, hidden, rpi, softcap=None, batch="per-request"):
    """DraftHead over the target-space weight (for d2t, the draft rows sit at their target ids), or for the stock
    mode the draft's own head."""
    if batch == "stock" and space == "d2t":
        head = DraftHead(
            inp["head_d2t"],
            _table(inp, space),
            VocabSpace.build(V, head_ids=inp["hot"], fallback_id=_table(inp, space).fallback_id),
            head_options(kernel="torch", batch=batch),
        )
        return head(hidden, rpi)
    weight = inp["weight"]
    return DraftHead(weight, _table(inp, space), head=head_options(kernel="torch", batch=batch), logit_softcap=softcap)(
        hidden, rpi
    )


def _slots(rpi, n):
    return rpi.repeat_interleave(n // rpi.shape[0]).to(torch.int32)


def _check_compact(got, ref, t, slots):
    """Live columns equal the reference; dead ones are -inf (even under softcapping)."""
    live = torch.arange(W)[None, :] < t.cnt[slots.long()][:, None]
    assert got.dtype == torch.float32 and got.shape == ref.shape
    torch.testing.assert_close(got[live], ref[live], atol=1e-5, rtol=1e-5)
    assert bool(torch.isneginf(got[~live]).all())


def test_vocab_shard_is_parallel_lm_head_layout(sglang_run):
    _, out = sglang_run
    for theirs, ours in out["layout"]:
        assert theirs == ours


@pytest.mark.parametrize("space", ["full", "d2t"])
@pytest.mark.parametrize("softcap", [None, SOFTCAP])
def test_compact_logits_equal_the_reference_head(sglang_run, space, softcap):
    inp, out = sglang_run
    res = out[space, softcap]
    h, rpi = inp["hidden"], inp["rpi"]
    t = _table(inp, space)
    slots = _slots(rpi, h.shape[0])
    ref = _reference(inp, space, h, rpi, softcap)
    for mode in ("decode", "draft_extend"):
        _check_compact(res[mode], ref.logits, t, slots)
    torch.testing.assert_close(res["decode_hidden"], h)  # hidden-state capture is SGLang's, untouched
    # Extend: one row a request (the last of its prompt rows).
    s1 = _slots(rpi, rpi.shape[0])
    _check_compact(res["extend"], _reference(inp, space, h[::2], rpi, softcap).logits, t, s1)
    # The padded request (slot 0) gets its fallback set: one live column, never an all -inf row.
    pad_rows = (slots == 0).nonzero().flatten()
    assert bool(torch.isfinite(res["decode"][pad_rows, 0]).all())
    if softcap:
        return
    # Compact columns are the original processor's full-width logits at the set's ids.
    full = res["original"]
    if space == "d2t":
        col_ids = torch.full((V,), -1, dtype=torch.long)
        col_ids[inp["hot"]] = torch.arange(HOT)
        cols = col_ids[t.ids[slots.long()].long()]
    else:
        cols = t.ids[slots.long()].long()
    live = torch.arange(W)[None, :] < t.cnt[slots.long()][:, None]
    torch.testing.assert_close(res["decode"][live], full.gather(1, cols)[live], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("space", ["full", "d2t"])
@pytest.mark.parametrize("k", [1, 3, 16])
def test_topk_token_ids_equal_draft_head_topk(sglang_run, space, k):
    inp, out = sglang_run
    h, rpi = inp["hidden"], inp["rpi"]
    ref = _reference(inp, space, h, rpi)
    _values, tokens = ref.topk(k)
    probs, got_tokens = out[space, None]["topk", k]
    assert torch.equal(got_tokens, tokens)
    torch.testing.assert_close(
        probs, torch.softmax(ref.logits, 1).gather(1, ref.logits.sort(dim=1, descending=True, stable=True)[1][:, :k])
    )
    if space == "d2t":
        assert bool(torch.isin(got_tokens, inp["hot"]).all())  # only draft-vocabulary ids come back


@pytest.mark.parametrize("space", ["full", "d2t"])
@pytest.mark.parametrize("mode", ["union-indexed", "union-gemm", "stock"])
def test_every_batch_mode_through_the_processor(sglang_run, space, mode):
    """The processor's draft top-k in each head.batch mode equals the head's own, also for rows kept from a call
    that scored several rows per request (the eager draft extend's select_index)."""
    inp, out = sglang_run
    h, rpi = inp["hidden"], inp["rpi"]
    ref = _reference(inp, space, h, rpi, batch=mode)
    got = out[space, mode]
    for k in (1, 3):
        probs, tokens = got[k]
        want_p, want_t = ref.topk_probs(k)
        assert torch.equal(tokens, want_t)
        torch.testing.assert_close(probs, want_p)
    want_p, want_t = ref.topk_probs(3)  # the kept rows' top-k are those rows' own
    assert torch.equal(got["select"][1], want_t[1::2])
    torch.testing.assert_close(got["select"][0], want_p[1::2])


@pytest.mark.parametrize("space", ["full", "d2t"])
def test_the_stock_plan_runs_eagle3s_own_ops_in_eagle3s_order(sglang_run, space):
    """Where the head runs stock it costs what EAGLE3 costs: the same aten ops in the same order, for the head call
    with its tree top-k and for a chain's top-1, and the same tokens."""
    _, out = sglang_run
    eagle, ours = out[space, "stock_ops"]["EAGLE3"], out[space, "stock_ops"]["DYNVOCAB"]
    assert ours[0] == eagle[0] and ours[1] == eagle[1]
    assert any("mm" in op for op in eagle[0]) and any("topk" in op for op in eagle[0])  # not an empty comparison
    assert torch.equal(ours[2], eagle[2]) and torch.equal(ours[3], eagle[3])


@pytest.mark.parametrize("space", ["full", "d2t"])
def test_idle_and_autotune_batches(sglang_run, space):
    _, out = sglang_run
    res = out[space, None]
    assert res["idle"].shape == (0, W) and res["idle"].dtype == torch.float32
    p, t = res["idle_topk"]
    assert p.shape == (0, 3) and t.shape == (0, 3) and t.dtype == torch.int64
    assert res["autotune"] == (None, (None, None))


def test_in_draft_vocab_mask(sglang_run):
    inp, out = sglang_run
    mask = out["d2t", None]["in_vocab"]
    want = torch.zeros(V + 2, dtype=torch.bool)
    want[inp["hot"] + 1] = True
    assert torch.equal(mask, want)
