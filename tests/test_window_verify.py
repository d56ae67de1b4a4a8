"""``window_verify``: a whole verify round of the window policy in one op (the eager verify hook's host time).

Two definitions must agree: the torch reference of the op (``ops/window_verify.py::reference_window_verify``) and the
generic path the worker takes for every other policy (``verify_event`` + ``Telemetry.record_verify`` +
``policy.on_verify``, with the d2t wrapper's holes). The C++ op (the same row code the CUDA kernel runs)
must equal the reference on random rounds: chains and trees, compacted or not, context on and off,
``k`` above the top-k held, -inf logits, positions past ``accept_lens``, ids outside the vocabulary or
outside a draft vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import pytest
import torch

from sglang_specvocab import ops
from sglang_specvocab.integration.events import verify_event
from sglang_specvocab.integration.telemetry import Telemetry
from sglang_specvocab.ops import WindowRound, _ext
from sglang_specvocab.ops.window_update import reference_window_update
from sglang_specvocab.ops.window_verify import reference_window_verify
from sglang_specvocab.policies import DraftVocabPolicy, ModelContext, build_policy, parse_config
from sglang_specvocab.vocab import VocabSpace

needs_ext = pytest.mark.skipif(not _ext.available(), reason="the kernels extension is not built")


def random_round(g, B, nd, S, V, pad=0, compacted=False):
    """SGLang's verify tensors for one round of B requests (int32 where SGLang has int32)."""
    draft_token = torch.randint(-1, V + 2, (B * nd,), generator=g)  # a few ids outside [0, V)
    accept_lens = torch.randint(1, S + 1, (B,), generator=g).to(torch.int32)
    accept_index = torch.full((B, S), -1, dtype=torch.int32)
    for b in range(B):
        n = int(torch.randint(0, S + 1, (1,), generator=g))  # sometimes longer than accept_lens: those are cut
        nodes = torch.randperm(nd, generator=g)[:n].sort().values + b * nd
        accept_index[b, : nodes.numel()] = nodes.to(torch.int32)
    predict = torch.randint(0, V, (B * nd,), generator=g).to(torch.int32)
    logits = torch.randn(B * nd, V + pad, generator=g)
    logits[torch.rand(B * nd, V + pad, generator=g) < 0.3] = float("-inf")  # a grammar mask forbids ids
    logits[:, V:] = 100.0  # padded vocabulary columns must never be picked
    return draft_token, accept_index, accept_lens, predict, logits


def window_state(g, R, cap, V):
    """The window's state as ``WindowRound`` names it: what the op updates in place."""
    ring = torch.full((R, cap + 1), -1, dtype=torch.int32)
    ring[:, :cap] = torch.randint(-1, V, (R, cap), generator=g).to(torch.int32)
    length = torch.randint(0, 3 * cap, (R,), generator=g)
    ids = torch.zeros(R, cap, dtype=torch.int32)
    cnt = torch.ones(R, dtype=torch.int32)
    reference_window_update(ring, length, ids, cnt, torch.arange(R), torch.empty(R, 0, dtype=torch.int32), 0, V)
    acc = torch.rand(4, R, generator=g, dtype=torch.float64)
    return {"ring": ring, "length": length, "ids": ids, "cnt": cnt, "acc": acc}


def round_of(state, rows, draft, index, lens, predict, values, top, hot, k, context, compacted, V, fallback_id=3):
    return WindowRound(
        **state,
        rows=rows,
        draft_token=draft,
        accept_index=index,
        accept_lens=lens,
        predict=predict,
        topk_values=values,
        topk_ids=top,
        hot=hot,
        k=k,
        context=context,
        compacted=compacted,
        fallback_id=fallback_id,
        vocab_size=V,
    )


CASES = [  # (B, nd, S, k, kk, context, compacted, hot)
    (1, 4, 4, 3, 3, True, False, False),  # a chain
    (3, 8, 4, 3, 3, True, True, False),  # a compacted tree
    (3, 8, 4, 3, 3, True, False, True),  # a tree, a d2t draft
    (2, 6, 3, 4, 2, True, False, False),  # k above the top-k held (a tiny vocabulary)
    (4, 5, 4, 2, 2, False, False, True),  # extension only
    (2, 4, 4, 0, 0, True, True, False),  # context only
]


@needs_ext
@pytest.mark.parametrize(
    "B,nd,S,k,kk,context,compacted,hot,V",
    [(*case, 40) for case in CASES] + [(4, 64, 9, 60, 60, True, False, True, 300)],  # 604 entries a request
)
def test_cpp_op_equals_the_reference(B, nd, S, k, kk, context, compacted, hot, V):
    cap, R = 12, 9
    g = torch.Generator().manual_seed(B * 100 + nd * 10 + k)
    for trial in range(30):
        draft, index, lens, predict, logits = random_round(g, B, nd, S, V, compacted=compacted)
        values, top = logits.topk(kk, dim=-1) if kk else (logits[:, :0], torch.empty(B * nd, 0, dtype=torch.int64))
        mask = (torch.rand(V + 5, generator=g) < 0.6) if hot else None
        rows = torch.randperm(R, generator=g)[:B]
        state = window_state(g, R, cap, V)
        args = (rows, draft, index, lens, predict, values, top, mask, k, context, compacted, V)
        mine = round_of({n: t.clone() for n, t in state.items()}, *args)
        want = reference_window_verify(round_of(state, *args))
        got = ops.window_verify(mine, backend="cuda")  # the C++ op on CPU tensors
        assert torch.equal(got, want), trial
        for name, t in state.items():
            assert torch.equal(getattr(mine, name), t), trial


def window(kernel: str, R: int, cap: int, k: int, sources=("context", "extension")):
    # only the extension source reads a top-K (a config that sets one without it is refused)
    topk = {"prefill_topk": 2, "verify_topk": k} if "extension" in sources else {}
    config = parse_config(
        {
            "policy": "window",
            "capacity": cap,
            "head": {"kernel": kernel},
            "window": {**topk, "sources": list(sources)},
        }
    )
    return build_policy(config, num_rows=R, fallback_id=1)


def generic_round(policy, telemetry, rows, draft, index, lens, predict, logits, V, nd, compacted, hot):
    """What the worker does for a policy without ``on_verify_round`` (the d2t wrapper's holes included)."""
    draft_tokens, verify_topk, accepted = verify_event(
        draft,
        index,
        lens,
        predict,
        logits,
        num_draft_tokens=nd,
        k=policy.verify_topk,
        compacted=compacted,
        vocab_size=V,
    )
    telemetry.record_verify(policy.table, rows, accepted, V)

    def keep(t):  # an id outside the draft vocabulary (or past it) is a hole
        if hot is None or t is None:
            return t
        return torch.where((t >= 0) & (t < hot.numel()) & hot[t.clamp(0, hot.numel() - 1)], t, -1)

    policy.on_verify(rows, keep(draft_tokens), keep(verify_topk), keep(accepted))


@pytest.mark.parametrize("kernel", ["torch", pytest.param("cuda", marks=needs_ext)])
@pytest.mark.parametrize(
    "nd,S,compacted,hot,sources",
    [
        (4, 4, False, False, ("context", "extension")),
        (8, 4, True, False, ("context", "extension")),
        (8, 4, False, True, ("context", "extension")),
        (6, 3, False, False, ("extension",)),
        (6, 3, True, True, ("context",)),
    ],
)
def test_the_fused_round_equals_the_generic_path(kernel, nd, S, compacted, hot, sources):
    """Same rings, sets and telemetry as verify_event + record_verify + on_verify, round after round."""
    V, cap, R, B, k = 50, 16, 7, 4, 3
    g = torch.Generator().manual_seed(nd * 7 + S)
    generic, fused = window("torch", R, cap, k, sources), window(kernel, R, cap, k, sources)
    tel_generic, tel_fused = Telemetry(R), Telemetry(R)
    mask = (torch.rand(V, generator=g) < 0.5) if hot else None
    prompt = torch.randint(0, V, (R, 20), generator=g)
    prompt = prompt if mask is None else torch.where(mask[prompt], prompt, -1)
    for p in (generic, fused):
        p.on_prefill(torch.arange(R), prompt, None if p.prefill_topk == 0 else prompt[:, :, None].repeat(1, 1, 2))
    for _ in range(25):
        rows = torch.randperm(R, generator=g)[:B]
        draft, index, lens, predict, logits = random_round(g, B, nd, S, V, pad=3, compacted=compacted)
        generic_round(generic, tel_generic, rows, draft, index, lens, predict, logits, V, nd, compacted, mask)
        fused.on_verify_round(
            rows, draft, index, lens, predict, logits, compacted=compacted, vocab_size=V, acc=tel_fused.acc, hot=mask
        )
        assert torch.equal(fused.table.ids, generic.table.ids) and torch.equal(fused.table.cnt, generic.table.cnt)
        assert torch.equal(fused.ring, generic.ring) and torch.equal(fused.length, generic.length)
        assert torch.equal(tel_fused.acc, tel_generic.acc)


@pytest.mark.parametrize("kernel", ["torch", pytest.param("cuda", marks=needs_ext)])
@pytest.mark.parametrize("hot", [False, True], ids=["full", "d2t"])
def test_the_fused_round_syncs_nothing(kernel, hot):
    """The round under ``testing.graphs.capture``: no host read, no data-dependent shape, no copy between host and
    device, from a cold start (the reference's segment mask, cached per shape, is made on the device)."""
    from sglang_specvocab.table import _earlier_in_segment
    from sglang_specvocab.tools.testing.graphs import capture

    V, cap, R, B, k, nd, S = 50, 16, 7, 4, 3, 6, 3
    g = torch.Generator().manual_seed(3)
    policy, telemetry = window(kernel, R, cap, k), Telemetry(R)
    mask = (torch.rand(V, generator=g) < 0.5) if hot else None
    prompt = torch.randint(0, V, (R, 20), generator=g)
    policy.on_prefill(torch.arange(R), prompt, prompt[:, :, None].repeat(1, 1, 2))
    _earlier_in_segment.cache_clear()
    for compacted in (False, True):
        rows = torch.randperm(R, generator=g)[:B]
        draft, index, lens, predict, logits = random_round(g, B, nd, S, V, pad=3, compacted=compacted)
        round_ = functools.partial(policy.on_verify_round, rows, draft, index, lens, predict, logits)
        capture(functools.partial(round_, compacted=compacted, vocab_size=V, acc=telemetry.acc, hot=mask))


@pytest.mark.parametrize("backend", ["torch", pytest.param("cuda", marks=needs_ext)])
def test_bad_input_is_refused_naming_the_argument(backend):
    """Every backend refuses in Python (the op's check runs before the compiled op, so the extension is never
    entered with bad input: see ops/_backend.py), naming the argument."""
    from sglang_specvocab.tools.bench.host import LaunchCounter

    V, cap, R, B, nd, S = 30, 8, 5, 2, 4, 3
    g = torch.Generator().manual_seed(0)
    draft, index, lens, predict, logits = random_round(g, B, nd, S, V)
    values, top = logits.topk(2, dim=-1)
    state = window_state(g, R, cap, V)
    good = round_of(state, torch.tensor([1, 3]), draft, index, lens, predict, values, top, None, 2, True, False, V, 0)
    acc = state["acc"].clone()
    bad = [
        ({"acc": state["acc"][:, :2]}, "acc must be"),
        ({"acc": state["acc"].t().contiguous().t()}, "acc must be contiguous"),
        ({"predict": predict[:-1]}, "predict must be"),
        ({"topk_values": values[:, :1]}, "topk_values"),
        ({"rows": torch.tensor([1, 1])}, "rows must be"),
        # the window update's own arguments are refused before the round reads cnt or adds to the telemetry
        ({"cnt": state["cnt"][:2]}, "cnt must be"),
        ({"ids": state["ids"].t().contiguous().t()}, "ids must be a contiguous int32 [R, capacity] table"),
    ]
    for change, phrase in bad:
        with LaunchCounter() as seen, pytest.raises(ValueError, match=re.escape(phrase)):
            ops.window_verify(dataclasses.replace(good, **change), backend=backend)
        assert "window_verify" not in seen.order, phrase
    assert torch.equal(state["acc"], acc)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "B,nd,S,k,kk,context,compacted,hot,V",
    [(*case, 40) for case in CASES]
    + [
        (64, 8, 4, 3, 3, True, True, True, 40),
        (150, 8, 4, 3, 3, True, True, False, 40),  # 150 blocks
        (4, 64, 9, 60, 60, True, False, False, 300),  # 604 entries a request: more than the block's 512 threads
        (6, 8, 4, 3, 3, True, True, True, 262144),  # Gemma-3's vocabulary: a 32 KB bitmap
        (3, 8, 4, 3, 3, True, False, False, 400000),  # a bitmap past 48 KB: the kernel opts in to more
    ],
)
def test_cuda_op_equals_the_reference(B, nd, S, k, kk, context, compacted, hot, V):
    """The CUDA kernel (a block per request: its entries a thread each with the C++ op's row code, then the window
    update over them in shared memory, one launch) against the reference."""
    if not _ext.has_cuda_kernels():
        pytest.skip("the extension was built without CUDA kernels")
    cap, R = 12, max(70, B + 6)
    g = torch.Generator().manual_seed(B + nd + k)
    for trial in range(20 if V < 1000 else 3):
        draft, index, lens, predict, logits = random_round(g, B, nd, S, V, compacted=compacted)
        values, top = logits.topk(kk, dim=-1) if kk else (logits[:, :0], torch.empty(B * nd, 0, dtype=torch.int64))
        mask = (torch.rand(V + 5, generator=g) < 0.6) if hot else None
        rows = torch.randperm(R, generator=g)[:B]
        state = window_state(g, R, cap, V)
        args = (rows, draft, index, lens, predict, values, top, mask, k, context, compacted, V)
        on_gpu = round_of(
            {n: t.cuda() for n, t in state.items()}, *(a.cuda() if torch.is_tensor(a) else a for a in args)
        )
        want = reference_window_verify(round_of(state, *args))
        got = ops.window_verify(on_gpu, backend="cuda")
        assert torch.equal(got.cpu(), want), trial
        for name, t in state.items():
            assert torch.equal(getattr(on_gpu, name).cpu(), t), trial


@pytest.mark.parametrize("kernel", ["torch", pytest.param("cuda", marks=needs_ext)])
def test_a_d2t_draft_takes_the_fused_round_with_its_vocabulary_as_holes(kernel):
    """build_policy wraps the window for a d2t draft: the fused round then equals the wrapper's generic path."""
    V, cap, R, B, nd, S = 50, 16, 7, 4, 8, 4
    g = torch.Generator().manual_seed(5)
    mask = torch.rand(V, generator=g) < 0.5
    mask[1] = True  # the fallback id has a head row
    model = ModelContext(space=VocabSpace.build(V, head_ids=mask.nonzero().flatten()), eos_token_ids=(1,))
    config = {"policy": "window", "capacity": cap, "window": {"prefill_topk": 2, "verify_topk": 3}}
    generic = build_policy(parse_config({**config, "head": {"kernel": "torch"}}), R, fallback_id=1, model=model)
    fused = build_policy(parse_config({**config, "head": {"kernel": kernel}}), R, fallback_id=1, model=model)
    assert isinstance(fused, DraftVocabPolicy) and fused.fused_verify
    tel_generic, tel_fused = Telemetry(R), Telemetry(R)
    for _ in range(20):
        rows = torch.randperm(R, generator=g)[:B]
        draft, index, lens, predict, logits = random_round(g, B, nd, S, V, compacted=False)
        d, top, acc = verify_event(draft, index, lens, predict, logits, num_draft_tokens=nd, k=3, vocab_size=V)
        tel_generic.record_verify(generic.table, rows, acc, V)
        generic.on_verify(rows, d, top, acc)  # the wrapper's holes
        fused.on_verify_round(
            rows, draft, index, lens, predict, logits, compacted=False, vocab_size=V, acc=tel_fused.acc
        )
        assert torch.equal(fused.table.ids, generic.table.ids) and torch.equal(fused.table.cnt, generic.table.cnt)
        assert torch.equal(tel_fused.acc, tel_generic.acc)
        assert bool(mask[fused.table.ids[rows].long()].all())  # sets hold only ids with a head row
