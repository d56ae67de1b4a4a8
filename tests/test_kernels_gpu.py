"""The ops on a GPU: the CUDA and Triton kernels against the torch reference, and inside CUDA graphs.

These run where a GPU is present (a lent device machine: ``pytest tests/test_kernels_gpu.py``);
on the CPU machines the same kernels are tested through their C++ versions, the Triton
interpreter and the compiled machine code (test_kernels.py, test_triton_ops.py).

Tolerance of the logits against the reference (fp32 einsum of the same inputs): products of bf16/fp16
inputs are exact in fp32 and every backend sums in fp32, only in another order (d-slices, tensor-core
adders), so the difference grows like sqrt(d) ulps of the partial sums: rtol 1e-4 and atol 1e-4 * sqrt(d)
(about 1e-2 at d 8192) hold it with a wide margin, while one wrong product of two N(0, 1) numbers (~1) or a
row read for the wrong slot fails it. ``-inf`` must appear exactly where the definition has it.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from literal import literal_logits
from logits_cases import RUN_CASES, runs_case

from sglang_specvocab import ops
from sglang_specvocab.head import DraftHead, head_options
from sglang_specvocab.ops import _ext
from sglang_specvocab.ops.indexed_logits import reference_indexed_logits, reference_packed_logits
from sglang_specvocab.ops.window_update import reference_window_update
from sglang_specvocab.table import CandidateTable
from sglang_specvocab.vocab import VocabSpace

DEV = "cuda"
pytestmark = pytest.mark.gpu

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (M rows, R slots, W, d, V): tree branches sharing slots, W and d off every tile size, d up to 8192
SHAPES = [(1, 1, 512, 640, 4000), (10, 3, 3072, 4096, 50000), (64, 64, 2048, 2048, 30000), (33, 5, 1000, 8192, 9000)]
# The CUDA launch plans a test can force: (mt, ntmax[, zs]); (0, 0) is the launcher's own rule. zs: CTAs sharing a
# row tile's pieces (2, 3 and 5: pieces left over, a CTA with none).
PLANS = [(0, 0), (1, 2), (2, 2), (1, 4), (2, 4), (0, 0, 2), (1, 2, 3), (2, 4, 5)]


@pytest.fixture(autouse=True, scope="module")
def _extension():
    assert _ext.load(), _ext.reason()  # torch.ops.specvocab.* below need the library loaded


def _case(M, R, W, d, V, dtype, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    hidden = torch.randn(M, d, device=DEV, generator=g).to(dtype)
    weight = torch.randn(V, d, device=DEV, generator=g).to(dtype)
    ids = torch.randint(0, V, (R, W), device=DEV, generator=g, dtype=torch.int32)
    ids[torch.rand(R, W, device=DEV, generator=g) < 0.15] = -1  # dead columns inside the count
    cnt = torch.randint(1, W + 1, (R,), device=DEV, generator=g, dtype=torch.int32)
    slot = (torch.arange(M, device=DEV) * R // M).to(torch.int32)  # consecutive rows share a slot
    return hidden, weight, ids, cnt, slot


def _window_state(R, cap):
    return (
        torch.full((R, cap + 1), -1, dtype=torch.int32, device=DEV),
        torch.zeros(R, dtype=torch.int64, device=DEV),
        torch.zeros((R, cap), dtype=torch.int32, device=DEV),
        torch.ones(R, dtype=torch.int32, device=DEV),
    )


def _close(got, want, d):
    want = want.to(got.device)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    fin = torch.isfinite(want)
    torch.testing.assert_close(got[fin], want[fin], rtol=1e-4, atol=1e-4 * d**0.5)


class _forced:
    """Run the CUDA logits kernels with a forced (mt, ntmax) for the calls inside the block."""

    def __init__(self, plan):
        self.plan = plan

    def __enter__(self):
        torch.ops.specvocab.force_logits_plan(*self.plan)

    def __exit__(self, *exc):
        torch.ops.specvocab.force_logits_plan(0, 0)


def _plan(hidden, W, aligned=True):
    """The launch plan the CUDA op takes for these shapes on this GPU: (wd, mt, ntmax, vec)."""
    p = torch.ops.specvocab.logits_plan(hidden.shape[0], W, hidden.shape[1], hidden.dtype, aligned, -1)
    return p[0], p[2], p[3], p[4]


@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_logits_ops_equal_reference(backend, dtype, shape):
    if backend not in ops.available_backends(DEV):
        pytest.fail(f"backend {backend} unavailable on this GPU machine: {_ext.reason()}")
    M, R, W, d, V = shape
    args = _case(M, R, W, d, V, dtype)
    _close(ops.indexed_logits(*args, backend=backend), reference_indexed_logits(*args), d)
    hidden, weight, ids, cnt, slot = args
    packed = weight[ids.long().clamp(min=0)]
    _close(
        ops.packed_logits(hidden, packed, cnt, slot, backend=backend),
        reference_packed_logits(hidden, packed, cnt, slot),
        d,
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", sorted(RUN_CASES))
def test_logits_equal_the_literal_definition_on_runs(case, dtype):
    """Runs of 1..40 rows, dead columns and negative ids, odd W and d: CUDA under every launch plan and Triton."""
    args = runs_case(1, dtype, *RUN_CASES[case])
    want = literal_logits(*args).float()
    hidden, weight, ids, cnt, slot = (t.to(DEV) for t in args)
    d = hidden.shape[1]
    for plan in PLANS:
        with _forced(plan):
            _close(ops.indexed_logits(hidden, weight, ids, cnt, slot, backend="cuda"), want, d)
    _close(ops.indexed_logits(hidden, weight, ids, cnt, slot, backend="triton"), want, d)
    packed = weight[ids.long().clamp(min=0)]
    want = literal_logits(*(t.cpu() for t in (hidden, weight, ids.clamp(min=0), cnt, slot))).float()
    for plan in PLANS:
        with _forced(plan):
            _close(ops.packed_logits(hidden, packed, cnt, slot, backend="cuda"), want, d)


def _tree_batch(bs, rows, W, d, V, dtype, seed):
    """A draft step's call: bs requests on distinct slots, `rows` consecutive hidden rows each."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    R = bs + 3
    hidden = torch.randn(bs * rows, d, device=DEV, generator=g).to(dtype)
    weight = torch.randn(V, d, device=DEV, generator=g).to(dtype)
    ids = torch.randint(0, V, (R, W), device=DEV, generator=g, dtype=torch.int32)
    ids[torch.rand(R, W, device=DEV, generator=g) < 0.1] = -1
    cnt = torch.randint(W // 2, W + 1, (R,), device=DEV, generator=g, dtype=torch.int32)
    slots = torch.randperm(R, device=DEV, generator=g)[:bs].to(torch.int32)
    return hidden, weight, ids, cnt, slots.repeat_interleave(rows)


@pytest.mark.parametrize("bs,rows", [(8, 1), (8, 4), (16, 1), (3, 5)])
def test_small_d_pieces_spread_over_ctas(bs, rows):
    """Gemma-3 270M's shape (d 640, V 262,144, W 1,200), slots per request as SGLang passes them (int64 [bs]): the
    launcher's own plan shares a row tile's pieces among CTAs, and gives the reference's logits, bitwise those of
    one CTA a tile."""
    hidden, weight, ids, cnt, slot = _tree_batch(bs, rows, 1200, 640, 262144, torch.bfloat16, seed=bs * 10 + rows)
    per_request = slot[::rows].long()
    M = bs * rows
    zs = torch.ops.specvocab.logits_plan(M, 1200, 640, torch.bfloat16, True, -1, rows)[8]
    assert zs > 1 or M > 16, zs
    got = ops.indexed_logits(hidden, weight, ids, cnt, per_request, backend="cuda")
    _close(got, reference_indexed_logits(hidden, weight, ids, cnt, slot), 640)
    with _forced((0, 0, 1)):
        assert torch.equal(ops.indexed_logits(hidden, weight, ids, cnt, per_request, backend="cuda"), got)


def test_every_launch_branch_gives_the_same_logits():
    """Each tiling the launcher can take (d-split 1/2/4/8 warps, 1 or 2 column tiles per warp, 16- or 32-row
    pieces of 1..4 tensor-core row tiles, 16-byte or element loads, the FMA path) equals the reference, and the
    free choices (column tiles, piece size, CTAs sharing a tile's pieces) give bitwise the same logits: they never
    change the summation order."""
    covered = set()
    W = 1000
    # d 64, 256, 512, 4096: 1, 2, 4, 8 d-warps (bf16/fp16) with 16-byte loads; 60, 252, 4100 the same with element
    # loads (d * 2 bytes is no multiple of 16). 1..40 rows per request: pieces of 1..4 row tiles.
    for dtype, d, rows in itertools.product(DTYPES, [60, 64, 252, 256, 512, 4096, 4100], [1, 10, 25, 40]):
        hidden, weight, ids, cnt, slot = _tree_batch(2, rows, W, d, 20000, dtype, seed=d + rows)
        want = reference_indexed_logits(hidden, weight, ids, cnt, slot)
        outs = []
        for plan in PLANS:
            with _forced(plan):
                covered.add(_plan(hidden, W))
                outs.append(ops.indexed_logits(hidden, weight, ids, cnt, slot, backend="cuda"))
        _close(outs[0], want, d)
        for out in outs[1:]:
            assert torch.equal(out, outs[0]), (dtype, d, rows, W)
    # element loads for an unaligned base pointer (a view one element into its storage)
    for dtype in DTYPES:
        hidden, weight, ids, cnt, slot = _tree_batch(2, 10, 1000, 512, 5000, dtype, seed=3)
        store = torch.empty(hidden.numel() + 8, dtype=dtype, device=DEV)
        shifted = store[1 : 1 + hidden.numel()].view_as(hidden).copy_(hidden)
        assert shifted.is_contiguous() and shifted.data_ptr() % 16 != 0
        covered.add(_plan(hidden, 1000, aligned=False))
        _close(
            ops.indexed_logits(shifted, weight, ids, cnt, slot, backend="cuda"),
            reference_indexed_logits(hidden, weight, ids, cnt, slot),
            512,
        )
    want = {(wd, mt, nt, 1) for wd in (1, 2, 4, 8) for mt in (1, 2) for nt in (2, 4)}  # bf16/fp16 16-byte loads
    want |= {(wd, 1, 2, 0) for wd in (1, 2, 4, 8)}  # element loads
    assert want <= covered, sorted(want - covered)


def _close_by_parts(got, hidden, weight, ids, cnt, slot):
    """_close against the reference a few rows at a time: the reference holds [rows, W, d] in fp32."""
    W, d = ids.shape[1], hidden.shape[1]
    step = max(1, (1 << 29) // (W * d))  # 2 GiB of fp32 per part
    for i in range(0, hidden.shape[0], step):
        part = slice(i, i + step)
        _close(got[part], reference_indexed_logits(hidden[part], weight, ids, cnt, slot[part]), d)


# (bs, rows per request, W, d, V): the server's ends: one request with the widest set at d 5120 and Gemma-3's
# vocabulary, bs 128 of 10 tree rows at d 640, wide sets at bs 64 (the kernels' grids: many column tiles, many
# row tiles, both), Qwen's vocabulary at d 5120.
SERVER_SHAPES = [
    (1, 1, 16384, 5120, 262144),
    (128, 10, 3072, 640, 262144),
    (64, 4, 16384, 4096, 128256),
    (32, 10, 3072, 5120, 151936),
]


@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("shape", SERVER_SHAPES, ids=lambda s: "bs{}-rows{}-W{}-d{}-V{}".format(*s))
def test_logits_at_the_servers_shapes(backend, shape):
    """bf16 at the shapes a draft step has (bs 1..128, 1..10 rows, W up to 16,384, d 640..5120, V up to 262,144):
    each launch plan / Triton tile width these shapes pick, against the reference."""
    bs, rows, W, d, V = shape
    args = _tree_batch(bs, rows, W, d, V, torch.bfloat16, seed=bs + W)
    _close_by_parts(ops.indexed_logits(*args, backend=backend), *args)


@pytest.mark.parametrize("block_w", [16, 32, 64])
def test_triton_every_tile_width_equals_reference(block_w):
    """The Triton wrapper picks 16, 32 or 64 columns per program from M, W and the SM count; the other tests' shapes
    mostly get 16 on an H100. Each width, indexed and packed, in every dtype."""
    from sglang_specvocab.ops.indexed_logits import triton_indexed_logits, triton_packed_logits

    for dtype in DTYPES:
        hidden, weight, ids, cnt, slot = _tree_batch(8, 10, 1000, 520, 20000, dtype, seed=block_w)
        got = triton_indexed_logits(hidden, weight, ids, cnt, slot, block_w=block_w)
        _close(got, reference_indexed_logits(hidden, weight, ids, cnt, slot), 520)
        packed = weight[ids.long().clamp(min=0)]
        got = triton_packed_logits(hidden, packed, cnt, slot, block_w=block_w)
        _close(got, reference_packed_logits(hidden, packed, cnt, slot), 520)


# W 96 and 5000: torch.sort's in-place kernel (rows up to 4096) and its segmented sort beyond (workspace in the graph);
# at 5000 the full head's union (20,000 columns) is past the fused top-k's width, so the unfused top-k is captured too.
@pytest.mark.parametrize("W", [96, 5000])
@pytest.mark.parametrize("d2t", [False, True])
@pytest.mark.parametrize("plan", ["per-request", "union-indexed", "union-gemm", "stock"])
def test_draft_step_in_a_cuda_graph_follows_the_table(plan, d2t, W):
    """A ranker policy's draft step as the server captures it: the sets assigned on the device (CandidateTable.assign),
    the head with the extension's kernels (indexed_logits, compact_topk) and its top-k, captured once after a
    warm-up; replayed after new candidates, hidden rows and request slots are written in place, it equals the torch
    head run eagerly on the same table. Small-integer weights: every dot product is exact, so the top-k is too."""
    g = torch.Generator(device=DEV).manual_seed(11)
    V, d, R, bs, n, k = 4 * max(W, 1024), 64, 12, 4, 3, 4
    hot = torch.randperm(V, device=DEV, generator=g)[: V * 3 // 10].sort().values if d2t else None
    pool = hot if d2t else torch.arange(V, device=DEV)
    weight = torch.randint(-3, 4, (pool.numel(), d), device=DEV, generator=g).to(torch.bfloat16)
    table = CandidateTable(R, W, device=DEV, fallback_id=int(pool[0]))
    space = VocabSpace.build(V, head_ids=hot, fallback_id=table.fallback_id, device=DEV) if d2t else None
    head = DraftHead(weight, table, space, head_options(kernel="cuda", batch=plan))
    torch_head = DraftHead(weight, table, space, head_options(kernel="torch", batch=plan))
    cand = torch.full((bs, W), -1, dtype=torch.int64, device=DEV)
    hidden = torch.zeros(bs * n, d, dtype=torch.bfloat16, device=DEV)
    rows = torch.arange(1, bs + 1, device=DEV)

    def refill(seed):
        g.manual_seed(seed)
        cand.copy_(pool[torch.randint(0, pool.numel(), (bs, W), device=DEV, generator=g)])
        cand[torch.rand(bs, W, device=DEV, generator=g) < 0.3] = -1
        hidden.copy_(torch.randint(-3, 4, hidden.shape, device=DEV, generator=g))
        rows.copy_(torch.randperm(R - 1, device=DEV, generator=g)[:bs] + 1)

    def step():
        table.assign(rows, cand)
        out = head(hidden, rows)
        return (out.logits, *out.topk_logprobs(k))

    refill(0)
    step()  # warm up outside capture (SGLang runs each captured step twice first)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits, values, tokens = step()
    for seed in range(1, 4):
        refill(seed)
        graph.replay()
        want_table = CandidateTable(R, W, fallback_id=table.fallback_id)
        want_table.assign(rows.cpu(), cand.cpu())
        live = torch.arange(W)[None, :] < want_table.cnt[rows.cpu()][:, None]
        assert torch.equal(table.cnt[rows].cpu(), want_table.cnt[rows.cpu()]), seed
        assert torch.equal(table.ids[rows].cpu()[live], want_table.ids[rows.cpu()][live]), seed
        want = torch_head(hidden, rows)
        want_values, want_tokens = want.topk_logprobs(k)
        assert torch.equal(logits, want.logits), seed
        assert torch.equal(tokens, want_tokens), seed
        torch.testing.assert_close(values, want_values, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_tree_branches_and_batches_give_identical_logits(dtype):
    """A row's logits do not depend on what else is in the call: rows=10 equals rows=1 for the shared row,
    at bs 1, 8 and 64 (different launch plans), bitwise."""
    W, d, V = 3072, 4096, 128256
    hidden, weight, ids, cnt, slot = _tree_batch(64, 10, W, d, V, dtype, seed=1)
    full = ops.indexed_logits(hidden, weight, ids, cnt, slot, backend="cuda")  # bs 64, 10 rows: M = 640
    part = slice(0, 25)  # the reference holds [M, W, d] in fp32: check a part of the batch
    _close(full[part], reference_indexed_logits(hidden[part], weight, ids, cnt, slot[part]), d)
    plans = {_plan(hidden, W)}
    for bs, rows in [(1, 1), (1, 4), (1, 10), (8, 1), (8, 10), (64, 1)]:
        pick = torch.arange(bs, device=DEV)[:, None] * 10 + torch.arange(rows, device=DEV)[None, :]
        pick = pick.reshape(-1)
        out = ops.indexed_logits(hidden[pick], weight, ids, cnt, slot[pick], backend="cuda")
        plans.add(_plan(hidden[pick], W))
        assert torch.equal(out, full[pick]), (bs, rows)
    if dtype != torch.float32:
        assert len({p[1:3] for p in plans}) >= 3, plans  # the comparison spans launch plans


# 390,000: a bitmap of 48,752 bytes, under the 48 KB a block gets without opting in but not with the kernel's
# static shared memory beside it (the launch must opt in); 520,000: a bitmap over 48 KB.
@pytest.mark.parametrize("V", [262144, 390000, 520000])
def test_window_update_equals_reference(V):
    g = torch.Generator(device=DEV).manual_seed(V)
    R, cap = 9, 3072
    ours, ref = _window_state(R, cap), _window_state(R, cap)
    for i in range(300):
        rows = torch.randperm(R, device=DEV, generator=g)[: 1 + i % R]
        n = 5000 if i == 0 else 40  # a long prefill first, then verify-sized appends
        block = torch.randint(-2, V + 2, (rows.shape[0], n), device=DEV, generator=g, dtype=torch.int32)
        ops.window_update(*ours, rows, block, fallback_id=1, vocab_size=V, backend="cuda")
        reference_window_update(*ref, rows, block, 1, V)
        assert torch.equal(ours[0][:, :cap], ref[0][:, :cap])
        for a, b in zip(ours[1:], ref[1:], strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("backend,plan", [("cuda", p) for p in PLANS] + [("triton", None)])
def test_logits_in_a_cuda_graph_follow_the_table(backend, plan):
    """Capture once, change the table, the slots and the hidden rows in place, replay: the output follows."""
    hidden, weight, ids, cnt, slot = _case(40, 6, 1024, 2048, 20000, torch.bfloat16)
    with _forced(plan or (0, 0)):
        ops.indexed_logits(hidden, weight, ids, cnt, slot, backend=backend)  # compile / warm up outside capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = ops.indexed_logits(hidden, weight, ids, cnt, slot, backend=backend)
    for seed in range(4):
        g = torch.Generator(device=DEV).manual_seed(100 + seed)
        new_ids = torch.randint(0, weight.shape[0], ids.shape, device=DEV, generator=g, dtype=torch.int32)
        new_ids[torch.rand(ids.shape, device=DEV, generator=g) < 0.2] = -1
        ids.copy_(new_ids)
        cnt.copy_(torch.randint(1, ids.shape[1] + 1, cnt.shape, device=DEV, generator=g, dtype=torch.int32))
        # new runs: 1..40 rows long, so the pieces the kernel finds on the device change too
        lengths = [40] if seed == 3 else torch.randint(1, 12, (40,), generator=torch.Generator().manual_seed(seed))
        runs = torch.repeat_interleave(torch.arange(len(lengths)) % 6, torch.as_tensor(lengths))[:40]
        slot.copy_(runs.to(torch.int32))
        hidden.normal_(generator=g)
        graph.replay()
        _close(out, reference_indexed_logits(hidden, weight, ids, cnt, slot), hidden.shape[1])


def test_logits_address_rows_past_two_to_the_31():
    """Candidate rows whose offset (id * d) passes 2**31 elements are read correctly (64-bit addressing)."""
    V, d = 540000, 4096  # 4.4 GB of bf16
    weight = torch.empty(V, d, dtype=torch.bfloat16, device=DEV).normal_()
    g = torch.Generator(device=DEV).manual_seed(5)
    hidden = torch.randn(6, d, device=DEV, generator=g).to(torch.bfloat16)
    ids = torch.randint(V - 20000, V, (2, 96), device=DEV, generator=g, dtype=torch.int32)
    ids[0, 0], ids[1, 1] = V - 1, 0
    cnt = torch.tensor([96, 50], dtype=torch.int32, device=DEV)
    slot = torch.tensor([0, 0, 0, 1, 1, 1], dtype=torch.int32, device=DEV)
    want = reference_indexed_logits(hidden, weight, ids, cnt, slot)
    for backend in ("cuda", "triton"):
        _close(ops.indexed_logits(hidden, weight, ids, cnt, slot, backend=backend), want, d)


def test_cuda_logits_never_read_out_of_bounds():
    """Values the CPU op refuses (ids >= V, slots out of range) cannot be checked on a GPU without a sync:
    the kernel gives -inf there instead of reading outside the tensors; valid rows are unaffected."""
    hidden, weight, ids, cnt, slot = _case(12, 3, 300, 256, 1000, torch.bfloat16)
    bad_ids, bad_slot = ids.clone(), slot.clone()
    bad_ids[0, :5] = 10**6
    bad_slot[-3:] = torch.tensor([3, -1, 1 << 30], dtype=torch.int32)
    out = ops.indexed_logits(hidden, weight, bad_ids, cnt, bad_slot, backend="cuda")
    want = reference_indexed_logits(hidden, weight, bad_ids.masked_fill(bad_ids >= 1000, -1), cnt, slot)
    assert torch.isneginf(out[-3:]).all()
    _close(out[:-3], want[:-3], 256)


def test_window_update_in_a_cuda_graph():
    R, cap, V = 5, 256, 262144
    state = _window_state(R, cap)
    ref = tuple(t.clone() for t in state)
    rows = torch.tensor([3, 0, 4], device=DEV)
    block = torch.zeros((3, 19), dtype=torch.int32, device=DEV)
    ops.window_update(*state, rows, block, fallback_id=1, vocab_size=V, backend="cuda")
    reference_window_update(*ref, rows, block, 1, V)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.window_update(*state, rows, block, fallback_id=1, vocab_size=V, backend="cuda")
    g = torch.Generator(device=DEV).manual_seed(7)
    for _ in range(50):
        block.copy_(torch.randint(-1, V, block.shape, device=DEV, generator=g, dtype=torch.int32))
        graph.replay()
        reference_window_update(*ref, rows, block, 1, V)
        assert torch.equal(state[0][:, :cap], ref[0][:, :cap])  # the ring (its last column is scratch)
        for a, b in zip(state[1:], ref[1:], strict=True):
            assert torch.equal(a, b)


# --- the fused step: request slots and the row map inside the kernel ----------------------------------------------


def _mapped(bs, n, W, d, V, H, dtype, seed=0):
    """A d2t draft's step: table ids are target ids in [0, V), the head has H rows (row_map [V], -1 where the draft
    has no row), request-major hidden rows, n per request, the requests' int64 slots (SGLang's req_pool_indices)."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    hidden = torch.randn(bs * n, d, device=DEV, generator=g).to(dtype)
    weight = torch.randn(H, d, device=DEV, generator=g).to(dtype)
    row_map = torch.full((V,), -1, dtype=torch.int32, device=DEV)
    row_map[torch.randperm(V, device=DEV, generator=g)[:H]] = torch.arange(H, dtype=torch.int32, device=DEV)
    R = bs + 3
    ids = torch.randint(0, V, (R, W), device=DEV, generator=g, dtype=torch.int32)
    ids[torch.rand(R, W, device=DEV, generator=g) < 0.05] = -1
    cnt = torch.randint(W // 2, W + 1, (R,), device=DEV, generator=g, dtype=torch.int32)
    rows = torch.randperm(R, device=DEV, generator=g)[:bs].to(torch.int64)
    return hidden, weight, ids, cnt, rows, row_map


@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("bs", "n"), [(1, 1), (1, 10), (8, 4), (64, 1), (3, 17)])
def test_the_fused_step_reads_request_slots_and_the_row_map_inside_the_kernel(backend, dtype, bs, n):
    hidden, weight, ids, cnt, rows, row_map = _mapped(bs, n, 3072, 640, 262144, 32000, dtype, seed=bs * n)
    want = reference_indexed_logits(hidden, weight, ids, cnt, rows, row_map=row_map)
    assert torch.isfinite(want).any() and torch.isneginf(want).any()
    _close(ops.indexed_logits(hidden, weight, ids, cnt, rows, backend=backend, row_map=row_map), want, 640)
    _close(ops.indexed_logits(hidden, weight, ids, cnt, rows.to(torch.int32), backend=backend, row_map=row_map),
           want, 640)  # fmt: skip


@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_the_fused_step_in_a_cuda_graph_follows_the_slots_and_the_table(backend):
    """Captured once with the requests' slots and the row map; new slots, sets and hidden rows in place: the replay
    reads them (the slot of each request-major row is found on the device, at replay)."""
    hidden, weight, ids, cnt, rows, row_map = _mapped(8, 4, 2048, 1024, 50000, 12000, torch.bfloat16)
    ops.indexed_logits(hidden, weight, ids, cnt, rows, backend=backend, row_map=row_map)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.indexed_logits(hidden, weight, ids, cnt, rows, backend=backend, row_map=row_map)
    for seed in range(3):
        g = torch.Generator(device=DEV).manual_seed(200 + seed)
        rows.copy_(torch.randperm(ids.shape[0], device=DEV, generator=g)[: rows.shape[0]])
        ids.copy_(torch.randint(0, row_map.shape[0], ids.shape, device=DEV, generator=g, dtype=torch.int32))
        hidden.normal_(generator=g)
        graph.replay()
        _close(out, reference_indexed_logits(hidden, weight, ids, cnt, rows, row_map=row_map), hidden.shape[1])
