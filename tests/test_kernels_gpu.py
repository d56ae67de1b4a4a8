"""The ops on a GPU: the CUDA and Triton kernels against the torch reference, and inside CUDA graphs.

These run where a GPU is present (a lent device machine: ``pytest tests/test_kernels_gpu.py``);
on the CPU machines the same kernels are tested through their C++ versions, the Triton
interpreter and the compiled machine code (test_kernels.py, test_triton_ops.py).
"""

from __future__ import annotations

import pytest
import torch

from sglang_specvocab import ops
from sglang_specvocab.ops import _ext, reference

pytestmark = pytest.mark.gpu

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (M rows, R slots, W, d, V): tree branches sharing slots, W and d off every tile size, d up to 8192
SHAPES = [(1, 1, 512, 640, 4000), (10, 3, 3072, 4096, 50000), (64, 64, 2048, 2048, 30000), (33, 5, 1000, 8192, 9000)]


def _case(M, R, W, d, V, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    hidden = torch.randn(M, d, device="cuda", generator=g).to(dtype)
    weight = torch.randn(V, d, device="cuda", generator=g).to(dtype)
    ids = torch.randint(0, V, (R, W), device="cuda", generator=g, dtype=torch.int32)
    cnt = torch.randint(1, W + 1, (R,), device="cuda", generator=g, dtype=torch.int32)
    slot = (torch.arange(M, device="cuda") * R // M).to(torch.int32)  # consecutive rows share a slot
    return hidden, weight, ids, cnt, slot


def _window_state(R, cap):
    return (
        torch.full((R, cap + 1), -1, dtype=torch.int32, device="cuda"),
        torch.zeros(R, dtype=torch.int64, device="cuda"),
        torch.zeros((R, cap), dtype=torch.int32, device="cuda"),
        torch.ones(R, dtype=torch.int32, device="cuda"),
    )


def _close(got, want, d):
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    fin = torch.isfinite(want)
    torch.testing.assert_close(got[fin], want[fin], rtol=1e-4, atol=1e-4 * d**0.5)


@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_logits_ops_equal_reference(backend, dtype, shape):
    if backend not in ops.available_backends("cuda"):
        pytest.fail(f"backend {backend} unavailable on this GPU machine: {_ext.reason()}")
    M, R, W, d, V = shape
    args = _case(M, R, W, d, V, dtype)
    _close(ops.indexed_logits(*args, backend=backend), reference.indexed_logits(*args), d)
    hidden, weight, ids, cnt, slot = args
    packed = weight[ids.long()]
    _close(
        ops.packed_logits(hidden, packed, cnt, slot, backend=backend),
        reference.packed_logits(hidden, packed, cnt, slot),
        d,
    )


@pytest.mark.parametrize("V", [262144, 520000])
def test_window_update_equals_reference(V):
    g = torch.Generator(device="cuda").manual_seed(V)
    R, cap = 9, 3072
    ours, ref = _window_state(R, cap), _window_state(R, cap)
    for i in range(300):
        rows = torch.randperm(R, device="cuda", generator=g)[: 1 + i % R]
        n = 5000 if i == 0 else 40  # a long prefill first, then verify-sized appends
        block = torch.randint(-2, V + 2, (rows.shape[0], n), device="cuda", generator=g, dtype=torch.int32)
        ops.window_update(*ours, rows, block, fallback_id=1, vocab_size=V, backend="cuda")
        reference.window_update(*ref, rows, block, 1, V)
        assert torch.equal(ours[0][:, :cap], ref[0][:, :cap])
        for a, b in zip(ours[1:], ref[1:], strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_logits_in_a_cuda_graph_follow_the_table(backend):
    """Capture once, change the table in place, replay: the output follows the new contents."""
    hidden, weight, ids, cnt, slot = _case(8, 4, 1024, 2048, 20000, torch.bfloat16)
    ops.indexed_logits(hidden, weight, ids, cnt, slot, backend=backend)  # compile / warm up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.indexed_logits(hidden, weight, ids, cnt, slot, backend=backend)
    for seed in range(3):
        g = torch.Generator(device="cuda").manual_seed(100 + seed)
        ids.copy_(torch.randint(0, weight.shape[0], ids.shape, device="cuda", generator=g, dtype=torch.int32))
        cnt.copy_(torch.randint(1, ids.shape[1] + 1, cnt.shape, device="cuda", generator=g, dtype=torch.int32))
        hidden.normal_(generator=g)
        graph.replay()
        _close(out, reference.indexed_logits(hidden, weight, ids, cnt, slot), hidden.shape[1])


def test_window_update_in_a_cuda_graph():
    R, cap, V = 5, 256, 262144
    state = _window_state(R, cap)
    ref = tuple(t.clone() for t in state)
    rows = torch.tensor([3, 0, 4], device="cuda")
    block = torch.zeros((3, 19), dtype=torch.int32, device="cuda")
    ops.window_update(*state, rows, block, fallback_id=1, vocab_size=V, backend="cuda")
    reference.window_update(*ref, rows, block, 1, V)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.window_update(*state, rows, block, fallback_id=1, vocab_size=V, backend="cuda")
    g = torch.Generator(device="cuda").manual_seed(7)
    for _ in range(50):
        block.copy_(torch.randint(-1, V, block.shape, device="cuda", generator=g, dtype=torch.int32))
        graph.replay()
        reference.window_update(*ref, rows, block, 1, V)
        assert torch.equal(state[0][:, :cap], ref[0][:, :cap])  # the ring (its last column is scratch)
        for a, b in zip(state[1:], ref[1:], strict=True):
            assert torch.equal(a, b)
