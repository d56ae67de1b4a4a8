"""Trained modes: a few optimiser steps lower the loss, and the trained files drive the policies."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import tiny_llama

from sglang_specvocab.errors import SpecVocabError
from sglang_specvocab.policies import ModelContext, build_policy, parse_config
from sglang_specvocab.tools.lab.decoder import CausalLM, DraftShape, Eagle3LM, SpeculativeDecoder, greedy_generate
from sglang_specvocab.tools.lab.rankers import (
    Recording,
    RouterSettings,
    parse_draft,
    record_draft_states,
    record_text_states,
    recorded_states,
    recording_draft,
    train_ranker,
    train_router,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def recorded():
    m = tiny_llama(dtype=torch.float32)
    t, d = CausalLM(m), CausalLM(m, num_layers=2)
    g = torch.Generator().manual_seed(0)
    prompts = [[1] + torch.randint(3, 512, (20,), generator=g).tolist() for _ in range(4)]
    hidden, tokens = record_draft_states(t, d, prompts, 24, DraftShape(steps=3), eos_token_ids=[2])
    return t, d, hidden, tokens


def test_recording_sees_every_draft_step(recorded):
    _, _d, hidden, tokens = recorded
    assert hidden.shape[1] == 64 and hidden.shape[0] == tokens.shape[0] >= 4 * 3
    assert tokens.dtype == torch.int64 and (tokens >= 0).all()


def _first_draft_state(target, draft, prompt):
    """What decode recording sees first: the draft's state at the round's first draft step after prefill."""
    seen = []
    dec = SpeculativeDecoder(
        target, draft, parse_config({"policy": "full"}), DraftShape(steps=1), recorder=lambda h, t: seen.append((h, t))
    )
    dec.generate(prompt, 2)
    return seen[0]


@pytest.fixture(scope="module")
def eagle3_drafts(tmp_path_factory):
    """A tiny target with an untrained full-vocabulary and a d2t EAGLE-3 draft in SGLang's format."""
    from sglang_specvocab.tools.train import checkpoint as C
    from sglang_specvocab.tools.train import model as M

    m = tiny_llama(dtype=torch.float32, layers=8)
    out = {}
    for head in ("full", "d2t"):
        hot = None if head == "full" else torch.arange(0, 512, 2)
        cfg = M.Eagle3Config.for_target(m, draft_vocab_size=None if hot is None else 256)
        path = tmp_path_factory.mktemp(head)
        C.save_checkpoint(M.build_draft(m, cfg, hot, seed=1), path, torch.float32)
        out[head] = path
    return m, out


@pytest.mark.parametrize("kind", ["self-draft", "eagle3"])
def test_text_states_are_the_states_decoding_would_record(kind, eagle3_drafts):
    """Teacher-forced text: the state at each position is the one the decoder records at a round's first draft
    step when the text up to there is the committed sequence (checked at every cut of one text)."""
    m, paths = eagle3_drafts
    t = CausalLM(m)
    d = CausalLM(m, num_layers=2) if kind == "self-draft" else Eagle3LM.load(paths["full"], m)
    start = [1, 40, 41, 300, 7]
    text = torch.tensor(start + greedy_generate(t, start, 8))  # so the decoder commits this text's tokens
    hidden, tokens = record_text_states(t, d, [text])
    first = 0 if kind == "self-draft" else 1  # an EAGLE-3 state needs the target's features of the position before
    assert tokens.tolist() == text[first:].tolist() and hidden.shape == (len(text) - first, 64)
    for cut in range(len(start), len(text)):  # the text up to ``cut`` committed: the prompt, then the root
        h, tok = _first_draft_state(t, d, text[:cut].tolist())
        assert tok.tolist() == [int(text[cut])]
        torch.testing.assert_close(hidden[cut - first], h[0], rtol=1e-4, atol=1e-5)


def test_text_positions_are_a_seeded_ordered_subset():
    m = tiny_llama(dtype=torch.float32)
    t, d = CausalLM(m), CausalLM(m, num_layers=2)
    g = torch.Generator().manual_seed(3)
    texts = [torch.randint(3, 512, (n,), generator=g) for n in (30, 5, 12)]
    all_h, all_t = record_text_states(t, d, texts)
    h, tok = record_text_states(t, d, texts, per_sequence=8, seed=4)
    assert len(tok) == 8 + 5 + 8  # a text shorter than 8 keeps every position
    rows = []
    start = 0
    for text in texts:  # every kept state is the all-positions state of its text and position, in order
        idx = [i for i in range(len(text)) if any(torch.equal(all_h[start + i], x) for x in h)]
        rows.extend(start + i for i in idx)
        start += len(text)
    assert torch.equal(all_h[rows], h) and torch.equal(all_t[rows], tok)
    again, _ = record_text_states(t, d, texts, per_sequence=8, seed=4)
    other, _ = record_text_states(t, d, texts, per_sequence=8, seed=5)
    assert torch.equal(again, h) and not torch.equal(other, h)
    with pytest.raises(SpecVocabError, match="no text to record"):
        record_text_states(t, d, [])


def _recording_args(**over):
    base = dict(
        model="tiny",
        draft=None,
        draft_layers=2,
        source="text",
        prompts=3,
        skip=0,
        seq_len=64,
        positions=8,
        seed=0,
        prompt_tokens=32,
        max_new_tokens=8,
        states=None,
    )
    return Recording(**(base | over))


def test_one_draft_spec_parser_for_the_lab_and_the_training_commands():
    lab = ("auto", "eagle3", "layers", "target")
    assert parse_draft("layers:12", lab) == ("layers", 12)
    assert parse_draft("eagle3:/d/x:y", lab) == ("eagle3", "/d/x:y")  # a folder may hold a colon
    assert parse_draft("target", lab) == ("target", None) and parse_draft("auto", lab) == ("auto", None)
    for bad in ("layers:0", "layers:", "layers:1.5", "eagle3:", "target:1", "auto:x", "self", ""):
        with pytest.raises(SpecVocabError, match="is invalid: must be 'auto', 'eagle3:DIR', 'layers:N' or 'target'$"):
            parse_draft(bad, lab)
    with pytest.raises(SpecVocabError, match=r"^--draft = 'target' is invalid: must be 'layers:N' or 'eagle3:DIR'$"):
        parse_draft("target", ("layers", "eagle3"))


def test_the_recording_draft_spec_and_its_refusals(eagle3_drafts):
    m, paths = eagle3_drafts
    lm = SimpleNamespace(model=m)
    assert recording_draft(_recording_args(), lm).num_layers == 2
    assert recording_draft(_recording_args(draft="layers:3"), lm).num_layers == 3
    assert isinstance(recording_draft(_recording_args(draft=f"eagle3:{paths['full']}"), lm), Eagle3LM)
    with pytest.raises(SpecVocabError, match=r"a d2t draft \(256 ids\) has no full-vocabulary head"):
        recording_draft(_recording_args(draft=f"eagle3:{paths['d2t']}"), lm)
    oracle = recording_draft(_recording_args(draft="target"), lm)  # the target's own final states
    assert isinstance(oracle, CausalLM) and oracle.num_layers == m.config.num_hidden_layers
    for bad in ("layers:x", "eagle3:", "target:1", "auto"):
        with pytest.raises(SpecVocabError, match=f"--draft = '{bad}' is invalid: must be 'layers:N', 'eagle3:DIR' or "):
            recording_draft(_recording_args(draft=bad), lm)


def test_a_states_cache_recorded_with_other_settings_is_refused(tmp_path):
    m = tiny_llama(dtype=torch.float32)
    path = tmp_path / "states.pt"
    meta = {"model": "tiny", "draft": "layers:2", "source": "text", "prompts": 3, "skip": 0}
    meta |= {"seq_len": 64, "positions": 8, "seed": 0}
    hidden, tokens = torch.randn(5, 64), torch.arange(5)
    torch.save({"hidden": hidden, "tokens": tokens, "meta": json.dumps(meta)}, path)
    lm = SimpleNamespace(model=m)
    _, _, h, tok = recorded_states(_recording_args(states=str(path)), lm)  # same settings: read, not recorded
    assert torch.equal(h, hidden) and torch.equal(tok, tokens)
    with pytest.raises(SpecVocabError, match=r"recorded with other settings: prompts 3 \(asked 2000\), positions 8"):
        recorded_states(_recording_args(states=str(path), prompts=2000, positions=0), lm)
    big = tmp_path / "big.pt"  # --prompts left out: the source's default (2,000 for text) is what is compared
    torch.save({"hidden": hidden, "tokens": tokens, "meta": json.dumps(meta | {"prompts": 2000})}, big)
    assert torch.equal(recorded_states(_recording_args(states=str(big), prompts=None), lm)[2], hidden)
    legacy = tmp_path / "legacy.pt"  # files of earlier versions have no settings: read as they are
    torch.save({"hidden": hidden, "tokens": tokens}, legacy)
    assert torch.equal(recorded_states(_recording_args(states=str(legacy), source="decode"), lm)[2], hidden)


def test_a_few_ranker_steps_lower_the_kl(recorded):
    _, d, hidden, _ = recorded
    _, _, losses = train_ranker(d.weight, hidden, 4, steps=80, lr=1e-2, batch_size=32)
    assert sum(losses[-5:]) / 5 < 0.85 * sum(losses[:5]) / 5  # from the SVD start, KL still falls


def test_a_few_router_steps_lower_the_bce(recorded, tmp_path):
    _t, d, hidden, tokens = recorded
    cfg = parse_config({"policy": "cluster", "capacity": 64, "cluster": {"clusters": 16, "budget": [4, 2]}})
    pol = build_policy(cfg, 2, model=ModelContext(weight=d.weight.detach(), cache_dir=tmp_path))
    _, losses = train_router(
        d.weight,
        d.embedding,
        hidden,
        tokens,
        pol.perm,
        pol.offsets,
        RouterSettings(top_l=4, width=64, steps=60, lr=3e-3, batch_size=32),
    )
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5


def test_trained_files_drive_the_policies_losslessly(recorded, tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_SPECVOCAB_CACHE", str(tmp_path))
    t, d, hidden, tokens = recorded
    w_down, w_vocab, _ = train_ranker(d.weight, hidden, 4, steps=5)
    torch.save({"w_down": w_down, "w_vocab": w_vocab}, tmp_path / "ranker.pt")
    cluster = {"clusters": 16, "budget": [4, 2]}
    pol = build_policy(
        parse_config({"policy": "cluster", "capacity": 64, "cluster": cluster}),
        2,
        model=ModelContext(weight=d.weight.detach()),
    )
    router, _ = train_router(
        d.weight, d.embedding, hidden, tokens, pol.perm, pol.offsets, RouterSettings(width=32, steps=5)
    )
    torch.save(
        {"state": router.state_dict(), "clusters_key": pol.clusters_key, "width": 32, "clusters": 16},
        tmp_path / "router.pt",
    )
    configs = [
        {"policy": "lowrank", "lowrank": {"rank": 4, "topk": 32, "ranker": str(tmp_path / "ranker.pt")}},
        {"policy": "cluster", "capacity": 64, "cluster": cluster | {"router": str(tmp_path / "router.pt")}},
    ]
    prompt = [1, 9, 8, 7, 300, 301]
    for cfg in configs:
        gen = SpeculativeDecoder(t, d, parse_config(cfg), DraftShape(steps=3), eos_token_ids=[2]).generate(prompt, 20)
        assert gen.tokens == greedy_generate(t, prompt, 20, eos_token_ids=[2])
    other = {
        "policy": "cluster",
        "capacity": 64,
        "cluster": cluster | {"seed": 1, "router": str(tmp_path / "router.pt")},
    }
    with pytest.raises(Exception, match="was trained for other clusters"):
        SpeculativeDecoder(t, d, parse_config(other), DraftShape(steps=3))
    bad = {"policy": "lowrank", "lowrank": {"rank": 5, "topk": 32, "ranker": str(tmp_path / "ranker.pt")}}
    with pytest.raises(Exception, match=r"w_down has shape \(4, 64\), the model and rank = 5 need \(5, 64\)"):
        SpeculativeDecoder(t, d, parse_config(bad), DraftShape(steps=3))


def test_online_lora_alignment_lowers_its_loss_and_leaves_the_target_alone(tmp_path):
    import numpy as np

    from sglang_specvocab.vocab_data import save_frequency_table

    save_frequency_table(tmp_path / "f.npz", np.arange(512, 0, -1), tokenizer="t", source="test")
    m = tiny_llama()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    t, d = CausalLM(m), CausalLM(m, num_layers=2)
    cfg = parse_config(
        {
            "policy": "retrieval",
            "retrieval": {"table": str(tmp_path / "f.npz"), "static_size": 64, "dynamic_size": 32},
            "align": {"rank": 4, "lr": 1e-3},
        }
    )
    dec = SpeculativeDecoder(t, d, cfg, DraftShape(steps=3), eos_token_ids=[2])
    prompt = [1] + list(range(10, 60))
    want = greedy_generate(t, prompt, 40, eos_token_ids=[2])
    means = []
    for _ in range(3):  # the same request again: the aligned draft fits the target better each time
        gen = dec.generate(prompt, 40)
        assert gen.tokens == want
        means.append(sum(dec.aligner.losses[-len(gen.rounds) :]) / len(gen.rounds))
    assert means[2] < means[1] < means[0]
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())  # nothing but LoRA factors trained
    plain = SpeculativeDecoder(t, d, parse_config({"policy": "full"}), DraftShape(steps=3)).generate(prompt, 40)
    assert plain.tokens == want
    with pytest.raises(Exception, match="align.rank = 0 is invalid"):
        parse_config(
            {
                "policy": "retrieval",
                "retrieval": {"table": "f.npz", "static_size": 4, "dynamic_size": 4},
                "align": {"rank": 0},
            }
        )
