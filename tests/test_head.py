"""The one head (``DraftHead``): its ops' torch reference, every batch mode against a literal statement, the union's
overflow, the d2t/TP row map keeping request slots, softcapping, and the cost model's choice from shapes only."""

import dataclasses

import pytest
import torch
from literal import literal_head_topk, literal_logits

from sglang_specvocab import headcost
from sglang_specvocab.config import HeadSection, default_union_columns
from sglang_specvocab.head import DraftHead, HeadOutput, head_options
from sglang_specvocab.ops import indexed_logits
from sglang_specvocab.ops.topk import local_topk, vocab_shard
from sglang_specvocab.table import CandidateTable
from sglang_specvocab.tools.bench.host import LaunchCounter
from sglang_specvocab.vocab import VocabSpace

NEG_INF = float("-inf")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_indexed_logits_matches_naive_loop(dtype):
    g = torch.Generator().manual_seed(0)
    V, d, R, W, M = 300, 24, 5, 37, 9
    weight = torch.randn(V, d, generator=g).to(dtype)
    hidden = torch.randn(M, d, generator=g).to(dtype)
    ids = torch.randint(0, V, (R, W), generator=g, dtype=torch.int32)
    ids[1, :5] = 7  # duplicate ids are allowed
    ids[3, 2:9:3] = -1  # negative ids are dead columns
    ids[2, 6:] = -5  # (also past the count)
    cnt = torch.tensor([1, W, 5, 17, 2], dtype=torch.int32)
    row_to_slot = torch.tensor([0, 1, 1, 2, 3, 3, 3, 4, 1], dtype=torch.int32)  # rows share slots
    got = indexed_logits(hidden, weight, ids, cnt, row_to_slot)
    want = literal_logits(hidden, weight, ids, cnt, row_to_slot).float()
    assert got.dtype == torch.float32 and got.shape == (M, W)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    live = ~torch.isinf(want)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert torch.allclose(got[live], want[live], rtol=tol, atol=tol)


@pytest.mark.parametrize("args,msg", [
    (dict(hidden=torch.zeros(2, 3, 4)), "hidden must be \\[M, d\\]"),
    (dict(weight=torch.zeros(10, 5)), "hidden has d=4 but weight has d=5"),
    (dict(weight=torch.zeros(10, 4, dtype=torch.float16)), "weight dtype torch.float16 must equal hidden dtype"),
    (dict(hidden=torch.zeros(2, 4, dtype=torch.int32), weight=torch.zeros(10, 4, dtype=torch.int32)), "hidden dtype torch.int32"),
    (dict(ids=torch.zeros(3, 6, dtype=torch.int64)), "ids must be int32"),
    (dict(cnt=torch.ones(2, dtype=torch.int32)), "cnt must be int32 \\[R=3\\]"),
    (dict(row_to_slot=torch.zeros(3, dtype=torch.int32)), "row_to_slot must be int32 or int64 \\[B\\] with B dividing M=2"),
])  # fmt: skip
def test_indexed_logits_refuses_bad_input(args, msg):
    # Bad table values (slots, counts, ids) are not refused but read as -inf and counted, the same on every
    # backend, and refused under the debug setting: tests/test_bad_entries.py.
    base = dict(hidden=torch.zeros(2, 4), weight=torch.zeros(10, 4), ids=torch.zeros(3, 6, dtype=torch.int32),
                cnt=torch.ones(3, dtype=torch.int32), row_to_slot=torch.zeros(2, dtype=torch.int32))  # fmt: skip
    base.update(args)
    with pytest.raises(ValueError, match="indexed_logits: " + msg):
        indexed_logits(**base)


# --- the head against a literal statement ---------------------------------------------------------------

V, D, R, W = 400, 12, 7, 24
FALLBACK = 5


def _case(seed=0, sizes=(1, W, 3, 9, W - 1, 2, 14)):
    """Small-integer weights and hidden rows (every dot product exact in fp32, many ties) and a table whose sets
    overlap (drawn from 120 ids) so the union is smaller than their sum."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randint(-2, 3, (V, D), generator=g).float()
    table = CandidateTable(R, W, fallback_id=FALLBACK)
    pool = torch.randperm(V, generator=g)[:120]
    cands = torch.full((R, W), -1)
    for r, n in enumerate(sizes):
        cands[r, :n] = pool[torch.randperm(120, generator=g)[:n]]
    table.assign(torch.arange(R), cands)
    sets = {r: table.row(r) for r in range(R)}
    rows = torch.tensor([3, 0, 6, 1, 4])  # request-major, the padding slot 0 included
    hidden = torch.randint(-2, 3, (rows.numel() * 3, D), generator=g).float()
    return weight, table, sets, rows, hidden


def _pairs(out, k):
    values, tokens = out.topk(k)
    return [list(zip(v, t)) for v, t in zip(values.tolist(), tokens.tolist(), strict=True)]


@pytest.mark.parametrize("kernel", ["torch", "cuda"])  # cuda: the extension's C++ kernels on CPU tensors
@pytest.mark.parametrize(
    "batch,view,literal",
    [
        ("per-request", "own", "per-request"),
        ("union-indexed", "own", "union-own"),
        ("union-gemm", "own", "union-own"),
        ("union-indexed", "all", "union-all"),
        ("union-gemm", "all", "union-all"),
        ("stock", "own", "stock"),
    ],
)
@pytest.mark.parametrize("k", [1, 4, W])
def test_every_batch_mode_equals_the_literal_topk(kernel, batch, view, literal, k):
    weight, table, sets, rows, hidden = _case()
    head = DraftHead(weight, table, head=head_options(kernel=kernel, batch=batch, union_view=view))
    out = head(hidden, rows)
    got = _pairs(out, k)
    assert out.plan == batch
    assert got == literal_head_topk(hidden, weight, sets, rows, k, FALLBACK, batch=literal)


def test_union_seen_own_is_per_request_and_no_wider_than_its_union():
    weight, table, sets, rows, hidden = _case(seed=4)
    per = DraftHead(weight, table, head=head_options(batch="per-request"))(hidden, rows)
    union = DraftHead(weight, table, head=head_options(batch="union-indexed"))(hidden, rows)
    want = sorted(set().union(*(sets[int(s)] for s in rows)))
    assert union.col_ids[: len(want)].tolist() == want and bool((union.col_ids[len(want) :] == -1).all())
    for k in (1, 5, W):
        v1, t1, l1 = per.topk_lse(k)
        v2, t2, l2 = union.topk_lse(k)
        assert torch.equal(v1, v2) and torch.equal(t1, t2)
        torch.testing.assert_close(l1, l2)  # over the same live logits (summed in another order)


def test_the_head_takes_the_config_section_whole():
    weight, table = torch.randn(1000, 8), CandidateTable(3, 16)
    head = DraftHead(weight, table, head=HeadSection(kernel="torch", batch="union", union_view="all"))
    assert (head.mode, head.batch, head.union_view) == ("fused", "union", "all")
    assert head.union_capacity == default_union_columns(16, 1000) == 256  # the config's default, over the head rows
    assert DraftHead(weight, table, head=HeadSection(kernel="torch", union_capacity=100)).union_capacity == 100
    assert DraftHead(weight, table, head=head_options(batch="union-gemm")).plan(2, 1) == "union-gemm"  # a plan
    with pytest.raises(ValueError, match="batch = 'ragged' is invalid"):
        DraftHead(weight, table, head=head_options(batch="ragged"))  # head_options skips the schema: the head checks


def test_union_overflow_keeps_the_lowest_ids_and_is_counted():
    weight, table, sets, rows, hidden = _case(seed=2)
    # slot 0 (the batch's second request) gets one id above every other set's: the overflow drops its whole set
    top = max(set(range(V)) - set().union(*(sets[int(s)] for s in rows if int(s) != 0)))
    table.assign(torch.tensor([0]), torch.tensor([[top] + [-1] * (W - 1)]))
    sets[0] = table.row(0)
    union = sorted(set().union(*(sets[int(s)] for s in rows)))
    C = W + 3
    assert len(union) > C and top not in union[:C]
    head = DraftHead(weight, table, head=head_options(batch="union-indexed", union_capacity=C))
    out = head(hidden, rows)
    assert out.col_ids.tolist() == union[:C] and int(head.union_overflow) == 1
    k = 6
    assert _pairs(out, k) == literal_head_topk(
        hidden, weight, sets, rows, k, FALLBACK, batch="union-own", keep=set(union[:C])
    )
    # a request whose whole set was dropped: -inf entries, the fallback id, probability 0 (never NaN)
    gone = [i for i, s in enumerate(rows.tolist()) if not set(sets[s]) & set(union[:C])]
    assert gone == [1]
    probs, tokens = out.topk_probs(k)
    assert bool(torch.isfinite(probs).all())
    for i in gone:
        assert bool((probs[i * 3 : i * 3 + 3] == 0).all()) and bool((tokens[i * 3 : i * 3 + 3] == FALLBACK).all())
    head(hidden[:3], rows[:1])  # one request fits: not counted
    assert int(head.union_overflow) == 1


def test_softcap_and_scale_keep_dead_columns_dead():
    weight, table, sets, rows, hidden = _case(seed=1)
    plain = DraftHead(weight, table)(hidden, rows)
    capped = DraftHead(weight, table, logit_softcap=2.0, logit_scale=0.5)(hidden, rows)
    dead = torch.isneginf(plain.logits)
    assert bool(dead.any()) and torch.equal(torch.isneginf(capped.logits), dead)
    torch.testing.assert_close(capped.logits[~dead], torch.tanh(plain.logits[~dead] * 0.5 / 2.0) * 2.0)
    k = 4
    assert torch.equal(capped.topk(k)[1], plain.topk(k)[1])  # monotonic: the same tokens
    logp, _ = capped.topk_logprobs(k)  # over live columns only: a row of one live id has log-prob 0
    one = [i for i in range(hidden.shape[0]) if len(sets[int(rows[i // 3])]) == 1]
    assert one and all(float(logp[i, 0]) == 0.0 for i in one)


def test_dense_head_without_a_table_is_the_full_matmul():
    g = torch.Generator().manual_seed(2)
    weight, hidden = torch.randn(100, 8, generator=g), torch.randn(3, 8, generator=g)
    head = DraftHead(weight, None)
    out = head(hidden, torch.zeros(3, dtype=torch.int64))
    assert out.plan == "stock" and torch.allclose(out.logits, hidden @ weight.T)
    _, tokens = out.topk(5)
    assert torch.equal(tokens, torch.sort(hidden @ weight.T, dim=1, descending=True, stable=True)[1][:, :5])


def test_local_topk_order_is_value_then_column():
    x = torch.tensor([[1.0, 5.0, 5.0, -0.0, 0.0, NEG_INF, 5.0, NEG_INF], [NEG_INF] * 8])
    for k in range(1, 9):
        v, c, _ = local_topk(x, k)
        want_v, want_c = torch.sort(x, dim=1, descending=True, stable=True)
        assert torch.equal(c, want_c[:, :k]) and torch.equal(v, want_v[:, :k]), k


# --- d2t drafts and TP shards: the set rows mapped once, each request on its slot ------------------------


def _previous_mapped_logits(hidden, weight, ids, cnt, slots, row_map):
    """The head before: each hidden row its own slot (row_map through ids per row), -inf where no local row."""
    loc = row_map[ids.index_select(0, slots.long()).long()]
    out = indexed_logits(hidden, weight, loc.clamp(min=0), cnt.index_select(0, slots.long()),
                         torch.arange(hidden.shape[0], dtype=torch.int32))  # fmt: skip
    return out.masked_fill_(loc < 0, NEG_INF)


@pytest.mark.parametrize("kernel", ["torch", "cuda"])
@pytest.mark.parametrize("tp,rank", [(1, 0), (2, 0), (2, 1), (3, 2)])
@pytest.mark.parametrize("space", ["full", "d2t"])
def test_mapped_rows_keep_the_request_slot_and_give_the_previous_logits(kernel, tp, rank, space):
    weight, table, _, rows, hidden = _case(seed=3)
    g = torch.Generator().manual_seed(9)
    if space == "d2t":
        hot = torch.randperm(V, generator=g)[:150]  # draft row j is target id hot[j]; some set ids have no row
        head_w = weight[hot]
        table.ids[4, 2] = next(t for t in range(V) if t not in set(hot.tolist()))  # no draft row, inside the count
    else:
        hot, head_w = None, weight
    H = head_w.shape[0]
    start, end = vocab_shard(H, tp, rank)
    per = vocab_shard(H, tp, 0)[1]
    local = torch.zeros(per, D)  # SGLang's shard: its rows, then zero padding
    local[: end - start] = head_w[start:end]
    shard = (start, end) if tp > 1 else None
    head = DraftHead(
        local,
        table,
        VocabSpace.build(V, head_ids=hot, shard=shard, tp_size=1, fallback_id=table.fallback_id),
        head_options(kernel=kernel, batch="per-request"),
    )
    out = head(hidden, rows)
    # stated here, not by the head's own helpers: each hidden row's slot (request-major, 3 rows a request) and each
    # target id's local row (its global head row, identity or its index in the d2t map, less this rank's start)
    slots = rows.repeat_interleave(3)
    global_row = {t: t for t in range(V)} if hot is None else {t: j for j, t in enumerate(hot.tolist())}
    row_map = torch.tensor(
        [global_row[t] - start if start <= global_row.get(t, -1) < end else -1 for t in range(V)], dtype=torch.int32
    )
    want = _previous_mapped_logits(hidden, local, table.ids, table.cnt, slots, row_map)
    assert torch.equal(out.logits, want)
    assert torch.equal(head(hidden[:3], rows[:1]).logits, want[:3])  # one request's branches on its one slot
    # the same top-k (one rank: k above a row's live columns gives the fallback id)
    k = 6
    values, tokens = out.topk(k)
    v2, c2 = torch.sort(want, dim=1, descending=True, stable=True)
    t2 = table.ids.index_select(0, slots.long()).long().gather(1, c2[:, :k])
    assert torch.equal(values, v2[:, :k])
    assert torch.equal(tokens, torch.where(torch.isneginf(v2[:, :k]), FALLBACK, t2))


@pytest.mark.parametrize("space", ["full", "d2t"])
@pytest.mark.parametrize("n", [1, 4], ids=["chain", "tree"])
def test_the_per_request_step_is_two_launches(space, n):
    """From the draft's hidden rows and the requests' slots (SGLang's int64 req_pool_indices) to top-k token ids:
    the logits op (slot expansion and the d2t row map inside it) and compact_topk, nothing else dispatched; the
    tokens are the literal top-k's."""
    weight, table, _, rows, _ = _case(seed=5)
    hot = torch.randperm(V, generator=torch.Generator().manual_seed(2))[:150] if space == "d2t" else None
    head_w = weight if hot is None else weight[hot]
    head = DraftHead(
        head_w,
        table,
        VocabSpace.build(V, head_ids=hot, fallback_id=table.fallback_id),
        head_options(kernel="cuda", batch="per-request"),
    )
    hidden = torch.randn(rows.shape[0] * n, D, generator=torch.Generator().manual_seed(6))
    head(hidden, rows).topk_probs(3)  # first call: plan cached
    with LaunchCounter() as seen:
        probs, tokens = head(hidden, rows).topk_probs(3)
    assert seen.order == ["indexed_logits", "compact_topk"]
    sets = [table.row(s) for s in range(R)]
    want = literal_head_topk(hidden, head_w, sets, rows, 3, FALLBACK, tokens_of=None if hot is None else hot.tolist())
    assert tokens.tolist() == [[t for _, t in row] for row in want]
    # each row's probabilities: a softmax over the live ids of its request's set (those with a head row), the top 3
    # by (probability, lower id), then probability 0 with the fallback id where the set has fewer live ids
    head_row = {t: t for t in range(V)} if hot is None else {t: j for j, t in enumerate(hot.tolist())}
    want_probs, want_tokens, short = torch.zeros(len(hidden), 3, dtype=torch.float64), [], 0
    for m in range(len(hidden)):
        live = [t for t in sets[int(rows[m // n])] if t in head_row]
        p = torch.softmax(hidden[m].double() @ head_w[[head_row[t] for t in live]].double().T, dim=0)
        top = sorted(range(len(live)), key=lambda j: (-float(p[j]), live[j]))[:3]
        want_probs[m, : len(top)] = p[top]
        want_tokens.append([live[j] for j in top] + [FALLBACK] * (3 - len(top)))
        short += len(top) < 3
    assert short  # some rows end in the fallback (a set of one id)
    assert tokens.tolist() == want_tokens
    torch.testing.assert_close(probs.double(), want_probs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("plan", ["union-indexed", "union-gemm"])
@pytest.mark.parametrize("mapped", [False, True], ids=["full", "d2t"])
def test_the_cost_model_prices_every_launch_of_a_union_call(plan, mapped):
    """headcost.UNION_LAUNCHES is what a union call dispatches besides its scoring op (indexed_logits or mm): counted
    on the CPU, where each aten op would be one launch on a GPU (the own view, the default)."""
    weight, table, _, rows, hidden = _case(seed=7)
    hot = torch.randperm(V, generator=torch.Generator().manual_seed(3))[:200] if mapped else None
    head = DraftHead(
        weight if hot is None else weight[hot],
        table,
        VocabSpace.build(V, head_ids=hot, fallback_id=table.fallback_id),
        head_options(kernel="cuda", batch=plan),
    )
    head(hidden, rows)
    with LaunchCounter() as seen:
        head(hidden, rows)
    scoring = {"union-indexed": "indexed_logits", "union-gemm": "mm"}[plan]
    assert seen.order.count(scoring) == 1
    assert len(seen.order) - 1 == headcost.UNION_LAUNCHES[plan, mapped], seen.order


# --- the cost model's choice ------------------------------------------------------------------------------


def test_auto_plan_runs_on_meta_and_its_logits_are_the_plans_width():
    """No tensor value is read (meta tensors have none); each call's logits have its plan's columns (the set, the
    union's capacity or the head's rows), which is what the top-k reads them by."""
    table = CandidateTable(9, 64, device="meta")
    weight = torch.zeros(5000, 32, device="meta", dtype=torch.bfloat16)
    for batch in ("auto", "per-request", "union-indexed", "union-gemm", "stock"):
        head = DraftHead(weight, table, head=head_options(batch=batch, union_capacity=640))
        width = {"per-request": 64, "union-indexed": 640, "union-gemm": 640, "stock": 5000}
        # auto on meta (no fitted constants: bandwidth and launches only): at most 8 x 64 set rows against the
        # head's 5000, and a union's 34 launches, so per request at every shape here
        want = "per-request" if batch == "auto" else batch
        for bs, n in [(1, 1), (1, 4), (4, 1), (8, 4), (8, 1)]:
            out = head(torch.zeros(bs * n, 32, device="meta"), torch.zeros(bs, dtype=torch.int64, device="meta"))
            assert out.logits.device.type == "meta" and out.topk(3)[1].shape == (bs * n, 3)
            assert out.plan == want and head.planned[(bs, n)] == want
            assert out.logits.shape[1] == width[want]
            with pytest.raises(ValueError, match="is the key the one of the call that produced them"):
                head.output(out.logits[:, :63], torch.zeros(bs, dtype=torch.int64, device="meta"), (bs, n))


def test_auto_plan_follows_the_bytes_each_plan_reads():
    """With bandwidth-only constants (meta: no fitted file) auto reads the fewest bytes: one request's 512 set rows
    (4 MiB of bf16 rows of 4096) beat the head's 1000 rows (8 MiB); 64 requests' sets (256 MiB) lose to them."""
    table = CandidateTable(64, 512, device="meta")
    head = DraftHead(torch.zeros(1000, 4096, device="meta", dtype=torch.bfloat16), table)
    assert head.costs.device == "meta" and not head.costs.match  # headcost.fallback_costs
    for bs, want, width in [(1, "per-request", 512), (64, "stock", 1000)]:
        hidden = torch.zeros(bs, 4096, device="meta", dtype=torch.bfloat16)
        out = head(hidden, torch.zeros(bs, dtype=torch.int64, device="meta"))
        assert (out.plan, out.logits.shape[1]) == (want, width)


def test_auto_picks_what_the_shipped_h100_costs_document():
    """The choices docs/kernels.md quotes for the shipped H100 constants (one row a request, W 3072, d 4096): a 32k d2t
    draft runs per request up to bs 4, the dense head from 8 (per-request is predicted at 0.77 of stock there, not
    below 1 - 0.44, the fit's worst error); a full 128k head per request up to bs 24. No union: no GPU has timed one.
    A change of the model or its constants shows here."""
    (h100,) = [c for c in headcost.shipped_costs() if "H100" in c.device]
    sizes = headcost.shipped_union_sizes()

    def plan(bs, H, mapped):
        return headcost.choose(
            headcost.Shape(bs, 1, 3072, 4096, H, 128256, min(16 * 3072, H), mapped=mapped), h100, sizes
        )

    d2t = {bs: plan(bs, 32000, True) for bs in (1, 2, 4, 8, 12, 16, 64, 128)}
    assert d2t == {1: "per-request", 2: "per-request", 4: "per-request"} | {bs: "stock" for bs in (8, 12, 16, 64, 128)}
    full = {bs: plan(bs, 128256, False) for bs in (1, 8, 16, 24, 32, 64, 128)}
    assert full == {bs: "per-request" for bs in (1, 8, 16, 24)} | {bs: "stock" for bs in (32, 64, 128)}
    # no sets: the dense head
    assert headcost.choose(headcost.Shape(8, 1, 0, 64, 1000, 1000, 0), h100, sizes) == "stock"


def _costs(**change):
    """Bandwidth-only constants in which the union is far cheaper than the rest (a tiny V, no launch gap)."""
    return dataclasses.replace(headcost.fallback_costs("test"), launch_us=0.0, **change)


def test_auto_chooses_only_plans_a_gpu_timed_on_the_device():
    """A union the model prices cheapest is not chosen until the device's file says a GPU timed it; named in
    head.batch (union) it still runs."""
    shape = headcost.Shape(64, 1, 3072, 4096, 32000, 40000, 49152)
    same = headcost.UnionSizes(3072, (1, 64), (1.0, 1.0), {})  # every request has the same set: a union of one
    assert headcost.predict(shape, _costs(), same)["union-indexed"] < headcost.predict(shape, _costs(), same)["stock"]
    assert headcost.choose(shape, _costs(), same) == "stock"  # per-request reads 64 sets, the union is untimed
    timed = _costs(modes=headcost.MODES)
    assert headcost.choose(shape, timed, same) == "union-indexed"
    assert headcost.choose(shape, _costs(), same, allowed=headcost.UNION_MODES) == "union-indexed"


def test_a_plan_must_beat_stock_by_the_fits_error():
    """Per-request predicted at some fraction f of stock's time is chosen only while f * (1 + margin) <= 1."""
    c = _costs()
    for bs in range(1, 40):
        shape = headcost.Shape(bs, 1, 1024, 2048, 32000, 32000, 16384)
        t = headcost.predict(shape, c)
        f = t["per-request"] / t["stock"]
        for margin in (0.0, 0.25, 0.5):
            want = "per-request" if f * (1 + margin) <= 1 else "stock"
            assert headcost.choose(shape, _costs(margin=margin)) == want, (bs, margin, f)


def test_the_cost_model_prices_the_wide_top_k_as_it_runs():
    """Past compact_topk's width the head's top-k is torch's unfused ops: headcost.WIDE_TOPK_LAUNCHES is what it
    dispatches (counted on the CPU, k 1 and k > 1, probabilities as the draft loop reads them); up to it, one op."""
    from sglang_specvocab import ops

    op = ops.implementation("cuda", torch.device("cpu"), "compact_topk")
    W = headcost.FUSED_TOPK_MAX_WIDTH
    col = torch.randint(0, 10 * W, (W + 1,), dtype=torch.int32)
    for width, k, want in [(W + 1, 1, headcost.WIDE_TOPK_LAUNCHES[True]), (W + 1, 4, headcost.WIDE_TOPK_LAUNCHES[False]),
                           (W, 4, 1)]:  # fmt: skip
        out = HeadOutput(torch.randn(6, width), col[:width], fallback_id=0, topk_op=op)
        out.topk_probs(k)
        with LaunchCounter() as seen:
            out.topk_probs(k)
        assert len(seen.order) == want, seen.order
    # and the model charges the wide one its launches: n rows a request stands for k
    c = headcost.fallback_costs()
    narrow, wide = (headcost.Shape(4, 4, 64, 64, 100, 10 * W, C) for C in (W, W + 1))
    gap = headcost.predict(wide, c)["union-gemm"] - headcost.predict(narrow, c)["union-gemm"]
    assert gap > (headcost.WIDE_TOPK_LAUNCHES[False] - 1) * c.launch_us


def test_fallback_costs_pick_by_bytes():
    c, sizes = headcost.fallback_costs(), headcost.DISJOINT
    small = headcost.Shape(1, 1, 3072, 4096, 128256, 128256, 49152)
    big = headcost.Shape(128, 1, 3072, 4096, 32768, 128256, 32768)
    assert headcost.choose(small, c, sizes) == "per-request"
    assert headcost.choose(big, c, sizes) == "stock"  # disjoint sets: 128 x 3072 rows > 32k


@pytest.mark.parametrize("d2t", [False, True], ids=["full", "d2t"])
def test_one_rank_stock_head_never_proposes_a_padding_row(d2t):
    """SGLang pads ParallelLMHead's weight to a multiple of 64 rows at any TP size: 10 real rows in 64. The padding
    rows score 0 and every real row -1; the stock head must still propose real tokens only."""
    rows_real = 10
    weight = torch.zeros(64, 4)
    weight[:rows_real, 0] = -1.0
    hidden = torch.tensor([[1.0, 0, 0, 0], [1.0, 0, 0, 0]])
    hot = torch.tensor([7, 3, 12, 0, 5, 9, 1, 14, 2, 11]) if d2t else None
    table = CandidateTable(3, 4, fallback_id=int(hot[0]) if d2t else 0)
    head = DraftHead(
        weight,
        table,
        VocabSpace.build(16 if d2t else rows_real, head_ids=hot, fallback_id=table.fallback_id),
        head_options(batch="stock"),
    )
    out = head(hidden, torch.tensor([1, 2]))
    values, tokens = out.topk(12)
    real = set(hot.tolist()) if d2t else set(range(rows_real))
    assert set(tokens[:, :rows_real].flatten().tolist()) == real  # the 10 real tokens first, all at -1
    assert torch.all(values[:, :rows_real] == -1.0) and torch.all(torch.isneginf(values[:, rows_real:]))
    assert torch.all(tokens[:, rows_real:] == table.fallback_id)  # past the live columns: the fallback


@pytest.mark.parametrize("d2t", [False, True], ids=["full", "d2t"])
@pytest.mark.parametrize("batch", ["per-request", "union-indexed", "union-gemm"])
def test_a_bad_id_is_a_dead_counted_column_in_every_plan(d2t, batch):
    """An id >= V in a set (a policy or data-file bug) never crashes the head nor reaches a draft: every plan reads
    it as a dead column and counts it once per hidden row that reads it, as the per-request kernel does."""
    from sglang_specvocab import ops

    g = torch.Generator().manual_seed(4)
    V, d = 50, 8
    hot = torch.randperm(V, generator=g)[:30] if d2t else None
    weight = torch.randn(V if hot is None else 30, d, generator=g)
    pool = sorted(hot.tolist()) if d2t else list(range(V))
    table = CandidateTable(4, 6, fallback_id=pool[0])
    table.ids[1, :3] = torch.tensor(pool[:3], dtype=torch.int32)
    table.ids[2, :4] = torch.tensor([pool[3], pool[7], V + 9, pool[9]], dtype=torch.int32)  # column 2: bad
    table.cnt[1], table.cnt[2] = 3, 4
    head = DraftHead(
        weight,
        table,
        VocabSpace.build(V, head_ids=hot, fallback_id=table.fallback_id),
        head_options(kernel="torch", batch=batch),
    )
    hidden = torch.randn(4, d, generator=g)  # two hidden rows a request
    counter = ops.bad_entries("cpu")
    before = int(counter)
    _, tokens = head(hidden, torch.tensor([1, 2])).topk(3)
    assert int(counter) - before == 2  # request 2's two hidden rows read the bad id
    w_rows = weight if hot is None else None
    for m, slot in enumerate([1, 1, 2, 2]):
        live = pool[:3] if slot == 1 else [pool[3], pool[7], pool[9]]
        row = {t: (hidden[m] @ (w_rows[t] if w_rows is not None else weight[(hot == t).nonzero()[0, 0]])).item()
               for t in live}  # fmt: skip
        assert tokens[m].tolist() == sorted(live, key=lambda t: (-row[t], t)), (m, batch)
