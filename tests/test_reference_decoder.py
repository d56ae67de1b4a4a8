"""Lossless: greedy speculative output equals target-only greedy output, for every config and shape."""

import pytest
import torch
from helpers import tiny_llama

from sglang_specvocab import SpecVocabError
from sglang_specvocab.lab.decoder import CausalLM, DraftShape, SpeculativeDecoder, greedy_generate
from sglang_specvocab.policies import parse_config

CONFIGS = {
    "full": {"policy": "full"},
    "microspec": {"policy": "window", "capacity": 3072 // 8},
    "tiny-window": {"policy": "window", "capacity": 6},
    "context-only": {"policy": "window", "capacity": 48, "window": {"sources": ["context"]}},
    "extension-only": {"policy": "window", "capacity": 48, "window": {"sources": ["extension"], "verify_topk": 1}},
    "no-verify-topk": {"policy": "window", "capacity": 4, "window": {"verify_topk": 0, "prefill_topk": 0}},
    "one-token": {"policy": "window", "capacity": 1},
}
SHAPES = {
    "chain": DraftShape(steps=3),
    "tree": DraftShape(steps=4, topk=3, draft_tokens=8),
    "wide": DraftShape(steps=2, topk=4, draft_tokens=12),
}


@pytest.fixture(scope="module")
def models(llama):
    other = tiny_llama(layers=2, seed=5)  # an independent draft LM over the same vocabulary
    return {
        "self-draft": (CausalLM(llama), CausalLM(llama, num_layers=2)),
        "other-lm": (CausalLM(llama), CausalLM(other)),
        "oracle": (CausalLM(llama), CausalLM(llama)),
    }


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(3)
    return [[1] + torch.randint(3, 512, (n,), generator=g).tolist() for n in (5, 40, 300)]


# every config with every shape whose branching fits in the set (topk <= capacity)
CASES = [(c, s) for c in CONFIGS for s in SHAPES if SHAPES[s].topk <= CONFIGS[c].get("capacity", 512)]


@pytest.mark.parametrize("config,shape", CASES)
@pytest.mark.parametrize("draft", ["self-draft", "other-lm", "oracle"])
def test_greedy_output_equals_target_only(models, prompts, draft, config, shape):
    target, drafter = models[draft]
    dec = SpeculativeDecoder(target, drafter, parse_config(CONFIGS[config]), SHAPES[shape], eos_token_ids=[2])
    for prompt in prompts:
        want = greedy_generate(target, prompt, 30, eos_token_ids=[2])
        gen = dec.generate(prompt, 30)
        assert gen.tokens == want
        assert sum(r.committed for r in gen.rounds) == len(gen.tokens) - 1  # the first token comes from prefill
        assert all(1 <= r.committed <= r.accepted + 1 and r.in_set <= r.committed for r in gen.rounds)
        cap = CONFIGS[config].get("capacity")
        assert all(r.set_size == (512 if cap is None else min(r.set_size, cap)) for r in gen.rounds)


def test_oracle_draft_with_full_head_accepts_every_draft_token(models, prompts):
    target, drafter = models["oracle"]
    chain = SpeculativeDecoder(target, drafter, parse_config(CONFIGS["full"]), SHAPES["chain"]).generate(prompts[1], 40)
    assert all(r.accepted == SHAPES["chain"].steps for r in chain.rounds[:-1])
    assert chain.coverage == 1.0
    # In a tree the draft's top-1 child of the root always scores best, so it is always accepted.
    tree = SpeculativeDecoder(target, drafter, parse_config(CONFIGS["full"]), SHAPES["tree"]).generate(prompts[1], 40)
    assert all(r.accepted >= 1 for r in tree.rounds[:-1]) and tree.tokens == chain.tokens


def test_small_set_limits_an_oracle_draft(models, prompts):
    target, drafter = models["oracle"]
    full = SpeculativeDecoder(target, drafter, parse_config(CONFIGS["full"]), SHAPES["chain"]).generate(prompts[1], 40)
    tiny = SpeculativeDecoder(target, drafter, parse_config(CONFIGS["tiny-window"]), SHAPES["chain"]).generate(
        prompts[1], 40
    )
    assert tiny.tokens == full.tokens
    assert tiny.coverage < 1.0 and tiny.accept_length < full.accept_length
    assert max(r.set_size for r in tiny.rounds) <= 6


def test_max_new_tokens_and_eos_cut_the_output(models, prompts):
    target, drafter = models["oracle"]
    dec = SpeculativeDecoder(target, drafter, parse_config(CONFIGS["full"]), SHAPES["chain"])
    assert len(dec.generate(prompts[0], 7).tokens) == 7
    want = greedy_generate(target, prompts[0], 30)
    stop = want[5]
    eos_dec = SpeculativeDecoder(target, drafter, parse_config(CONFIGS["full"]), SHAPES["chain"], eos_token_ids=[stop])
    got = eos_dec.generate(prompts[0], 30).tokens
    assert got == want[: want.index(stop) + 1]


def test_policy_receives_sglang_events(models, prompts):
    """Prefill: prompt ids + target top-K per position; verify: tree (root first), top-K at verified positions."""
    target, drafter = models["self-draft"]
    dec = SpeculativeDecoder(target, drafter, parse_config(CONFIGS["microspec"]), SHAPES["tree"])
    calls = []
    pol = dec.policy
    orig_prefill, orig_verify = pol.on_prefill, pol.on_verify
    pol.on_prefill = lambda *a: (calls.append(("prefill", a)), orig_prefill(*a))
    pol.on_verify = lambda *a: (calls.append(("verify", a)), orig_verify(*a))
    prompt = prompts[1]
    gen = dec.generate(prompt, 25)
    kind, (rows, prompt_ids, prompt_topk) = calls[0]
    assert kind == "prefill" and rows.tolist() == [1] and prompt_ids[0].tolist() == prompt
    assert prompt_topk.shape == (1, len(prompt), 3)
    assert int(prompt_topk[0, -1, 0]) == gen.tokens[0]  # top-1 after the prompt is the first token
    out = gen.tokens[1:]
    root = gen.tokens[0]
    for kind, (rows, draft_tokens, verify_topk, accepted) in calls[1:]:
        assert kind == "verify" and rows.tolist() == [1]
        assert int(draft_tokens[0, 0]) == root and draft_tokens.shape[1] <= 8
        committed = accepted[0].tolist()
        assert verify_topk.shape == (1, len(committed), 3)
        assert verify_topk[0, :, 0].tolist() == committed  # greedy: the target's top-1 is what it commits
        assert committed == out[: len(committed)]
        out, root = out[len(committed) :], committed[-1]
    assert out == []


def test_bad_decoder_arguments(models, llama):
    target, drafter = models["self-draft"]
    with pytest.raises(SpecVocabError, match="draft steps = 0"):
        DraftShape(steps=0)
    with pytest.raises(SpecVocabError, match="draft tokens = 30 is invalid: must be in \\[2, 22\\]"):
        DraftShape(steps=3, topk=3, draft_tokens=30)
    with pytest.raises(SpecVocabError, match="draft layers = 9 is invalid: must be in \\[1, 4\\]"):
        CausalLM(llama, num_layers=9)
    with pytest.raises(SpecVocabError, match="capacity = 600 is invalid: must be at most the vocabulary size 512"):
        SpeculativeDecoder(target, drafter, parse_config({"policy": "window", "capacity": 600}))
    with pytest.raises(SpecVocabError, match="draft vocabulary \\(256\\) differs"):
        SpeculativeDecoder(target, CausalLM(tiny_llama(vocab_size=256, layers=1)), parse_config(CONFIGS["full"]))
    with pytest.raises(SpecVocabError, match="prompt is empty"):
        SpeculativeDecoder(target, drafter, parse_config(CONFIGS["full"])).generate([], 5)
    with pytest.raises(SpecVocabError, match="capacity = 6 is invalid with draft topk 8: must be at least"):
        SpeculativeDecoder(target, drafter, parse_config(CONFIGS["tiny-window"]), DraftShape(steps=2, topk=8))


@pytest.mark.parametrize("view", ["own", "all"])
def test_union_head_is_lossless_and_union_own_drafts_as_per_request(models, prompts, view):
    """The union head in the reference decoder: greedy output unchanged; seen ``own`` it drafts what the
    per-request head drafts (the same accepted lengths, round by round)."""
    target, drafter = models["other-lm"]
    shape = SHAPES["tree"]

    def decoder(head):
        cfg = {"policy": "window", "capacity": 48, "head": {"kernel": "torch", **head}}
        return SpeculativeDecoder(target, drafter, parse_config(cfg), shape, eos_token_ids=[2])

    union = decoder({"batch": "union", "union_view": view})
    per = decoder({"batch": "per-request"})
    for prompt in prompts[:2]:
        gen = union.generate(prompt, 24)
        assert union.head.last_mode in ("union-indexed", "union-gemm")
        assert gen.tokens == greedy_generate(target, prompt, 24, eos_token_ids=[2])
        if view == "own":
            assert [r.accepted for r in gen.rounds] == [r.accepted for r in per.generate(prompt, 24).rounds]
