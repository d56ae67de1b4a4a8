"""Trained modes: a few optimiser steps lower the loss, and the trained files drive the policies."""

from pathlib import Path

import pytest
import torch
from helpers import tiny_llama

from sglang_specvocab.lab.decoder import CausalLM, DraftShape, SpeculativeDecoder, greedy_generate
from sglang_specvocab.lab.training import record_draft_states, train_ranker, train_router
from sglang_specvocab.policies import ModelContext, build_policy, parse_config

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
        top_l=4,
        width=64,
        steps=60,
        lr=3e-3,
        batch_size=32,
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
    router, _ = train_router(d.weight, d.embedding, hidden, tokens, pol.perm, pol.offsets, width=32, steps=5)
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
