"""Sampling is lossless: with temperature > 0 the reference decoder's output is distributed exactly as the
target's own sampling, through a candidate set (window, and the stepwise lowrank), chain and tree.

Statistic: Pearson's chi-square of N sampled 3-token continuations against their exact target probabilities
(every continuation scored by the target), cells with an expected count below 5 pooled into one.
Each case fails when the test's p-value is below ALPHA = 1e-3: if the decoder is lossless, one case fails
with probability at most 1e-3 over the random seeds, the four cases together at most 4e-3 (the seeds here are
fixed, so the outcome is reproducible). Power is shown by a negative control: the same test with a decoder
that accepts every drafted token fails it.
"""

from __future__ import annotations

import pytest
import torch

from sglang_specvocab.policies import parse_config
from sglang_specvocab.tools.lab.decoder import CausalLM, DraftShape, SpeculativeDecoder

V, PROMPT, LENGTH, TEMPERATURE = 8, [1, 5], 3, 1.0
N = 600  # samples per case: ~12 s each on a shared 2-core CPU
ALPHA = 1e-3
CONFIGS = {
    "window": {"policy": "window", "capacity": 3},  # 3 of 8 ids: drafts are often outside the target's choice
    "lowrank": {"policy": "lowrank", "lowrank": {"rank": 2, "topk": 3}},  # a new set at every draft step
}
SHAPES = {"chain": DraftShape(steps=3), "tree": DraftShape(steps=3, topk=2, draft_tokens=6)}
SEEDS = {("window", "chain"): 1, ("window", "tree"): 2, ("lowrank", "chain"): 3, ("lowrank", "tree"): 4}


def tiny_lm(seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=V,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        initializer_range=0.5,
        tie_word_embeddings=False,
    )
    return CausalLM(LlamaForCausalLM(cfg).double().eval())


@pytest.fixture(scope="module")
def models(one_thread):
    # The target drafts for itself, so drafts are often accepted several deep; its set (3 of 8 ids, or a
    # ranker's 3) keeps the draft from the target's choice often enough that rejections are common too.
    target = tiny_lm(1)
    return target, target


def exact_distribution(target: CausalLM) -> torch.Tensor:
    """``P[t1, t2, t3]``: the target's probability of each continuation (one forward over all of them)."""
    grid = torch.cartesian_prod(*[torch.arange(V)] * (LENGTH - 1))
    batch = torch.cat([torch.tensor(PROMPT).expand(len(grid), -1), grid], dim=1)
    probs = torch.softmax(target.logits(target.hidden(batch, target.new_cache())) / TEMPERATURE, dim=-1)
    p = len(PROMPT) - 1
    first = probs[0, p]  # [t1]
    second = probs[:, p + 1].reshape(V, V, V)[:, 0]  # [t1, t2] (rows repeat over t2 of the grid)
    third = probs[:, p + 2].reshape(V, V, V)  # [t1, t2, t3]
    return first[:, None, None] * second[:, :, None] * third


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square p-value of ``counts`` against ``probs`` (cells with expected < 5 pooled)."""
    counts, expected = counts.flatten().double(), probs.flatten().double() * counts.sum()
    small = expected < 5
    o = torch.cat([counts[~small], counts[small].sum()[None]])
    e = torch.cat([expected[~small], expected[small].sum()[None]])
    o, e = o[e > 0], e[e > 0]
    stat = ((o - e) ** 2 / e).sum()
    df = len(e) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat / 2))


def sample(dec: SpeculativeDecoder, seed: int) -> tuple[torch.Tensor, list]:
    g = torch.Generator().manual_seed(seed)
    counts, rounds = torch.zeros(V, V, V), []
    for _ in range(N):
        gen = dec.generate(PROMPT, LENGTH, temperature=TEMPERATURE, generator=g)
        counts[tuple(gen.tokens)] += 1
        rounds += gen.rounds
    return counts, rounds


@pytest.mark.slow
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("config", list(CONFIGS))
def test_sampled_output_is_distributed_as_the_target(models, config, shape):
    target, draft = models
    dec = SpeculativeDecoder(target, draft, parse_config(CONFIGS[config]), SHAPES[shape])
    counts, rounds = sample(dec, seed=SEEDS[config, shape])
    # both branches of the acceptance rule ran: drafted tokens accepted and rejected
    assert any(r.accepted >= 2 for r in rounds) and any(r.accepted == 0 for r in rounds)
    assert any(r.in_set < r.committed for r in rounds)  # the target sampled tokens outside the set too
    assert chi_square_p(counts, exact_distribution(target)) >= ALPHA


@pytest.mark.slow
def test_the_statistic_catches_a_decoder_that_accepts_every_draft(models, monkeypatch):
    target, draft = models
    dec = SpeculativeDecoder(target, draft, parse_config(CONFIGS["window"]), SHAPES["chain"])
    monkeypatch.setattr(dec, "_accept", lambda probs, token: True)  # biased towards the draft
    counts, _ = sample(dec, seed=11)
    assert chi_square_p(counts, exact_distribution(target)) < ALPHA


def test_temperature_must_be_non_negative(models):
    from sglang_specvocab import SpecVocabError

    dec = SpeculativeDecoder(*models, parse_config(CONFIGS["window"]), SHAPES["chain"])
    with pytest.raises(SpecVocabError, match=r"temperature = -0.5 is invalid: must be >= 0"):
        dec.generate(PROMPT, 3, temperature=-0.5)
