"""The window policy against a literal per-request reference, through its batched tensor API."""

import torch
from helpers import pad, pad3
from hypothesis import given, settings
from hypothesis import strategies as st
from literal import LiteralWindow

from sglang_specvocab.policies import build_policy, parse_config

SOURCES = [["context", "extension"], ["context"], ["extension"]]


@st.composite
def setups(draw):
    sources = draw(st.sampled_from(SOURCES))
    top = 4 if "extension" in sources else 0  # only the extension source reads a top-K (a set one is refused)
    kpre = draw(st.integers(1 if sources == ["extension"] else 0, top))
    kver = draw(st.integers(0, top))
    cap = draw(st.integers(1, 40))
    vocab = draw(st.integers(2, 200))
    return sources, kpre, kver, cap, vocab


def ids(vocab, lo=0, hi=12):
    return st.lists(st.integers(0, vocab - 1), min_size=lo, max_size=hi)


def topk(vocab, k, lo=1, hi=6):
    # providers may give more ids per position than the policy uses
    return st.lists(st.lists(st.integers(0, vocab - 1), min_size=k, max_size=k + 2), min_size=lo, max_size=hi)


@settings(max_examples=150)
@given(data=st.data(), setup=setups())
def test_interleaved_events_on_many_rows_match_literal(data, setup):
    """Random events on random row subsets, resets included (slot reuse), against the literal rule."""
    sources, kpre, kver, cap, vocab = setup
    cfg = parse_config(
        {"policy": "window", "capacity": cap, "window": {"prefill_topk": kpre, "verify_topk": kver, "sources": sources}}
    )
    rows_n = data.draw(st.integers(2, 6))
    pol = build_policy(cfg, num_rows=rows_n, fallback_id=0)
    table = pol.table
    ptrs = [t.data_ptr() for t in (table.ids, table.cnt, pol.ring, pol.length)]
    lit = {r: LiteralWindow(cap, kpre, kver, sources) for r in range(rows_n)}
    for _ in range(data.draw(st.integers(1, 25))):
        rows = data.draw(st.lists(st.integers(0, rows_n - 1), min_size=1, max_size=rows_n, unique=True))
        kind = data.draw(st.sampled_from(["reset", "prefill", "verify", "verify"]))
        t_rows = torch.tensor(rows)
        if kind == "reset":
            pol.on_reset(t_rows)
            for r in rows:
                lit[r] = LiteralWindow(cap, kpre, kver, sources)
        elif kind == "prefill":
            prompts = [data.draw(ids(vocab, 1, 3 * cap + 2)) for _ in rows]
            ptopk = [data.draw(topk(vocab, kpre, len(p), len(p))) for p in prompts]
            pol.on_prefill(t_rows, pad(prompts), pad3([[x[:kpre] for x in t] for t in ptopk], kpre) if kpre else None)
            for r, p, t in zip(rows, prompts, ptopk, strict=True):
                lit[r].prefill(p, t)
        else:
            drafts = [data.draw(ids(vocab, 0, 12)) for _ in rows]
            vtopk = [data.draw(topk(vocab, kver, 1, 6)) for _ in rows]
            accepted = [v[0][:1] if v[0] else [] for v in vtopk]
            kgive = max([len(p) for v in vtopk for p in v] + [kver])
            vt = pad3([[x + [x[0] if x else 0] * (kgive - len(x)) for x in v] for v in vtopk], kgive) if kver else None
            pol.on_verify(t_rows, pad(drafts), vt, pad(accepted))
            for r, d, v in zip(rows, drafts, vtopk, strict=True):
                lit[r].verify(d, [x[:kver] for x in v])
        for r in range(rows_n):
            assert table.row(r) == lit[r].active(), f"row {r} after {kind}"
            assert 1 <= int(table.cnt[r]) <= cap
    assert [t.data_ptr() for t in (table.ids, table.cnt, pol.ring, pol.length)] == ptrs  # mutated in place only


def test_prompt_longer_than_capacity_keeps_its_last_entries():
    cfg = parse_config({"policy": "window", "capacity": 4, "window": {"prefill_topk": 0, "sources": ["context"]}})
    pol = build_policy(cfg, num_rows=2)
    rows = torch.tensor([1])
    pol.on_prefill(rows, torch.tensor([[10, 11, 12, 13, 14, 15, 13, 16]]), None)
    assert pol.table.row(1) == [13, 14, 15, 16]  # last 4 entries: 14 15 13 16
    pol.on_verify(rows, torch.tensor([[20, 20, 15]]), None, torch.tensor([[20]]))
    assert pol.table.row(1) == [13, 15, 16, 20]  # stream ... 13 16 20 15: a token stays while any occurrence does


def test_empty_event_blocks_change_nothing():
    cfg = parse_config({"policy": "window", "capacity": 8})
    pol = build_policy(cfg, num_rows=3)
    rows = torch.tensor([1, 2])
    pol.on_prefill(rows, torch.tensor([[5, 6, -1], [7, -1, -1]]), torch.tensor([[[1, 2, 3]] * 3, [[4, 4, 4]] * 3]))
    before = pol.table.ids.clone(), pol.table.cnt.clone()
    pol.on_verify(
        rows, torch.empty(2, 0, dtype=torch.long), torch.full((2, 1, 3), -1), torch.empty(2, 0, dtype=torch.long)
    )
    assert torch.equal(pol.table.ids, before[0]) and torch.equal(pol.table.cnt, before[1])
    assert pol.table.row(2) == [4, 7]  # top-K ids of padding positions (-1) are not entries


def test_required_topk_follows_sources():
    both = build_policy(
        parse_config({"policy": "window", "capacity": 8, "window": {"prefill_topk": 2, "verify_topk": 5}}), 2
    )
    ctx = build_policy(parse_config({"policy": "window", "capacity": 8, "window": {"sources": ["context"]}}), 2)
    assert (both.prefill_topk, both.verify_topk) == (2, 5)
    assert (ctx.prefill_topk, ctx.verify_topk) == (0, 0)


def test_per_round_path_never_reads_tensor_data_on_the_host():
    """Run every event and the head on the meta device: any .item()/.tolist()/bool() would raise."""
    from sglang_specvocab.head import DraftHead

    cfg = parse_config({"policy": "window", "capacity": 64})
    pol = build_policy(cfg, num_rows=5, device="meta")
    rows = torch.tensor([1, 3], device="meta")
    meta = dict(dtype=torch.int64, device="meta")
    pol.on_reset(rows)
    pol.on_prefill(rows, torch.zeros(2, 10, **meta), torch.zeros(2, 10, 3, **meta))
    pol.on_verify(rows, torch.zeros(2, 5, **meta), torch.zeros(2, 4, 3, **meta), torch.zeros(2, 4, **meta))
    head = DraftHead(torch.zeros(1000, 16, device="meta"), pol.table)
    out = head(torch.zeros(6, 16, device="meta"), rows)
    _values, tokens = out.topk(4)
    assert out.logits.shape == (6, 64) and tokens.shape == (6, 4)
