"""The Triton head ops against the torch reference (under the Triton interpreter, on CPU) and AOT builds.

``TRITON_INTERPRET`` is read when ``@triton.jit`` decorates, so the interpreted runs happen in one
child process that imports the kernels with the variable set (robust when this pytest process has
already imported triton); the child runs every case of ``CASES`` and saves the outputs, and each
case is compared here against the torch reference (``sglang_specvocab.ops.indexed_logits``). Run as a script, this file is that
child: ``TRITON_INTERPRET=1 python tests/test_triton_ops.py OUT.pt``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import run_interpreted
from literal import literal_logits, mapped_case, runs_to_slots

pytest.importorskip("triton")  # the Triton backend is optional; its tests need triton, not a GPU

REPO = Path(__file__).resolve().parents[1]

_DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _case(name, op, dt, M, R, W, d, *, V=0, slots="random", block_w=None, block_d=None, seed=0, strided=False):
    return dict(locals())


# Run lengths of the "runs" cases: tree branches (1..10 rows) and runs around the 16-row groups (up to 40).
RUNS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 40, 17, 16, 15, 33]


# ROWS is 16, so M > 16 spans several row groups. W and d are deliberately not multiples of the
# tiles; V < W forces duplicate ids within a row; "random"/"reversed" slot orders mix slots inside
# one row group; "shared" keeps consecutive rows of one slot (tree branches).
CASES = [
    _case("idx_bf16_tiles", "indexed", "bf16", 37, 5, 37, 50, V=23, block_w=16, block_d=16, seed=1),
    _case("idx_fp16_tiles", "indexed", "fp16", 37, 5, 37, 50, V=23, block_w=16, block_d=32, seed=2),
    _case("idx_fp32_tiles", "indexed", "fp32", 37, 5, 37, 50, V=23, block_w=16, block_d=16, seed=3),
    _case("idx_bf16_shared", "indexed", "bf16", 40, 6, 45, 72, V=100, slots="shared", block_w=16, block_d=32, seed=4),
    _case(
        "idx_fp32_reversed", "indexed", "fp32", 21, 4, 29, 33, V=64, slots="reversed", block_w=16, block_d=16, seed=5
    ),
    _case("idx_fp16_default_blocks", "indexed", "fp16", 19, 3, 40, 150, V=300, seed=6),
    _case("idx_bf16_one_slot", "indexed", "bf16", 18, 1, 20, 24, V=7, slots="random", block_w=16, block_d=16, seed=7),
    _case("idx_fp32_strided", "indexed", "fp32", 17, 3, 24, 40, V=50, block_w=16, block_d=16, seed=8, strided=True),
    _case("idx_bf16_runs", "indexed", "bf16", sum(RUNS), 6, 37, 40, V=90, slots="runs", block_w=16, block_d=32, seed=9),
    _case("idx_fp16_runs", "indexed", "fp16", sum(RUNS), 6, 21, 33, V=90, slots="runs", seed=10),
    _case("idx_fp32_runs", "indexed", "fp32", sum(RUNS), 6, 70, 3, V=90, slots="runs", block_w=32, seed=16),
    _case("pk_bf16_tiles", "packed", "bf16", 37, 5, 37, 50, block_w=16, block_d=16, seed=11),
    _case("pk_fp16_shared", "packed", "fp16", 33, 5, 30, 40, slots="shared", block_w=16, block_d=16, seed=12),
    _case("pk_fp32_reversed", "packed", "fp32", 20, 3, 33, 20, slots="reversed", block_w=16, block_d=16, seed=13),
    _case("pk_bf16_default_blocks", "packed", "bf16", 17, 4, 48, 140, seed=14),
    _case("pk_fp16_strided", "packed", "fp16", 18, 4, 21, 36, block_w=16, block_d=16, seed=15, strided=True),
]


def _inputs(case):
    """Deterministic inputs of one case: (hidden, table, ids or None, cnt, row_to_slot)."""
    g = torch.Generator().manual_seed(case["seed"])
    dtype = _DT[case["dt"]]
    M, R, W, d = case["M"], case["R"], case["W"], case["d"]
    if case["strided"]:  # rows with padding: row strides differ from d
        hidden = torch.randn(M, d + 5, generator=g).to(dtype)[:, 2 : 2 + d]
    else:
        hidden = torch.randn(M, d, generator=g).to(dtype)
    cnt = torch.randint(1, W + 1, (R,), generator=g, dtype=torch.int32)
    cnt[0] = W  # full row
    if R > 1:
        cnt[1] = 1  # a single live column
    if case["slots"] == "shared":  # consecutive rows per slot, unequal run lengths, runs cross row groups
        cuts = sorted(torch.randperm(M - 1, generator=g)[: R - 1].add(1).tolist())
        row_to_slot = torch.zeros(M, dtype=torch.int32)
        for s, start in enumerate(cuts, start=1):
            row_to_slot[start:] = s
    elif case["slots"] == "runs":  # consecutive runs of RUNS rows, neighbours on different slots
        row_to_slot = torch.tensor(runs_to_slots(RUNS, R, case["seed"]), dtype=torch.int32)
    elif case["slots"] == "reversed":
        row_to_slot = torch.arange(M, dtype=torch.int32).flip(0) % R
    else:
        row_to_slot = torch.randint(0, R, (M,), generator=g, dtype=torch.int32)
        row_to_slot[:R] = torch.randperm(R, generator=g).to(torch.int32)  # every slot used
    if case["op"] == "indexed":
        V = case["V"]
        table = torch.randn(V, d, generator=g).to(dtype)
        ids = torch.randint(0, V, (R, W), generator=g, dtype=torch.int32)
        if case["strided"]:
            table = torch.randn(V, d + 3, generator=g).to(dtype)[:, :d]
            ids = torch.randint(0, V, (R, W + 4), generator=g, dtype=torch.int32)[:, :W]
        ids[0, 1] = ids[0, 0]  # explicit duplicate in a row
        ids[torch.rand(R, W, generator=g) < 0.2] = -1  # dead columns, inside and past the count
        ids[0, 16:32] = -3  # a wholly dead 16-column tile inside the count
        return hidden, table, ids, cnt, row_to_slot
    table = torch.randn(R, W, d, generator=g).to(dtype)
    if case["strided"]:  # non-contiguous [R, W, d]: every other slot of a bigger buffer, padded rows
        table = torch.randn(2 * R, W, d + 4, generator=g).to(dtype)[::2, :, 1 : 1 + d]
    return hidden, table, None, cnt, row_to_slot


def _expected(case, hidden, table, ids, cnt, row_to_slot):
    if case["op"] == "indexed":
        return literal_logits(hidden, table, ids, cnt, row_to_slot).float()
    slot = row_to_slot.long()
    rows = table.index_select(0, slot).float()  # [M, W, d]
    out = torch.einsum("mwd,md->mw", rows, hidden.float())
    dead = torch.arange(table.shape[1])[None, :] >= cnt.long()[slot][:, None]
    return out.masked_fill(dead, float("-inf"))


HEAD_PLANS = ("per-request", "union-indexed", "union-gemm")
MAPPED = [("bf16", 3, 5), ("fp32", 2, 17), ("fp16", 1, 10)]  # (dtype, requests, rows each): across 16-row groups


def _head_runs(kernel: str) -> dict:
    """The head's top-4 (values, token ids) in each batch plan over overlapping sets (small-integer weights:
    every dot product exact in fp32, so backends agree bitwise), own and all union views."""
    from sglang_specvocab.head import DraftHead, head_options
    from sglang_specvocab.table import CandidateTable

    g = torch.Generator().manual_seed(21)
    V, d, R, W = 300, 20, 6, 24
    weight = torch.randint(-2, 3, (V, d), generator=g).float()
    table = CandidateTable(R, W, fallback_id=3)
    pool = torch.randperm(V, generator=g)[:80]
    cands = torch.full((R, W), -1)
    for r, n in enumerate((1, W, 5, 17, 2, W - 3)):
        cands[r, :n] = pool[torch.randperm(80, generator=g)[:n]]
    table.assign(torch.arange(R), cands)
    rows = torch.tensor([2, 0, 5, 1])
    hidden = torch.randint(-2, 3, (rows.numel() * 3, d), generator=g).float()
    out = {}
    for plan in HEAD_PLANS:
        for view in ("own", "all"):
            out[plan, view] = DraftHead(weight, table, head=head_options(kernel=kernel, batch=plan, union_view=view))(
                hidden, rows
            ).topk(4)
    return out


def _run_cases(out_path: str) -> None:
    """Child process body: run every case through the (interpreted) Triton ops and save outputs."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    from sglang_specvocab.ops.indexed_logits import triton_indexed_logits, triton_packed_logits

    results = {}
    for case in CASES:
        hidden, table, ids, cnt, row_to_slot = _inputs(case)
        kw = dict(block_w=case["block_w"], block_d=case["block_d"])
        if case["op"] == "indexed":
            results[case["name"]] = triton_indexed_logits(hidden, table, ids, cnt, row_to_slot, **kw)
        else:
            results[case["name"]] = triton_packed_logits(hidden, table, cnt, row_to_slot, **kw)
    for dt, bs, n in MAPPED:
        hidden, weight, ids, cnt, rows, row_map = mapped_case(bs * 7 + n, _DT[dt], bs, n)
        results["mapped", dt, bs, n] = triton_indexed_logits(
            hidden, weight, ids, cnt, rows, None, row_map, block_w=16, block_d=16
        )
    results["head"] = _head_runs("triton")
    torch.save(results, out_path)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    out = tmp_path_factory.mktemp("triton_interp") / "out.pt"
    return run_interpreted(__file__, out)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_interpreted_matches_reference(interpreted, case):
    hidden, table, ids, cnt, row_to_slot = _inputs(case)
    got = interpreted[case["name"]]
    want = _expected(case, hidden, table, ids, cnt, row_to_slot)
    assert got.dtype == torch.float32 and got.shape == (case["M"], case["W"])
    # -inf exactly where j >= cnt[slot], finite elsewhere
    assert torch.equal(torch.isneginf(got), torch.isneginf(want))
    assert torch.isfinite(got[~torch.isneginf(want)]).all()
    # products are exact in fp32 for bf16/fp16 and sums run in fp32, only the order differs
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5 * case["d"] ** 0.5)


@pytest.mark.parametrize(("dt", "bs", "n"), MAPPED)
def test_interpreted_slot_expansion_and_row_map_equal_the_literal_definition(interpreted, dt, bs, n):
    """Request slots (int64, one per request of n rows) and a d2t row map, read inside the kernel."""
    hidden, weight, ids, cnt, rows, row_map = mapped_case(bs * 7 + n, _DT[dt], bs, n)
    want = literal_logits(hidden, weight, ids, cnt, rows, row_map).float()
    got = interpreted["mapped", dt, bs, n]
    assert torch.equal(torch.isneginf(got), torch.isneginf(want)) and torch.isfinite(want).any()
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5 * hidden.shape[1] ** 0.5)


@pytest.mark.parametrize("view", ["own", "all"])
@pytest.mark.parametrize("plan", HEAD_PLANS)
def test_interpreted_head_batch_modes_equal_the_torch_head(interpreted, plan, view):
    got_v, got_t = interpreted["head"][plan, view]
    want_v, want_t = _head_runs("torch")[plan, view]
    assert torch.equal(got_v, want_v) and torch.equal(got_t, want_t)


def test_inputs_cover_the_contract():
    """The cases do exercise what the brief asks for (guards the test data itself)."""
    seen = set()
    for case in CASES:
        _hidden, _table, ids, cnt, row_to_slot = _inputs(case)
        seen.add(case["dt"])
        assert cnt.min() == 1 or case["R"] == 1
        assert cnt.max() == case["W"]
        if ids is not None:
            assert any(len(set(r.tolist())) < len(r) for r in ids)  # duplicate ids in a row
            assert (ids[:, : cnt.max()] < 0).any()  # dead columns inside a count
        groups = row_to_slot[: (case["M"] // 16) * 16].view(-1, 16)
        mixed = any(len(set(g.tolist())) > 1 for g in groups)
        assert case["M"] > 16 and (mixed or case["R"] == 1)
    assert seen == set(_DT)
    assert {c["dt"] for c in CASES if c["slots"] == "runs"} == set(_DT)  # runs of 1..40 rows in every dtype
    assert any(c["block_w"] and c["W"] % c["block_w"] and c["d"] % c["block_d"] for c in CASES)


def test_wrapper_rejects_bad_shapes():
    from sglang_specvocab.ops.indexed_logits import triton_indexed_logits, triton_packed_logits

    h = torch.zeros(3, 8)
    with pytest.raises(ValueError, match="ids must be int32"):
        triton_indexed_logits(
            h,
            torch.zeros(5, 8),
            torch.zeros(2, 4, dtype=torch.int64),
            torch.ones(2, dtype=torch.int32),
            torch.zeros(3, dtype=torch.int32),
        )
    with pytest.raises(ValueError, match="d=8"):
        triton_packed_logits(
            h, torch.zeros(2, 4, 9), torch.ones(2, dtype=torch.int32), torch.zeros(3, dtype=torch.int32)
        )
    with pytest.raises(ValueError, match="dtype"):
        triton_packed_logits(
            h,
            torch.zeros(2, 4, 8, dtype=torch.float16),
            torch.ones(2, dtype=torch.int32),
            torch.zeros(3, dtype=torch.int32),
        )


@pytest.mark.parametrize("tiles", [{"block_w": 8}, {"block_d": 48}, {"block_w": 24}])
def test_wrapper_refuses_tiles_a_gpu_cannot_compile(tiles):
    """Tiles below 16 or not powers of two run under the interpreter but fail to compile on a GPU: refused."""
    from sglang_specvocab.ops.indexed_logits import triton_indexed_logits, triton_packed_logits

    h, cnt, slot = torch.zeros(3, 32), torch.ones(2, dtype=torch.int32), torch.zeros(3, dtype=torch.int32)
    name, value = next(iter(tiles.items()))
    with pytest.raises(ValueError, match=f"{name} = {value} is invalid: must be a power of two >= 16"):
        triton_indexed_logits(h, torch.zeros(5, 32), torch.zeros(2, 4, dtype=torch.int32), cnt, slot, **tiles)
    with pytest.raises(ValueError, match=f"{name} = {value} is invalid"):
        triton_packed_logits(h, torch.zeros(2, 4, 32), cnt, slot, **tiles)


def _cuobjdump_elf(cubin: bytes, tmp_path: Path) -> str:
    import triton

    tool = triton.knobs.nvidia.cuobjdump.path
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    return subprocess.run([tool, "-elf", str(path)], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("arch", [80, 90])
def test_aot_compile(arch, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))  # a real compile, not a cache hit
    from triton.backends.compiler import GPUTarget

    from sglang_specvocab.ops import triton_ops

    built = triton_ops.compile_for(GPUTarget("cuda", arch, 32))
    assert set(built) == {(t, p) for t in ("bf16", "fp16", "fp32") for p in (False, True)}
    assert any((tmp_path / "cache").rglob("*.cubin"))
    want = rf"\.target\s+sm_{arch}a?\b"
    for (ty, is_packed), k in built.items():
        assert k.metadata.target.arch == arch
        ptx, cubin, ttir = k.asm["ptx"], k.asm["cubin"], k.asm["ttir"]
        assert re.search(want, ptx), (ty, is_packed)
        assert cubin[:4] == b"\x7fELF" and int.from_bytes(cubin[18:20], "little") == 190  # EM_CUDA
        assert re.search(want, _cuobjdump_elf(cubin, tmp_path)), (ty, is_packed)
        assert k.metadata.name == "_head_logits_kernel"
        assert "cp.async" in ptx  # the d loop is software-pipelined
        if ty != "fp32":
            assert "mma.sync" in ptx  # tensor cores for bf16 / fp16
        # candidate row addresses are 64-bit (V * d or R * W * d may pass 2**31)
        assert re.search(r"%roff\S* = arith\.muli .* : tensor<64xi64>", ttir), (ty, is_packed)


if __name__ == "__main__":
    _run_cases(sys.argv[1])
