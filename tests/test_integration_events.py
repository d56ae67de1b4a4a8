"""SGLang verify/prefill tensors -> policy events, against literal per-request constructions.

The verify rounds are laid out as the pinned SGLang lays them out (``build_tree_kernel_efficient``
retrieve_* arrays, ``verify_tree_greedy``'s predict / accept_index / accept_lens, and
``_finalize_accept_tree_path``'s compaction for topk > 1); SGLang's own kernels need
sgl_kernel / Triton, so a literal Python statement of the greedy kernel stands in for them.
"""

from pathlib import Path

import pytest
import torch
from helpers import compact_accepted, literal_event, sglang_round, window_config
from literal import LiteralWindow

from sglang_specvocab.integration.events import prefill_event, reset_rows, verify_event
from sglang_specvocab.policies import build_policy, load_config

ROOT = Path(__file__).resolve().parents[1]
NUM_ROWS = 9  # pool rows, row 0 the padding row as in SGLang


def event_of(rnd, k, compacted):
    predict = compact_accepted(rnd["predict"], rnd["accept_index"], rnd["nd"]) if compacted else rnd["predict"]
    return verify_event(
        rnd["draft_token"],
        rnd["accept_index"],
        rnd["accept_lens"],
        predict,
        rnd["logits"],
        num_draft_tokens=rnd["nd"],
        k=k,
        compacted=compacted,
    )


CASES = [  # (bs, num_draft_tokens, steps, chain)
    (3, 5, 4, True),
    (4, 8, 5, False),
    (2, 12, 3, False),
]


@pytest.mark.parametrize("bs,nd,steps,chain", CASES)
@pytest.mark.parametrize("k", [1, 3])
def test_verify_event_matches_literal_round(bs, nd, steps, chain, k):
    gen = torch.Generator().manual_seed(bs * 100 + nd + k)
    rnd = sglang_round(gen, bs, nd, steps, 40, chain, accept_depths=[(3 * i) % (steps + 1) for i in range(bs)])
    assert len(set(rnd["accept_lens"].tolist())) > 1, "requests must accept different lengths"
    lit = literal_event(rnd, k)
    for compacted in [False, True] if not chain else [False]:
        draft_tokens, vtopk, accepted = event_of(rnd, k, compacted)
        assert (
            draft_tokens.shape == (bs, nd) and vtopk.shape == (bs, steps + 1, k) and accepted.shape == (bs, steps + 1)
        )
        for i, (drafts, vt, committed) in enumerate(lit):
            n = len(committed)
            assert draft_tokens[i].tolist() == drafts
            assert accepted[i, :n].tolist() == committed and (accepted[i, n:] == -1).all()
            assert vtopk[i, :n].tolist() == vt and (vtopk[i, n:] == -1).all()


def test_chain_compacted_equals_tree_layout():
    """For chains the compaction is an identity: both readings agree (run_eagle_verify skips it for topk == 1)."""
    gen = torch.Generator().manual_seed(7)
    rnd = sglang_round(gen, 3, 5, 4, 30, True, accept_depths=[0, 2, 4])
    a, b = event_of(rnd, 2, False), event_of(rnd, 2, True)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_topk_gathered_or_in_place_agree_and_grammar_holes():
    """More logits rows than accepted ones (tree) vs fewer (chain) take different paths; -inf ids are dropped."""
    gen = torch.Generator().manual_seed(3)
    rnd = sglang_round(gen, 2, 8, 3, 20, False, accept_depths=[3, 1])
    logits = rnd["logits"].clone()
    root = int(rnd["accept_index"][0, 0])
    logits[root] = float("-inf")
    logits[root, [4, 9]] = torch.tensor([1.0, 2.0], dtype=logits.dtype)  # a grammar mask leaving two ids
    args = (rnd["draft_token"], rnd["accept_index"], rnd["accept_lens"], rnd["predict"])
    _, gathered, _ = verify_event(*args, logits, num_draft_tokens=8, k=3)
    # Same rows, in-place path: give exactly bs * width rows by viewing the accepted rows as the whole tree.
    assert gathered[0, 0].tolist() == [9, 4, -1]
    width = rnd["accept_index"].shape[1]
    idx = rnd["accept_index"].long()
    flat = torch.arange(2 * width).view(2, width).masked_fill(idx < 0, -1).to(torch.int32)
    rows = logits[idx.clamp(min=0).reshape(-1)]
    preds = rnd["predict"][idx.clamp(min=0).reshape(-1)]
    _, in_place, _ = verify_event(
        torch.zeros(2 * width, dtype=torch.int64), flat, rnd["accept_lens"], preds, rows, num_draft_tokens=width, k=3
    )
    assert torch.equal(gathered, in_place)
    # k larger than the vocabulary, and padded vocabulary columns cut by vocab_size
    padded = torch.cat([logits, torch.full((logits.shape[0], 5), 99.0, dtype=logits.dtype)], 1)
    _, cut, _ = verify_event(*args, padded, num_draft_tokens=8, k=3, vocab_size=20)
    assert torch.equal(cut, gathered)
    _, wide, _ = verify_event(*args, logits[:, :2], num_draft_tokens=8, k=3)
    assert wide.shape[2] == 3 and (wide[..., 2] == -1).all()


@pytest.mark.parametrize("config", ["microspec.yaml", "small"])
@pytest.mark.parametrize("chain", [True, False])
def test_rounds_through_policy_match_literal_window(chain, config):
    """bs requests on scattered pool rows, several rounds with different accept lengths -> table == literal."""
    cfg = load_config(ROOT / "configs" / config) if config != "small" else window_config(14, 2, 3)
    cap, kpre, kver, sources = cfg.capacity, cfg.window.prefill_topk, cfg.window.verify_topk, cfg.window.sources
    pol = build_policy(cfg, num_rows=NUM_ROWS, fallback_id=0)
    gen = torch.Generator().manual_seed(11 + chain)
    rows = torch.tensor([5, 2, 7])
    lit = {r: LiteralWindow(cap, kpre, kver, sources) for r in rows.tolist()}
    nd, steps = (5, 4) if chain else (8, 4)
    for rnd_no in range(4):
        rnd = sglang_round(gen, 3, nd, steps, 60, chain, accept_depths=[rnd_no, 4 - rnd_no, 2])
        event = event_of(rnd, kver, compacted=not chain)
        pol.on_verify(rows, *event)
        for r, (drafts, vt, _) in zip(rows.tolist(), literal_event(rnd, kver), strict=True):
            lit[r].verify(drafts, vt)
        for r in rows.tolist():
            assert pol.table.row(r) == lit[r].active(), f"row {r}, round {rnd_no}"


def test_k0_computes_no_topk_and_matches_context_window():
    cap = 10
    cfg = window_config(cap, 0, 0, ("context",))
    pol = build_policy(cfg, num_rows=NUM_ROWS, fallback_id=0)
    assert pol.verify_topk == 0
    gen = torch.Generator().manual_seed(5)
    rnd = sglang_round(gen, 2, 6, 3, 30, False, accept_depths=[3, 0])
    draft_tokens, vtopk, accepted = verify_event(
        rnd["draft_token"],
        rnd["accept_index"],
        rnd["accept_lens"],
        rnd["predict"],
        None,
        num_draft_tokens=6,
        k=pol.verify_topk,
        compacted=True,
    )
    assert vtopk is None
    rows = torch.tensor([1, 4])
    pol.on_verify(rows, draft_tokens, vtopk, accepted)
    for r, (drafts, _, _) in zip(rows.tolist(), literal_event(rnd, 0), strict=True):
        lw = LiteralWindow(cap, 0, 0, ["context"])
        lw.verify(drafts, [])
        assert pol.table.row(r) == lw.active()


# -- prefill ---------------------------------------------------------------------------------


def one_shot_topk(hidden, weight, k):
    return [sorted(range(weight.shape[0]), key=lambda v, h=h: -float(h @ weight[v]))[:k] for h in hidden]


def test_prefill_prefix_hit_and_chunks_match_one_shot_and_literal_window():
    """Prefix-cache hit (ids only), a plain prompt and a 2-chunk prompt: ids and top-K reach the policy once each."""
    V, H, k, cap = 50, 8, 3, 40
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(V, H, generator=gen, dtype=torch.float64)
    prompts = [torch.randint(0, V, (n,), generator=gen).tolist() for n in (9, 6, 11)]
    hiddens = [torch.randn(len(p), H, generator=gen, dtype=torch.float64) for p in prompts]
    full_topk = [one_shot_topk(h, weight, k) for h in hiddens]
    rows = [3, 6, 1]
    # batch 1: A has a 4-token radix hit; B plain; C chunk 1 (positions 0..5)
    # batch 2: C chunk 2 (positions 6..10): prefix 6, all fed already
    batches = [
        {"rows": rows, "pre": [4, 0, 0], "end": [9, 6, 6], "fed": [0, 0, 0]},
        {"rows": [1], "pre": [6], "end": [11], "fed": [6]},
    ]
    req_of = {3: 0, 6: 1, 1: 2}
    pol = build_policy(window_config(cap, k, 3), num_rows=NUM_ROWS, fallback_id=0)
    lit = {r: LiteralWindow(cap, k, 3, ["context", "extension"]) for r in rows}
    got = {r: ([], []) for r in rows}
    for batch in batches:
        reqs = [req_of[r] for r in batch["rows"]]
        ext = [e - p for p, e in zip(batch["pre"], batch["end"], strict=True)]
        input_ids = torch.tensor(
            [t for q, p, e in zip(reqs, batch["pre"], batch["end"], strict=True) for t in prompts[q][p:e]]
        )
        hidden = torch.cat([hiddens[q][p:e] for q, p, e in zip(reqs, batch["pre"], batch["end"], strict=True)])
        full_ids = [prompts[q] for q in reqs]
        results = [
            prefill_event(hidden, weight, input_ids, ext, batch["pre"], full_ids, batch["fed"], k=k, chunk=c)
            for c in (1, 4, 1000)
        ]
        pid, ptk = results[0]
        for other in results[1:]:
            assert torch.equal(other[0], pid) and torch.equal(other[1], ptk)
        assert pid.shape == (len(reqs), max(e - f for e, f in zip(batch["end"], batch["fed"], strict=True)))
        pol.on_prefill(torch.tensor(batch["rows"]), pid, ptk)
        for b, r in enumerate(batch["rows"]):
            n = batch["end"][b] - batch["fed"][b]
            ids_b, topk_b = pid[b, :n].tolist(), ptk[b, :n].tolist()
            assert (pid[b, n:] == -1).all() and (ptk[b, n:] == -1).all()
            got[r][0].extend(ids_b)
            got[r][1].extend(topk_b)
            real = [t for t in topk_b if t[0] >= 0]
            lit[r].prefill(ids_b, real)
    for r in rows:
        q = req_of[r]
        assert got[r][0] == prompts[q], "every prompt id exactly once, in order"
        hits = 4 if q == 0 else 0
        assert got[r][1] == [[-1] * k] * hits + full_topk[q][hits:], "one-shot top-K, -1 at prefix-cache hits"
        assert pol.table.row(r) == lit[r].active()
    # Unchunked, no hit: the event is exactly one-shot ids + top-K
    pid, ptk = prefill_event(hiddens[1], weight, torch.tensor(prompts[1]), [6], k=k, chunk=2)
    assert pid.tolist() == [prompts[1]] and ptk.tolist() == [full_topk[1]]


def test_prefill_callable_head_padded_vocab_and_k0():
    V, H, k = 30, 6, 4
    gen = torch.Generator().manual_seed(2)
    weight = torch.randn(V, H, generator=gen)
    padded = torch.cat([weight, torch.full((6, H), 50.0)])  # padding rows that would win every top-K
    hidden = torch.randn(7, H, generator=gen).abs()
    ids = torch.randint(0, V, (7,), generator=gen)
    calls = []

    def head(h):
        calls.append(h.shape[0])
        return h @ padded.T

    a = prefill_event(hidden, weight, ids, [3, 4], k=k, chunk=3)
    b = prefill_event(hidden, head, ids, [3, 4], k=k, chunk=3, vocab_size=V)
    c = prefill_event(hidden, padded, ids, torch.tensor([3, 4]), k=k, chunk=5, vocab_size=V, extend_start_loc=[0, 3])
    assert calls == [3, 3, 1]
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and torch.equal(a[1], c[1])
    assert (a[1] < V).all() and (a[1] >= 0).sum() == 7 * k
    pid, ptk = prefill_event(None, None, ids, [3, 4], k=0)
    assert ptk is None and torch.equal(pid, a[0])
    with pytest.raises(ValueError, match="full_ids"):
        prefill_event(hidden, weight, ids, [3, 4], [2, 0], k=k)


def test_prefix_hits_come_from_lists_tuples_or_tensors_and_a_short_list_is_refused():
    """Radix-cache hits seed ids only: request 0 has hit positions [1, 4) (1 fed already), request 1 none."""
    ids = torch.tensor([70, 71, 80, 81, 82])  # extended: request 0 positions 4-5, request 1 positions 0-2
    full = [10, 11, 12, 13, 70, 71]
    want = [[11, 12, 13, 70, 71], [80, 81, 82, -1, -1]]
    for seq in (full, tuple(full), torch.tensor(full, dtype=torch.int32)):
        pid, _ = prefill_event(None, None, ids, [2, 3], [4, 0], [seq, []], [1, 0], k=0)
        assert pid.tolist() == want and pid.dtype == torch.int64
    with pytest.raises(ValueError, match=r"full_ids\[0\] has 3 ids, the prefix-cache hit needs positions up to"):
        prefill_event(None, None, ids, [2, 3], [4, 0], [[10, 11, 12], []], [1, 0], k=0)


def test_a_long_prefix_hit_costs_no_python_per_id():
    """64k hit ids are unboxed in C: the whole event takes well under half of what ``torch.tensor`` of the list alone
    takes on the same machine (about 0.2 of it here; the Python loop over the ids it replaced took more than all of
    it). A ratio in one run, so a loaded machine slows both sides."""
    import time

    hit = 64_000
    full = list(range(hit + 4))
    ids = torch.arange(4)

    def timed(fn):
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    # Interleaved, best of 15 each: a burst of load on a shared machine hits both sides alike.
    pairs = [(timed(lambda: prefill_event(None, None, ids, [4], [hit], [full], [0], k=0)), timed(lambda: torch.tensor(full)))
             for _ in range(15)]  # fmt: skip
    event, boxed = min(p[0] for p in pairs), min(p[1] for p in pairs)
    pid, _ = prefill_event(None, None, ids, [4], [hit], [full], [0], k=0)
    assert pid.shape == (1, hit + 4) and pid[0, -5:].tolist() == [hit - 1, 0, 1, 2, 3]
    assert event < 0.5 * boxed, f"{event * 1e3:.2f} ms for {hit} hit ids; torch.tensor of the list {boxed * 1e3:.2f}"


# -- slot reuse ----------------------------------------------------------------------------------


class AllocatingPool:
    """``ReqToTokenPool``'s row allocation (last free rows first) and generation counter."""

    def __init__(self, size):
        self.free_slots = list(range(1, size))
        self.req_generation = torch.zeros(size, dtype=torch.int64)

    def alloc(self, n):
        sel = self.free_slots[-n:]
        del self.free_slots[-n:]
        self.req_generation[sel] += 1
        return sel

    def free(self, row):
        self.free_slots.append(row)


def test_slot_reuse_resets_the_row_and_chunks_do_not():
    V, H, cap, k = 40, 8, 12, 2
    gen = torch.Generator().manual_seed(4)
    weight = torch.randn(V, H, generator=gen, dtype=torch.float64)
    pool = AllocatingPool(NUM_ROWS)
    seen = torch.zeros(NUM_ROWS, dtype=torch.int64)
    fed = torch.zeros(NUM_ROWS, dtype=torch.int64)
    pol = build_policy(window_config(cap, k, k), num_rows=NUM_ROWS, fallback_id=0)

    def prefill(rows, prompts, pre, end):
        stale = reset_rows(pool.req_generation, seen, rows, fed)
        pol.on_reset(stale)
        ids = torch.tensor([t for p, a, b in zip(prompts, pre, end, strict=True) for t in p[a:b]])
        hidden = torch.randn(len(ids), H, generator=gen, dtype=torch.float64)
        f = fed[torch.tensor(rows)].tolist()
        pid, ptk = prefill_event(
            hidden, weight, ids, [b - a for a, b in zip(pre, end, strict=True)], pre, prompts, f, k=k
        )
        pol.on_prefill(torch.tensor(rows), pid, ptk)
        fed[torch.tensor(rows)] = torch.tensor(end)
        return stale.tolist(), pid, ptk

    (r1, r2) = pool.alloc(2)
    p1, p2 = [torch.randint(0, V, (n,), generator=gen).tolist() for n in (20, 5)]
    stale, _, _ = prefill([r1, r2], [p1, p2], [0, 0], [10, 5])
    assert sorted(stale) == sorted([r1, r2])
    stale, pid, _ = prefill([r1], [p1], [10], [20])  # chunk 2 of request 1: same row, same generation
    assert stale == [] and pid[0].tolist() == p1[10:20]
    before = pol.table.row(r2)
    pool.free(r2)
    (r3,) = pool.alloc(1)
    assert r3 == r2
    p3 = torch.randint(0, V, (6,), generator=gen).tolist()
    stale, pid, ptk = prefill([r3], [p3], [2], [6])  # a new request on the reused row, with a 2-token prefix hit
    assert stale == [r3]
    lw = LiteralWindow(cap, k, k, ["context", "extension"])
    lw.prefill(pid[0].tolist(), [t for t in ptk[0].tolist() if t[0] >= 0])
    assert pid[0].tolist() == p3 and pol.table.row(r3) == lw.active() != before
    assert reset_rows(pool.req_generation, seen, [r1, r3]).tolist() == []


# -- no host sync ----------------------------------------------------------------------------------


def test_meta_device_runs_without_host_sync():
    """Meta tensors have no data: any .item()/.tolist()/data-dependent shape would fail here."""
    meta = torch.device("meta")
    bs, nd, width, V, k = 3, 8, 5, 1000, 4
    draft_token = torch.empty(bs * nd, dtype=torch.int64, device=meta)
    accept_index = torch.empty(bs, width, dtype=torch.int32, device=meta)
    accept_lens = torch.empty(bs, dtype=torch.int32, device=meta)
    predict = torch.empty(bs * nd, dtype=torch.int32, device=meta)
    logits = torch.empty(bs * nd, V + 24, dtype=torch.bfloat16, device=meta)
    for compacted in (False, True):
        d, vt, a = verify_event(
            draft_token,
            accept_index,
            accept_lens,
            predict,
            logits,
            num_draft_tokens=nd,
            k=k,
            compacted=compacted,
            vocab_size=V,
        )
        assert d.shape == (bs, nd) and vt.shape == (bs, width, k) and a.shape == (bs, width)
        assert vt.device.type == "meta"
    d, vt, a = verify_event(draft_token, accept_index, accept_lens, predict, None, num_draft_tokens=nd, k=0)
    assert vt is None and a.shape == (bs, width)
    H = 16
    hidden = torch.empty(11, H, dtype=torch.bfloat16, device=meta)
    weight = torch.empty(V, H, dtype=torch.bfloat16, device=meta)
    input_ids = torch.empty(11, dtype=torch.int64, device=meta)
    pid, ptk = prefill_event(hidden, weight, input_ids, [4, 7], [3, 0], [[1, 2, 3], []], k=k, chunk=4)
    assert pid.shape == (2, 7) and ptk.shape == (2, 7, k) and ptk.device.type == "meta"
