"""The CPU decoder with EAGLE-3 drafts (SGLang's LlamaForCausalLMEagle3 format): lossless for every head
kind, shape and policy, and the draft it runs is the trainer's model (same inputs, same outputs)."""

import json

import pytest
import torch
from helpers import tiny_llama

from sglang_specvocab.errors import SpecVocabError
from sglang_specvocab.policies import parse_config
from sglang_specvocab.tools.lab.decoder import CausalLM, DraftShape, Eagle3LM, SpeculativeDecoder, greedy_generate
from sglang_specvocab.tools.train import checkpoint as C
from sglang_specvocab.tools.train import data as D
from sglang_specvocab.tools.train import loss as L
from sglang_specvocab.tools.train import model as M
from sglang_specvocab.tools.train import train as T

VOCAB, LAYERS, EOS = 512, 8, 2
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab_size=VOCAB, layers=LAYERS)  # fp64: batched verification equals one-at-a-time


@pytest.fixture(scope="module")
def data(target):
    g = torch.Generator().manual_seed(0)
    prompts = [
        [1] + torch.randint(3, VOCAB, (int(n),), generator=g).tolist() for n in torch.randint(4, 12, (16,), generator=g)
    ]
    return D.build_data(target, prompts, max_new_tokens=40, batch_size=16, eos_token_ids=[EOS], pad_token_id=0)


@pytest.fixture(scope="module")
def drafts(target, data, tmp_path_factory):
    """A full-vocabulary and a d2t draft, trained on the target's own answers to a few prompts (a random
    target is unpredictable, but on these prompts the draft gets chains accepted), saved in SGLang's format."""
    out = {}
    for head in ("full", "d2t"):
        hot = None if head == "full" else D.hot_vocabulary(256, VOCAB, data=data)
        cfg = M.Eagle3Config.for_target(target, draft_vocab_size=None if hot is None else 256)
        d = M.build_draft(target, cfg, hot, seed=1)
        states = D.compute_states(M.TargetTap(target, cfg.capture_layers), data, 64)
        T.train_draft(
            d,
            data,
            states,
            L.Objective.for_target(target),
            T.TrainSettings(steps=100, batch_size=8, lr=1e-2, ttt_steps=3),
        )
        path = tmp_path_factory.mktemp(head)
        C.save_checkpoint(d, path, torch.float32)
        out[head] = (d, path)
    return out


@pytest.fixture(scope="module")
def prompts(data):
    return [data.sequences[i][: data.prompt_lens[i]].tolist() for i in (0, 1)]


CONFIGS = {"full": {"policy": "full"}, "window": {"policy": "window", "capacity": 48}}
SHAPES = {"chain": DraftShape(steps=4), "tree": DraftShape(steps=3, topk=3, draft_tokens=7)}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("head", ["full", "d2t"])
def test_greedy_output_equals_target_only(target, drafts, prompts, head, config, shape):
    draft = Eagle3LM.load(drafts[head][1], target)
    dec = SpeculativeDecoder(CausalLM(target), draft, parse_config(CONFIGS[config]), SHAPES[shape], eos_token_ids=[EOS])
    accepted = 0
    for prompt in prompts:
        gen = dec.generate(prompt, 40)
        assert gen.tokens == greedy_generate(CausalLM(target), prompt, 40, eos_token_ids=[EOS])
        assert sum(r.committed for r in gen.rounds) == len(gen.tokens) - 1
        accepted += sum(r.accepted for r in gen.rounds)
        if config == "full":
            assert all(r.set_size == (VOCAB if head == "full" else 256) for r in gen.rounds)
    assert accepted > 0  # the trained draft gets tokens accepted, so multi-token rounds are exercised


@pytest.mark.parametrize("head", ["full", "d2t"])
def test_lockstep_batch_with_an_eagle3_draft(target, drafts, prompts, head):
    """Two requests in lockstep (generate_batch) with an EAGLE-3 draft, chain and tree: with per-request sets each
    gets the rounds it gets alone; with the union head seeing the whole union, still the target's output."""
    draft = Eagle3LM.load(drafts[head][1], target)
    window = CONFIGS["window"]
    union = {**window, "head": {"batch": "union", "union_view": "all"}}

    def rounds(gen):
        return [(r.set_size, r.accepted, r.committed, r.in_set, r.checked) for r in gen.rounds]

    for shape in SHAPES.values():
        alone, per, vis = (
            SpeculativeDecoder(CausalLM(target), draft, parse_config(c), shape, eos_token_ids=[EOS], batch=b)
            for c, b in ((window, 1), (window, 2), (union, 2))
        )
        for prompt, p, v in zip(prompts, per.generate_batch(prompts, 24), vis.generate_batch(prompts, 24), strict=True):
            one = alone.generate(prompt, 24)
            assert p.tokens == v.tokens == one.tokens == greedy_generate(CausalLM(target), prompt, 24, [EOS])
            assert rounds(p) == rounds(one) and sum(r.accepted for r in one.rounds) > 0
        assert vis.head.planned and set(vis.head.planned.values()) <= {"union-indexed", "union-gemm"}


def test_loaded_draft_is_the_trained_one(target, drafts):
    for head, (trained, path) in drafts.items():
        loaded = Eagle3LM.load(path, target)
        for name, p in trained.named_parameters():
            torch.testing.assert_close(dict(loaded.module.named_parameters())[name], p)
        if head == "d2t":  # the head in target-id space: trained rows at the hot ids, nothing elsewhere
            torch.testing.assert_close(loaded.weight[trained.hot_ids], trained.lm_head.weight)
            assert loaded.in_vocab.sum() == 256 and loaded.in_vocab[trained.hot_ids].all()
        else:
            assert torch.equal(loaded.weight, target.lm_head.weight.float()) and loaded.in_vocab is None


@pytest.mark.parametrize("head", ["full", "d2t"])
def test_draft_extend_and_steps_equal_the_training_time_test(target, drafts, head):
    """Extend over a prefix with the target's features, then steps fed the next tokens of the sequence and
    the draft's own hidden state: the same normed outputs as the trainer's unrolled passes."""
    d, path = drafts[head]
    draft = Eagle3LM.load(path, target)
    ids = torch.randint(3, VOCAB, (1, 24), generator=torch.Generator().manual_seed(5))
    aux, _ = M.TargetTap(target, d.cfg.capture_layers)(ids)
    with torch.no_grad():
        outs = M.ttt_forward(d, ids, aux.float(), 4)
    for p in (0, 9, 17):
        cache = draft.new_cache()
        normed, pre = draft.extend(ids[0, 1 : p + 2], aux[0, : p + 1], cache)
        torch.testing.assert_close(normed, outs[0][0, : p + 1], atol=1e-5, rtol=1e-5)
        state = pre[-1:]
        for k in range(1, 4):
            normed, state = draft.step(ids[0, p + k + 1 : p + k + 2], state, cache)
            torch.testing.assert_close(normed[0], outs[k][0, p], atol=1e-5, rtol=1e-5)


def test_every_round_drafts_from_the_trainers_first_pass(target, drafts, prompts):
    """The decoder's bookkeeping (which features go with which position after each verify): every
    round's first draft step sees the hidden state the trainer's pass 0 computes on the final text."""
    d, path = drafts["full"]
    seen = []
    dec = SpeculativeDecoder(
        CausalLM(target),
        Eagle3LM.load(path, target),
        parse_config(CONFIGS["full"]),
        DraftShape(steps=3),
        eos_token_ids=[EOS],
        recorder=lambda h, t: seen.append((h.clone(), t.clone())),
    )
    prompt = prompts[1]
    gen = dec.generate(prompt, 40)
    seq = torch.tensor([prompt + gen.tokens])
    aux, _ = M.TargetTap(target, d.cfg.capture_layers)(seq)
    with torch.no_grad():
        first = M.ttt_forward(d, seq, aux.float(), 1)[0][0]
    root = len(prompt)  # position of each round's root (the last committed token)
    for r, rnd in enumerate(gen.rounds):
        h, tok = seen[3 * r]
        assert int(tok[0]) == int(seq[0, root])
        torch.testing.assert_close(h[0], first[root - 1], atol=1e-4, rtol=1e-4)
        root += rnd.committed
    assert len(gen.rounds) > 1


def test_text_recording_keeps_every_draft_step_of_a_chain(target, drafts):
    """train-ranker's text recording with --draft-steps 3: at each kept position, the draft's state at steps 0, 1 and
    2 of a chain that starts there (the trainer's unrolled passes, the text's tokens as the chain's), with the token
    each step consumed; one step is the draft-extend state alone, as before."""
    from sglang_specvocab.tools.lab.rankers import record_text_states

    d, path = drafts["full"]
    draft = Eagle3LM.load(path, target)
    g = torch.Generator().manual_seed(7)
    seqs = [torch.randint(3, VOCAB, (n,), generator=g) for n in (9, 2, 14)]
    hidden, tokens = record_text_states(CausalLM(target), draft, seqs, steps=3)
    want_h, want_t = [], []
    for seq in seqs:
        aux, _ = M.TargetTap(target, d.cfg.capture_layers)(seq[None])
        with torch.no_grad():
            outs = M.ttt_forward(d, seq[None], aux.float(), 3)
        for k in range(3):  # pass k, row i: drafts from token i + k + 1, which must be in the text
            rows = torch.arange(max(0, len(seq) - 1 - k))
            want_h.append(outs[k][0, rows])
            want_t.append(seq[rows + k + 1])
    assert len(hidden) == sum(3 * n - 6 for n in (9, 14)) + 1  # the 2-token text has pass 0's one row only
    torch.testing.assert_close(hidden, torch.cat(want_h), atol=1e-5, rtol=1e-5)
    assert torch.equal(tokens, torch.cat(want_t))
    one, one_tokens = record_text_states(CausalLM(target), draft, seqs, steps=1)
    first = [torch.arange(len(s) - 1) for s in seqs]  # pass 0's rows of each text, in the order recorded above
    starts = torch.tensor([0, 3 * 9 - 6, 3 * 9 - 6 + 1])
    rows = torch.cat([s + r for s, r in zip(starts, first, strict=True)])
    torch.testing.assert_close(one, hidden[rows], atol=1e-5, rtol=1e-5)
    assert torch.equal(one_tokens, tokens[rows])
    kept, _ = record_text_states(CausalLM(target), draft, seqs, per_sequence=4, seed=3, steps=3)
    # 4 positions of each text, every step's state where the text goes on that far: positions past it drop out
    assert 1 + 4 < len(kept) <= 4 * 3 + 1 + 4 * 3


def test_bad_drafts_are_refused(target, drafts, tmp_path):
    _, path = drafts["full"]
    other = tiny_llama(vocab_size=VOCAB + 1, layers=LAYERS)
    with pytest.raises(SpecVocabError, match=r"vocab_size 512 is not the target's 513"):
        Eagle3LM.load(path, other)
    with pytest.raises(SpecVocabError, match="cannot read config.json"):
        Eagle3LM.load(tmp_path / "nowhere", target)
    bad = tmp_path / "bad"
    bad.mkdir()
    cfg = json.loads((path / "config.json").read_text())
    (bad / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes())
    (bad / "config.json").write_text(json.dumps({**cfg, "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(SpecVocabError, match="LlamaForCausalLMEagle3"):
        Eagle3LM.load(bad, target)
    (bad / "config.json").write_text(
        json.dumps({**cfg, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 1, 9]}})
    )
    with pytest.raises(SpecVocabError, match="capture layers"):
        Eagle3LM.load(bad, target)
    import numpy as np

    from sglang_specvocab.vocab_data import save_frequency_table

    save_frequency_table(tmp_path / "f.npz", np.arange(VOCAB, 0, -1), tokenizer="tiny", source="test")
    retrieval = {"table": str(tmp_path / "f.npz"), "static_size": 64, "dynamic_size": 16}
    align = parse_config({"policy": "retrieval", "retrieval": retrieval, "align": {}})
    with pytest.raises(SpecVocabError, match="align .* EAGLE-3"):
        SpeculativeDecoder(CausalLM(target), Eagle3LM.load(path, target), align)
