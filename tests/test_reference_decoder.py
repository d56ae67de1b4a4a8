"""Lossless: greedy speculative output equals target-only greedy output, for every config and shape."""

import pytest
import torch
from helpers import tiny_llama

from sglang_specvocab import SpecVocabError
from sglang_specvocab.head import DraftHead, head_options
from sglang_specvocab.policies import parse_config
from sglang_specvocab.tools.lab.decoder import CausalLM, DraftShape, SpeculativeDecoder, greedy_generate

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
        assert union.head.planned and set(union.head.planned.values()) <= {"union-indexed", "union-gemm"}
        assert gen.tokens == greedy_generate(target, prompt, 24, eos_token_ids=[2])
        if view == "own":
            assert [r.accepted for r in gen.rounds] == [r.accepted for r in per.generate(prompt, 24).rounds]


# --- lockstep batches (generate_batch): B requests over one table, one head call per draft step ----------------

LOCKSTEP = {
    "window": {"policy": "window", "capacity": 48},
    "lowrank": {"policy": "lowrank", "lowrank": {"rank": 8, "topk": 16}},  # a ranker: sets chosen per draft step
    "full": {"policy": "full"},
}


def _round_stats(gen):
    return [(r.set_size, r.accepted, r.committed, r.in_set, r.checked) for r in gen.rounds]


@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("config", list(LOCKSTEP))
def test_lockstep_batch_decodes_each_request_as_alone(models, prompts, tmp_path, monkeypatch, config, shape):
    """Three requests in lockstep (the first stops early at an EOS, so the batch shrinks): each gets the
    target's greedy output and, with its own set per request, the very rounds it gets decoded alone."""
    monkeypatch.setenv("SGLANG_SPECVOCAB_CACHE", str(tmp_path))  # the low-rank ranker's SVD
    target, drafter = models["self-draft"]
    eos = [greedy_generate(target, prompts[0], 16)[3]]
    cfg = parse_config(LOCKSTEP[config])
    alone = SpeculativeDecoder(target, drafter, cfg, SHAPES[shape], eos_token_ids=eos)
    batch = SpeculativeDecoder(target, drafter, cfg, SHAPES[shape], eos_token_ids=eos, batch=3)
    gens = batch.generate_batch(prompts, 16)
    assert len(gens[0].tokens) <= 4 < min(len(g.tokens) for g in gens[1:])  # the batch shrank as requests finished
    for prompt, gen in zip(prompts, gens, strict=True):
        one = alone.generate(prompt, 16)
        assert gen.tokens == one.tokens == greedy_generate(target, prompt, 16, eos_token_ids=eos)
        assert _round_stats(gen) == _round_stats(one)
        if config == "full":
            assert all(r.union_size == 512 for r in gen.rounds + one.rounds)
        elif config == "window":  # the batch's union holds the request's set; alone, it is that set
            assert all(r.set_size <= r.union_size <= 3 * 48 for r in gen.rounds)
            assert all(r.union_size == r.set_size for r in one.rounds)


def _drafted(dec, prompts, monkeypatch):
    """generate_batch's outputs and every draft step's (log-probs, token ids) of the whole batch."""
    seen, real = [], dec._draft_logprobs
    monkeypatch.setattr(dec, "_draft_logprobs", lambda *a: seen.append(real(*a)) or seen[-1])
    return dec.generate_batch(prompts, 16), seen


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_lockstep_union_own_drafts_bitwise_as_per_request(models, prompts, monkeypatch, shape):
    """union_view own in a lockstep batch drafts, step by step, the tokens the per-request head drafts."""
    target, drafter = models["other-lm"]

    def decoder(head):
        cfg = parse_config({"policy": "window", "capacity": 48, "head": {"kernel": "torch", **head}})
        return SpeculativeDecoder(target, drafter, cfg, SHAPES[shape], eos_token_ids=[2], batch=3)

    own = decoder({"batch": "union", "union_view": "own"})
    own_gens, own_steps = _drafted(own, prompts, monkeypatch)
    per_gens, per_steps = _drafted(decoder({"batch": "per-request"}), prompts, monkeypatch)
    assert own.head.planned and set(own.head.planned.values()) <= {"union-indexed", "union-gemm"}
    assert len(own_steps) == len(per_steps)
    for (lp_own, tok_own), (lp_per, tok_per) in zip(own_steps, per_steps, strict=True):
        assert torch.equal(tok_own, tok_per)  # the same draft tokens, bitwise
        # log-softmax over C masked columns vs W: the same terms summed in another order (last-ulp differences)
        torch.testing.assert_close(lp_own, lp_per)
    for prompt, a, b in zip(prompts, own_gens, per_gens, strict=True):
        assert a.tokens == b.tokens == greedy_generate(target, prompt, 16, eos_token_ids=[2])
        assert _round_stats(a) == _round_stats(b)


class _Spy:
    """The decoder's head, with a check of every call's output."""

    def __init__(self, head, check):
        self.head, self.check = head, check

    def __call__(self, hidden, rows):
        out = self.head(hidden, rows)
        self.check(hidden, rows, out)
        return out

    def __getattr__(self, name):
        return getattr(self.head, name)


def test_lockstep_union_all_only_adds_the_other_requests_columns(models, prompts, monkeypatch):
    """union_view all: every call's logits equal union own's on the request's own columns; the columns it adds
    are exactly the ids of the batch's other sets that its own set lacks; output stays the target's."""
    target, drafter = models["other-lm"]
    head = {"kernel": "torch", "batch": "union", "union_view": "all"}
    cfg = parse_config({"policy": "window", "capacity": 48, "head": head})
    dec = SpeculativeDecoder(target, drafter, cfg, SHAPES["tree"], eos_token_ids=[2], batch=3)
    own = DraftHead(
        drafter.weight, dec.policy.table, head=head_options(kernel="torch", batch="union", union_view="own")
    )
    added = []

    def check(hidden, rows, out):
        mine = own(hidden, rows)
        assert torch.equal(out.col_ids, mine.col_ids)  # one union of the batch's sets, ascending ids
        seen, masked = torch.isfinite(out.logits), torch.isfinite(mine.logits)
        assert bool((seen | ~masked).all()) and torch.equal(out.logits[masked], mine.logits[masked])
        sets = [set(dec.policy.table.row(int(s))) for s in rows]
        n = hidden.shape[0] // len(sets)
        for b, own_set in enumerate(sets):
            for m in range(b * n, (b + 1) * n):
                extra = set(out.col_ids[seen[m] & ~masked[m]].tolist())
                assert extra == set().union(*sets) - own_set
                added.append(len(extra))

    monkeypatch.setattr(dec, "head", _Spy(dec.head, check))
    for prompt, gen in zip(prompts, dec.generate_batch(prompts, 16), strict=True):
        assert gen.tokens == greedy_generate(target, prompt, 16, eos_token_ids=[2])
    assert max(added) > 0


def test_bad_lockstep_batches_are_refused(models, prompts):
    target, drafter = models["self-draft"]
    cfg = parse_config(CONFIGS["full"])
    for bad in (0, -2, 1.5, True):
        with pytest.raises(SpecVocabError, match=f"batch = {bad!r} is invalid: must be an integer >= 1"):
            SpeculativeDecoder(target, drafter, cfg, batch=bad)
    dec = SpeculativeDecoder(target, drafter, cfg, batch=2)
    for many in (prompts, []):
        with pytest.raises(SpecVocabError, match=f"{len(many)} prompts: this decoder decodes 1 to 2 at once"):
            dec.generate_batch(many, 5)
    with pytest.raises(SpecVocabError, match="prompt is empty"):
        dec.generate_batch([prompts[0], []], 5)
