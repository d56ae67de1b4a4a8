"""The compiled ops (csrc/): registration, CPU kernels equal to the torch reference, fake kernels,
the CUDA machine code in the built library, and the backend choice a config makes."""

from __future__ import annotations

import itertools
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import tiny_llama
from hypothesis import given, settings
from hypothesis import strategies as st
from literal import LiteralWindow, literal_logits, mapped_case, runs_to_slots
from logits_cases import RUN_CASES, runs_case
from sglang_specvocab.csrc import recipe

from sglang_specvocab import ops
from sglang_specvocab.errors import ConfigError
from sglang_specvocab.ops import _backend, _ext
from sglang_specvocab.ops.indexed_logits import reference_indexed_logits, reference_packed_logits
from sglang_specvocab.ops.window_update import reference_window_update
from sglang_specvocab.policies import build_policy, parse_config
from sglang_specvocab.tools.lab.decoder import CausalLM, DraftShape, SpeculativeDecoder, greedy_generate

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = {
    "indexed_logits": "specvocab::indexed_logits(Tensor hidden, Tensor weight, Tensor ids, Tensor cnt, "
    "Tensor row_to_slot, Tensor(a!)? bad=None, Tensor? row_map=None) -> Tensor",
    "packed_logits": "specvocab::packed_logits(Tensor hidden, Tensor packed, Tensor cnt, Tensor row_to_slot, "
    "Tensor(a!)? bad=None) -> Tensor",
    "window_update": "specvocab::window_update(Tensor(a!) ring, Tensor(b!) length, Tensor(c!) ids, Tensor(d!) cnt, "
    "Tensor rows, Tensor block, int fallback_id, int vocab_size) -> ()",
    "pack_update": "specvocab::pack_update(Tensor(a!) packed, Tensor(b!) packed_ids, Tensor weight, Tensor ids, "
    "Tensor cnt, Tensor rows) -> ()",
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(autouse=True, scope="module")
def _extension():
    _ext.load()  # torch.ops.specvocab.* below need the library loaded, whichever tests are selected


def _built_with_nvcc() -> bool:
    return shutil.which("nvcc") is not None and not os.environ.get("SPECVOCAB_NO_CUDA")


def test_extension_loads():
    assert _ext.available(), _ext.reason()


@pytest.mark.parametrize("op", sorted(SCHEMAS))
def test_schema_and_kernels_registered(op):
    assert _ext.available(), _ext.reason()
    assert str(getattr(torch.ops.specvocab, op).default._schema) == SCHEMAS[op]
    name = f"specvocab::{op}"
    assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU")
    # CI builds with nvcc: the CUDA kernels must be there even though no GPU can run them.
    assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "CUDA") == _built_with_nvcc()
    assert _ext.has_cuda_kernels() == _built_with_nvcc()


def _cuobjdump() -> str:
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    assert path.exists(), f"cuobjdump not found at {path}"
    return str(path)


@pytest.mark.skipif(not _built_with_nvcc(), reason="this build has no CUDA kernels (nvcc absent)")
def test_library_has_hopper_and_ampere_machine_code():
    import importlib.util

    lib = importlib.util.find_spec("sglang_specvocab._C").origin
    elf = subprocess.run([_cuobjdump(), "--list-elf", lib], capture_output=True, text=True, check=True).stdout
    archs = re.findall(r"\.(sm_\d+a?)\.cubin", elf)
    # one cubin per .cu file and architecture
    n_cu = sum(1 for name in recipe.CUDA_SOURCES if name.endswith(".cu"))
    assert archs.count("sm_90a") == n_cu and archs.count("sm_80") == n_cu, elf
    ptx = subprocess.run([_cuobjdump(), "--list-ptx", lib], capture_output=True, text=True, check=True).stdout
    assert "sm_80.ptx" in ptx, ptx  # forward-compatible PTX
    sass = subprocess.run(
        [_cuobjdump(), "--dump-sass", "--gpu-architecture", "sm_90a", lib], capture_output=True, text=True, check=True
    ).stdout
    for kernel in (
        "indexed_logits_kernel",
        "window_update_kernel",
        "window_round_kernel",
        "pack_update",
        "compact_topk_reg_kernel",
        "compact_topk_list_kernel",
    ):
        assert kernel in sass, f"{kernel} has no sm_90a code"


@pytest.mark.skipif(not _built_with_nvcc(), reason="this build has no CUDA kernels (nvcc absent)")
def test_the_bs1_kernels_keep_everything_in_registers():
    """No stack frame (so no spills, no local arrays) on sm_80 and sm_90a for the kernels a bs-1 draft step runs:
    the register top-k, and the 16-bit logits variants of few rows (NTMAX 2, with and without 16-byte loads)."""
    import importlib.util

    lib = importlib.util.find_spec("sglang_specvocab._C").origin
    usage = subprocess.run(
        [_cuobjdump(), "--dump-resource-usage", lib], capture_output=True, text=True, check=True
    ).stdout
    found = re.findall(r"Function (\S+):\s+REG:(\d+) STACK:(\d+)", usage)
    bs1 = [
        (name, int(stack))
        for name, _, stack in found
        if "compact_topk_reg_kernel" in name
        or re.search(r"indexed_logits_kernelI(13__nv_bfloat16|6__half)Li[12]ELi2E", name)
    ]
    # the register top-k and 4 logits variants (bf16, fp16 x 16-byte loads or not, mt 1), per architecture
    assert sum("compact_topk_reg_kernel" in n for n, _ in bs1) == 2, usage
    assert len(bs1) >= 2 + 2 * 4, usage
    assert [n for n, stack in bs1 if stack] == [], usage


# --- logits ops: the C++ CPU kernels against the reference -----------------------------------------


def _case(seed: int, dtype, *, M: int, R: int, W: int, d: int, V: int):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(M, d, generator=g).to(dtype)
    weight = torch.randn(V, d, generator=g).to(dtype)
    ids = torch.randint(0, V, (R, W), generator=g, dtype=torch.int32)
    ids[:, -1] = ids[:, 0]  # duplicate ids in a row
    ids[torch.rand(R, W, generator=g) < 0.15] = -1  # dead columns inside the count
    cnt = torch.randint(1, W + 1, (R,), generator=g, dtype=torch.int32)
    cnt[0], cnt[-1] = 1, W  # both ends of the range
    slot = torch.randint(0, R, (M,), generator=g, dtype=torch.int32)
    slot[: M // 2] = slot[0]  # rows sharing a slot, runs and scattered
    return hidden, weight, ids, cnt, slot


def _close(got: torch.Tensor, want: torch.Tensor, d: int) -> None:
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert torch.equal(torch.isinf(got), torch.isinf(want))  # -inf exactly where the reference has it
    fin = torch.isfinite(want)
    torch.testing.assert_close(got[fin], want[fin], rtol=1e-5, atol=1e-5 * d**0.5)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from(DTYPES),
    M=st.integers(1, 40),
    R=st.integers(1, 6),
    W=st.integers(1, 70),
    d=st.sampled_from([1, 3, 8, 33, 64, 200]),
)
def test_cpu_indexed_logits_equals_reference(seed, dtype, M, R, W, d):
    args = _case(seed, dtype, M=M, R=R, W=W, d=d, V=97)
    _close(torch.ops.specvocab.indexed_logits(*args), reference_indexed_logits(*args), d)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), dtype=st.sampled_from(DTYPES), M=st.integers(1, 30), W=st.integers(1, 50))
def test_cpu_packed_logits_equals_reference(seed, dtype, M, W):
    d, R = 24, 5
    hidden, weight, ids, cnt, slot = _case(seed, dtype, M=M, R=R, W=W, d=d, V=61)
    ids = ids.clamp(min=0)  # packed rows have no ids: only the count decides
    packed = weight[ids.long()]  # [R, W, d]: the same rows, laid out per slot
    got = torch.ops.specvocab.packed_logits(hidden, packed, cnt, slot)
    _close(got, reference_packed_logits(hidden, packed, cnt, slot), d)
    _close(got, reference_indexed_logits(hidden, weight, ids, cnt, slot), d)


def test_cpu_logits_ops_take_strided_and_expanded_slots():
    """One request's tree rows as an expanded (stride-0) view of its slot: read in place, not as memory."""
    hidden, weight, ids, cnt, _ = _case(1, torch.float32, M=6, R=3, W=5, d=8, V=20)
    slot = torch.tensor([2], dtype=torch.int32).expand(6)
    want = reference_indexed_logits(hidden, weight, ids, cnt, slot.contiguous())
    _close(torch.ops.specvocab.indexed_logits(hidden, weight, ids, cnt, slot), want, 8)
    strided = torch.tensor([2, 0, 1, 0, 0, 1, 2, 0, 1, 0, 2, 1], dtype=torch.int32)[::2]
    _close(
        torch.ops.specvocab.indexed_logits(hidden, weight, ids, cnt, strided),
        reference_indexed_logits(hidden, weight, ids, cnt, strided.contiguous()),
        8,
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("bs", "n"), [(1, 1), (1, 10), (3, 4), (5, 1), (2, 16), (2, 17)])
def test_the_slot_expansion_and_the_row_map_happen_inside_the_op(dtype, bs, n):
    """One call from request slots and table ids to logits (no row_slots, no mapped table): each request's n rows
    over its set through the draft's id-to-row map, as the literal definition says, on every CPU backend."""
    hidden, weight, ids, cnt, rows, row_map = mapped_case(bs * 7 + n, dtype, bs, n)
    want = literal_logits(hidden, weight, ids, cnt, rows, row_map).float()
    assert torch.isneginf(want).any() and torch.isfinite(want).any()
    for slots in (rows, rows.to(torch.int32)):
        _close(reference_indexed_logits(hidden, weight, ids, cnt, slots, row_map=row_map), want, 16)
        _close(torch.ops.specvocab.indexed_logits(hidden, weight, ids, cnt, slots, row_map=row_map), want, 16)
    # the same as the old step: slots expanded per row and the table mapped to head rows by separate ops
    per_row = rows.repeat_interleave(n).to(torch.int32)
    mapped = torch.where(ids >= 0, row_map[ids.long().clamp(min=0)], -1).to(torch.int32)
    _close(torch.ops.specvocab.indexed_logits(hidden, weight, mapped, cnt, per_row), want, 16)


def test_ids_past_the_row_map_are_bad_entries_counted_like_the_reference():
    hidden, weight, ids, cnt, rows, row_map = mapped_case(3, torch.float32, 3, 2)
    ids = ids.clone()
    ids[rows[0], 0] = row_map.shape[0] + 5  # past the map: a bad entry in a live column (cnt >= 1)
    want_bad, got_bad = torch.zeros((), dtype=torch.int64), torch.zeros((), dtype=torch.int64)
    want = reference_indexed_logits(hidden, weight, ids, cnt, rows, want_bad, row_map)
    got = torch.ops.specvocab.indexed_logits(hidden, weight, ids, cnt, rows, got_bad, row_map)
    _close(got, want, 16)
    assert int(got_bad) == int(want_bad) >= 2  # once per hidden row of that request
    assert torch.isneginf(got[:2, 0]).all()
    ops.set_debug_checks(True)
    try:
        for fn in (reference_indexed_logits, torch.ops.specvocab.indexed_logits):
            with pytest.raises((ValueError, RuntimeError), match=re.escape("ids must be below V=40")):
                fn(hidden, weight, ids, cnt, rows, None, row_map)
    finally:
        ops.set_debug_checks(False)


def test_request_slots_must_divide_the_rows_and_the_row_map_be_int32():
    hidden, weight, ids, cnt, rows, row_map = mapped_case(4, torch.float32, 3, 2)
    for fn, err in ((reference_indexed_logits, ValueError), (torch.ops.specvocab.indexed_logits, RuntimeError)):
        with pytest.raises(err, match=re.escape("row_to_slot must be int32 or int64 [B] with B dividing M=6")):
            fn(hidden, weight, ids, cnt, rows[:2].repeat(2))  # 4 slots for 6 rows
        with pytest.raises(err, match=re.escape("row_map must be int32 [L]")):
            fn(hidden, weight, ids, cnt, rows, None, row_map.long())


_THROW_CHILD = """
import sys, torch
from sglang_specvocab.ops import _ext
assert _ext.load(), _ext.reason()
before, thrower = sys.argv[1], sys.argv[2]
if before in ("cuda", "our-cuda"):  # the driver and torch's CUDA runtime loaded and used
    torch.ones(4, device="cuda").add_(1)
    torch.cuda.synchronize()
if before == "our-cuda":  # the extension's CUDA kernels launched (its static CUDA runtime initialised)
    z = lambda *s, **k: torch.zeros(*s, device="cuda", **k)
    torch.ops.specvocab.indexed_logits(z(2, 8), z(20, 8), z(3, 5, dtype=torch.int32), z(3, dtype=torch.int32) + 1,
                                       z(2, dtype=torch.int32))
    torch.cuda.synchronize()
try:
    if thrower == "torch":  # a C++ exception thrown by torch itself (libc10)
        torch.zeros(2).view(3)
    else:  # the extension's TORCH_CHECK, as the refusal tests that crashed
        torch.ops.specvocab.indexed_logits(torch.zeros(2, 8, dtype=torch.float64), torch.zeros(20, 8, dtype=torch.float64),
                                           torch.zeros(3, 5, dtype=torch.int32), torch.ones(3, dtype=torch.int32),
                                           torch.zeros(2, dtype=torch.int32))
except RuntimeError as exc:
    print("raised:", str(exc).splitlines()[0])
    sys.exit(0)
sys.exit(3)
"""


def test_a_cpp_exception_reaches_python_in_a_fresh_process():
    """On the GPU machines (torch 2.11, Python 3.12) the first C++ exception of the extension in each test
    process crashed it (SIGSEGV: four refusal tests, in four files, listed in scripts/device/stage.py
    KNOWN_CRASHES). Each case here is a fresh child: torch's own C++ exception and the extension's, each with
    nothing before it, after CUDA ran, and after the extension's CUDA kernels ran, so a crash names which of
    them does it; the first crash is rerun under gdb (where installed) for its C++ backtrace."""
    if not _ext.available():
        pytest.skip(_ext.reason())
    before = ["none"] + (["cuda"] if torch.cuda.is_available() else [])
    before += ["our-cuda"] if torch.cuda.is_available() and _ext.has_cuda_kernels() else []
    repo = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
    codes, crashed = {}, None
    for b in before:
        for thrower in ("torch", "extension"):
            cmd = [sys.executable, "-X", "faulthandler", "-c", _THROW_CHILD, b, thrower]
            run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
            codes[b, thrower] = run.returncode
            if run.returncode and crashed is None:
                crashed = (cmd, run.stdout[-1000:] + run.stderr[-3000:])
    if crashed is not None and shutil.which("gdb"):
        gdb = ["gdb", "-batch", "-ex", "run", "-ex", "bt 40", "--args", *crashed[0]]
        trace = subprocess.run(gdb, capture_output=True, text=True, env=env, timeout=300, check=False)
        crashed = (crashed[0], crashed[1] + "\n--- gdb ---\n" + trace.stdout[-6000:])
    assert all(rc == 0 for rc in codes.values()), f"exit codes {codes}\n{crashed[1] if crashed else ''}"


def test_cpu_logits_ops_refuse_bad_input():
    hidden, weight, ids, cnt, slot = _case(0, torch.float32, M=4, R=3, W=5, d=8, V=20)
    bad = [
        ((hidden.double(), weight.double(), ids, cnt, slot), "bf16, fp16 or fp32"),
        ((hidden, weight.half(), ids, cnt, slot), "must equal hidden dtype"),
        ((hidden, weight, ids.long(), cnt, slot), "ids must be int32"),
        ((hidden[:, :7], weight, ids, cnt, slot), "hidden has d=7 but weight has d=8"),
    ]
    for args, msg in bad:
        with pytest.raises(RuntimeError, match=re.escape(msg)):
            torch.ops.specvocab.indexed_logits(*args)
    # the table's values: read as -inf and counted, as on the GPU; refused only under the debug setting
    table_bad = [
        ((hidden, weight, ids, cnt.clone().fill_(0), slot), "cnt must be in [1, W=5], got cnt["),
        ((hidden, weight, ids, cnt, slot.clone().fill_(3)), "row_to_slot must be in [0, R=3), got row_to_slot[0] = 3"),
        ((hidden, weight, ids.clone().fill_(20), cnt, slot), "ids must be below V=20 (a negative id is a dead column)"),
    ]
    for args, msg in table_bad:
        want_count, got_count = torch.zeros((), dtype=torch.int64), torch.zeros((), dtype=torch.int64)
        want = reference_indexed_logits(*args, bad=want_count)
        got = torch.ops.specvocab.indexed_logits(*args, bad=got_count)
        assert torch.isneginf(got).any() and int(got_count) == int(want_count) > 0
        torch.testing.assert_close(got, want)
        ops.set_debug_checks(True)
        try:
            with pytest.raises(ValueError, match=re.escape("indexed_logits: " + msg)):
                torch.ops.specvocab.indexed_logits(*args)
        finally:
            ops.set_debug_checks(False)


# --- logits ops: the reference and the C++ CPU kernel against the literal definition ----------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", sorted(RUN_CASES))
def test_logits_reference_and_cpu_kernels_equal_the_literal_definition(case, dtype):
    hidden, weight, ids, cnt, slot = args = runs_case(1, dtype, *RUN_CASES[case])
    d = hidden.shape[1]
    want = literal_logits(*args).float()
    assert torch.isneginf(want).any() and torch.isfinite(want).any()
    _close(reference_indexed_logits(*args), want, d)
    _close(torch.ops.specvocab.indexed_logits(*args), want, d)
    # packed rows: the same set laid out per slot (no ids, so only the count decides)
    packed = weight[ids.long().clamp(min=0)]
    want = literal_logits(hidden, weight, ids.clamp(min=0), cnt, slot).float()
    _close(reference_packed_logits(hidden, packed, cnt, slot), want, d)
    _close(torch.ops.specvocab.packed_logits(hidden, packed, cnt, slot), want, d)


def _runs(slots):
    out, start = [], 0
    for i in range(1, len(slots) + 1):
        if i == len(slots) or slots[i] != slots[i - 1]:
            out.append((start, i))
            start = i
    return out


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 70), min_size=1, max_size=10),
    P=st.sampled_from([1, 3, 8, 16, 32]),
    seed=st.integers(0, 2**16),
)
def test_pieces_read_each_short_run_once(lengths, P, seed):
    """The kernels' pieces (csrc/pieces.h) partition the rows within runs, at most P rows each; a run of at
    most P rows is one piece (its candidate rows are read once) and a longer one at most ceil(L / P) + 1; and the
    pieces starting in rows [m0, m0 + P) follow from rows [m0 - P - 1, m0 + 2P) alone (a GPU block's window)."""
    slots = runs_to_slots(lengths, 4, seed)
    M = len(slots)
    pieces = [tuple(p) for p in torch.ops.specvocab.logits_pieces(torch.tensor(slots, dtype=torch.int32), P).tolist()]
    assert [p[0] for p in pieces] == sorted(p[0] for p in pieces) and pieces[0][0] == 0
    assert all(a[0] + a[1] == b[0] for a, b in itertools.pairwise(pieces))
    assert pieces[-1][0] + pieces[-1][1] == M and all(1 <= n <= P for _, n in pieces)
    for start, end in _runs(slots):
        inside = [p for p in pieces if start <= p[0] < end]
        assert inside[0][0] == start and inside[-1][0] + inside[-1][1] == end  # no piece crosses a run boundary
        assert len(inside) == 1 if end - start <= P else len(inside) <= -(-(end - start) // P) + 1
    for m0 in range(0, M, P):
        lo, hi = max(0, m0 - P - 1), min(M, m0 + 2 * P)
        other = [s if lo <= i < hi else -7 - i for i, s in enumerate(slots)]  # every row outside: its own slot
        got = torch.ops.specvocab.logits_pieces(torch.tensor(other, dtype=torch.int32), P).tolist()
        assert [p for p in got if m0 <= p[0] < m0 + P] == [list(p) for p in pieces if m0 <= p[0] < m0 + P]


def test_logits_plan_keeps_the_summation_order_and_says_its_branch():
    """The CUDA launch plan (computed on the host, so checked here): the d-split, which fixes the summation order,
    depends on d and the dtype only; the free choices follow the documented rule and can be forced."""
    plan = torch.ops.specvocab.logits_plan
    for dtype in DTYPES:
        for d in [1, 33, 64, 256, 512, 640, 4096, 5120]:
            first = plan(1, 3072, d, dtype, True, 132)
            for M, W, sms in [(10, 3072, 132), (640, 3072, 132), (80, 512, 108), (1, 17, 1), (4096, 70000, 132)]:
                p = plan(M, W, d, dtype, True, sms)
                assert (p[0], p[1], p[5]) == (first[0], first[1], first[5]), (dtype, d, M, W)
                assert p[0] * p[1] == 8 and p[0] in (1, 2, 4, 8)
    bf16 = torch.bfloat16
    # [wd, wc, mt, ntmax, vec, nsteps, row tiles, column tiles, CTAs per row tile]
    assert plan(1, 3072, 4096, bf16, True, 132) == [8, 1, 1, 2, 1, 128, 1, 192, 1]  # bs 1: 192 CTAs of 16 columns
    assert plan(80, 3072, 4096, bf16, True, 132, 10) == [8, 1, 2, 2, 1, 128, 5, 96, 1]  # bs 8 x 10 rows: 32 columns
    assert plan(640, 3072, 4096, bf16, True, 132) == [8, 1, 2, 4, 1, 128, 20, 96, 1]  # 32-row pieces
    assert plan(10, 3072, 640, bf16, True, 132)[:3] == [4, 2, 1]  # small d: 2 column groups of 4 d-warps
    assert plan(10, 100, 64, torch.float16, True, 132)[:2] == [1, 8]
    assert plan(640, 3072, 4096, torch.float32, True, 132)[2:6] == [1, 2, 1, 256]  # fp32: FMA tiles, 16-element steps
    assert plan(10, 3072, 33, bf16, True, 132)[2:5] == [1, 2, 0]  # odd d: element loads
    assert plan(10, 3072, 4096, bf16, False, 132)[4] == 0  # unaligned base pointers
    # Gemma-3 270M (d 640, W 1200): 38 column tiles. bs 8 of one row: 8 pieces in the one row tile, shared by 4 CTAs
    # (2 pieces each: 7 would be needed for 2 CTAs per SM, and 4 give the same 2 pieces a CTA); bs 8 of 4 rows: 2 row
    # tiles of 4 pieces, one CTA each; one request's 8 rows: one piece, nothing to share; a full grid: none.
    assert plan(8, 1200, 640, bf16, True, 132, 1)[6:] == [1, 38, 4]
    assert plan(32, 1200, 640, bf16, True, 132, 4)[6:] == [2, 38, 4]
    assert plan(8, 1200, 640, bf16, True, 132, 8)[6:] == [1, 38, 1]
    assert plan(64, 3072, 4096, bf16, True, 132, 1)[6:] == [4, 96, 1]
    with pytest.raises(RuntimeError, match="per .hidden rows per slot entry. must be >= 1"):
        plan(8, 1200, 640, bf16, True, 132, 0)
    force = torch.ops.specvocab.force_logits_plan
    try:
        force(2, 4)
        assert plan(1, 3072, 4096, bf16, True, 132)[:4] == [8, 1, 2, 4]
        assert plan(1, 3072, 4096, torch.float32, True, 132)[2:4] == [1, 2]  # fp32 has one tiling
        force(0, 0, 3)
        assert plan(1, 3072, 4096, bf16, True, 132)[2:4] == [1, 2] and plan(1, 3072, 4096, bf16, True, 132)[8] == 3
        force(0, 0)
        assert plan(1, 3072, 4096, bf16, True, 132)[2:4] == [1, 2] and plan(1, 3072, 4096, bf16, True, 132)[8] == 1
        with pytest.raises(RuntimeError, match=r"mt must be 0 \(the rule\), 1 or 2, ntmax 0 \(the rule\), 2 or 4"):
            force(3, 2)
        with pytest.raises(RuntimeError, match=r"zs 0 \(the rule\) to 32"):
            force(0, 0, 33)
    finally:
        force(0, 0)


# --- window update: the C++ CPU kernel against the reference, and the reference against the paper ---


def _window_state(R: int, cap: int):
    return (
        torch.full((R, cap + 1), -1, dtype=torch.int32),
        torch.zeros(R, dtype=torch.int64),
        torch.zeros((R, cap), dtype=torch.int32),
        torch.ones(R, dtype=torch.int32),
    )


@pytest.mark.parametrize("cap", [1, 7, 64])
def test_cpu_window_update_fuzzed_against_reference(cap):
    """Thousands of random rounds: ring, length and table equal the reference after every one."""
    g = torch.Generator().manual_seed(cap)
    R, V = 6, 50
    ours, ref = _window_state(R, cap), _window_state(R, cap)
    for _ in range(700):
        B = int(torch.randint(1, R + 1, (1,), generator=g))
        rows = torch.randperm(R, generator=g)[:B]
        n = int(torch.randint(0, 3 * cap + 2, (1,), generator=g))
        block = torch.randint(-3, V + 3, (B, n), generator=g, dtype=torch.int32)  # holes, and ids >= V
        torch.ops.specvocab.window_update(*ours, rows, block, 2, V)
        reference_window_update(*ref, rows, block, 2, V)
        assert torch.equal(ours[0][:, :cap], ref[0][:, :cap])
        for a, b in zip(ours[1:], ref[1:], strict=True):
            assert torch.equal(a, b)


FUZZ_ROUNDS = {1: 25_000, 7: 25_000, 64: 25_000, 300: 25_000}  # 100,000 calls of each backend


@pytest.mark.slow
@pytest.mark.parametrize("cap", list(FUZZ_ROUNDS))
def test_cpu_window_update_long_fuzz_against_reference(one_thread, cap):
    """100,000 random rounds over the four capacities (random batches of distinct rows, holes, ids >= V,
    blocks longer than the ring): the C++ op and the torch reference agree on ring, length, ids and cnt
    after every round. The random inputs are drawn 500 rounds at a time (one generator call per kind)."""
    rounds, R, V, chunk = FUZZ_ROUNDS[cap], 6, 50 if cap < 64 else 400, 500
    g = torch.Generator().manual_seed(1000 + cap)
    ours, ref = _window_state(R, cap), _window_state(R, cap)
    for start in range(0, rounds, chunk):
        perms = torch.rand(chunk, R, generator=g).argsort(1)
        sizes = torch.randint(1, R + 1, (chunk,), generator=g).tolist()
        widths = torch.randint(0, 3 * cap + 2, (chunk,), generator=g).tolist()
        data = torch.randint(-3, V + 3, (chunk, R * (3 * cap + 1)), generator=g, dtype=torch.int32)
        for i in range(chunk):
            B, n = sizes[i], widths[i]
            rows, block = perms[i, :B], data[i, : B * n].view(B, n)
            torch.ops.specvocab.window_update(*ours, rows, block, 2, V)
            reference_window_update(*ref, rows, block, 2, V)
            same = torch.equal(ours[0][:, :cap], ref[0][:, :cap]) and all(
                torch.equal(a, b) for a, b in zip(ours[1:], ref[1:], strict=True)
            )
            assert same, f"round {start + i}: rows {rows.tolist()}, block {block.tolist()}"


def test_window_update_reference_is_the_window_rule():
    """The set is the distinct ids among the last ``capacity`` valid stream entries, ascending."""
    g = torch.Generator().manual_seed(0)
    cap, V = 9, 30
    state = _window_state(1, cap)
    stream: list[int] = []
    for _ in range(300):
        block = torch.randint(-2, V + 2, (1, int(torch.randint(0, 14, (1,), generator=g))), generator=g)
        stream += [v for v in block[0].tolist() if 0 <= v < V]
        reference_window_update(*state, torch.tensor([0]), block.to(torch.int32), 5, V)
        want = sorted(set(stream[-cap:])) or [5]
        ids, cnt = state[2][0], int(state[3][0])
        assert ids[:cnt].tolist() == want and cnt == len(want)
        assert ids[cnt:].eq(5).all()  # the fallback id past the count


def test_cpu_window_update_refuses_bad_input():
    ring, length, ids, cnt = _window_state(3, 4)
    rows, block = torch.tensor([0, 0]), torch.zeros((2, 3), dtype=torch.int32)
    with pytest.raises(RuntimeError, match="rows must be distinct"):
        torch.ops.specvocab.window_update(ring, length, ids, cnt, rows, block, 0, 10)
    with pytest.raises(RuntimeError, match=re.escape("rows must be in [0, R=3)")):
        torch.ops.specvocab.window_update(ring, length, ids, cnt, torch.tensor([3]), block[:1], 0, 10)
    with pytest.raises(RuntimeError, match="fallback_id = 10 must be a token id"):
        torch.ops.specvocab.window_update(ring, length, ids, cnt, torch.tensor([1]), block[:1], 10, 10)
    with pytest.raises(RuntimeError, match="block must be int32"):
        torch.ops.specvocab.window_update(ring, length, ids, cnt, torch.tensor([1]), block[:1].long(), 0, 10)


@pytest.mark.parametrize("kernel", ["cuda", "torch"])
def test_window_policy_on_each_backend_follows_the_paper(kernel):
    """The window policy run by the C++ kernel and by the reference equals MicroSpec's literal rule."""
    cfg = parse_config({"policy": "window", "capacity": 12, "head": {"kernel": kernel}})
    pol = build_policy(cfg, num_rows=4, fallback_id=1)
    lit = {r: LiteralWindow(12, 3, 3, ("context", "extension"), fallback=1) for r in range(4)}
    g = torch.Generator().manual_seed(1)
    rows = torch.tensor([2, 0, 3])
    pol.on_reset(rows)
    prompt = torch.randint(0, 40, (3, 9), generator=g)
    ptopk = torch.randint(0, 40, (3, 9, 3), generator=g)
    pol.on_prefill(rows, prompt, ptopk)
    for i, r in enumerate(rows.tolist()):
        lit[r].prefill(prompt[i].tolist(), ptopk[i].tolist())
    for _ in range(40):
        draft = torch.randint(0, 40, (3, 5), generator=g)
        vtopk = torch.randint(0, 40, (3, 2, 3), generator=g)
        pol.on_verify(rows, draft, vtopk, draft[:, :2])
        for i, r in enumerate(rows.tolist()):
            lit[r].verify(draft[i].tolist(), vtopk[i].tolist())
            assert pol.table.row(r) == sorted(lit[r].active())


# --- fake kernels: the ops trace without running ---------------------------------------------------


def test_fake_kernels_give_shapes_on_meta():
    hidden, weight, ids, cnt, slot = (t.to("meta") for t in _case(0, torch.bfloat16, M=6, R=3, W=5, d=8, V=20))
    assert torch.ops.specvocab.indexed_logits(hidden, weight, ids, cnt, slot).shape == (6, 5)
    packed = torch.empty((3, 5, 8), dtype=torch.bfloat16, device="meta")
    out = torch.ops.specvocab.packed_logits(hidden, packed, cnt, slot)
    assert out.shape == (6, 5) and out.dtype == torch.float32
    ring, length, tids, tcnt = (t.to("meta") for t in _window_state(3, 5))
    rows = torch.empty(2, dtype=torch.int64, device="meta")
    torch.ops.specvocab.window_update(
        ring, length, tids, tcnt, rows, torch.empty((2, 4), dtype=torch.int32, device="meta"), 0, 20
    )


def test_ops_compile_in_one_graph():
    """torch.compile traces the ops through their fake kernels (fullgraph: no graph break)."""
    args = _case(1, torch.float32, M=5, R=3, W=6, d=16, V=30)

    def head(hidden, weight, ids, cnt, slot):
        return torch.ops.specvocab.indexed_logits(hidden, weight, ids, cnt, slot).softmax(-1)

    compiled = torch.compile(head, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(*args), head(*args))

    def counted(hidden, weight, ids, cnt, slot, bad):  # the mutable counter traces too (functionalized)
        return torch.ops.specvocab.indexed_logits(hidden, weight, ids, cnt, slot, bad=bad).softmax(-1)

    hidden, weight, ids, cnt, slot = args
    cnt = cnt.clone().fill_(0)  # every row's slot has a bad count: M hidden rows counted per call
    bad = torch.zeros((), dtype=torch.int64)
    torch.compile(counted, fullgraph=True, backend="eager")(hidden, weight, ids, cnt, slot, bad)
    assert int(bad) == 5


# --- backend choice ----------------------------------------------------------------------------


def test_auto_backend_on_cpu_is_the_reference():
    assert ops.resolve("auto", "cpu", "indexed_logits") == "torch"
    assert ops.implementation("auto", "cpu", "window_update") is reference_window_update
    impl = ops.implementation("cuda", "cpu", "indexed_logits")  # bound to the device's bad-entry counter
    assert impl.func.__wrapped__ == torch.ops.specvocab.indexed_logits  # after the op's Python check
    assert impl.keywords == {"bad": ops.bad_entries("cpu")}


@pytest.mark.skipif(not _built_with_nvcc(), reason="this build has no CUDA kernels")
def test_auto_backend_on_gpu_prefers_cuda():
    assert ops.resolve("auto", "cuda", "indexed_logits") == "cuda"
    assert ops.resolve("auto", "cuda", "window_update") == "cuda"


def test_describe_names_cuda_kernels_without_a_gpu(monkeypatch):
    """setup's kernels line: CUDA kernels built on a machine without a GPU are not claimed as usable."""
    monkeypatch.setattr(_ext, "load", lambda: True)
    monkeypatch.setattr(_ext, "has_cuda_kernels", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _ext.describe() == "CPU; CUDA kernels compiled, no GPU here"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert _ext.describe() == "CPU + CUDA"
    monkeypatch.setattr(_ext, "has_cuda_kernels", lambda: False)
    assert _ext.describe() == "CPU only (built without nvcc)"
    monkeypatch.setattr(_ext, "load", lambda: False)
    monkeypatch.setattr(_ext, "reason", lambda: "not built")
    assert _ext.describe() == "none: not built"


def test_auto_backend_without_cuda_kernels_says_so_once(monkeypatch, caplog):
    monkeypatch.setattr(_backend, "has_cuda_kernels", lambda: False)  # what the backend choice asks the extension
    _backend._say_once.cache_clear()
    with caplog.at_level(logging.WARNING, logger="sglang_specvocab.ops"):
        assert ops.resolve("auto", "cuda", "indexed_logits") in ("triton", "torch")
        assert ops.resolve("auto", "cuda", "window_update") == "torch"
    said = [r for r in caplog.records if "CUDA kernels unavailable" in r.message]
    assert len(said) == 1 and "Triton and torch backends only" in said[0].message


def test_explicit_backend_that_cannot_run_is_refused(monkeypatch):
    with pytest.raises(ops.BackendError, match="'triton' has no window_update"):
        ops.resolve("triton", "cuda", "window_update")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ops.BackendError, match="'triton' needs GPU tensors"):
        ops.resolve("triton", "cpu", "indexed_logits")
    with pytest.raises(ops.BackendError, match="must be one of auto, cuda, triton, torch"):
        ops.resolve("cutlass", "cpu", "indexed_logits")
    monkeypatch.setattr(_backend, "has_cuda_kernels", lambda: False)  # what the backend choice asks the extension
    with pytest.raises(ops.BackendError, match="built without nvcc"):
        ops.resolve("cuda", "cuda", "indexed_logits")
    monkeypatch.setattr(_backend, "available", lambda: False)
    monkeypatch.setattr(_backend, "reason", lambda: "the kernels extension is not built")
    with pytest.raises(ops.BackendError, match="'cuda' is unavailable for indexed_logits: the kernels extension"):
        ops.resolve("cuda", "cpu", "indexed_logits")


def test_config_head_section_errors():
    with pytest.raises(ConfigError, match=r"head.kernel = 'cutlass' is invalid: must be 'auto', 'cuda', 'triton'"):
        parse_config({"policy": "window", "capacity": 8, "head": {"kernel": "cutlass"}})
    with pytest.raises(ConfigError, match=r"unknown key 'head.tile'"):
        parse_config({"policy": "window", "capacity": 8, "head": {"tile": 64}})
    cfg = parse_config({"policy": "lowrank", "lowrank": {"rank": 4, "topk": 8}, "head": {"mode": "packed"}})
    with pytest.raises(ConfigError, match="head.mode = 'packed' is invalid for policy 'lowrank'"):
        build_policy(cfg, 2, model=None)
    with pytest.raises(ConfigError, match="head.mode = 'packed' is invalid for policy 'full'"):
        build_policy(parse_config({"policy": "full", "head": {"mode": "packed"}}), 2)


# --- lossless decoding through the compiled CPU kernels and the packed head ------------------------


@pytest.fixture(scope="module")
def fp32_models(llama):
    # fp64 target (exact greedy oracle) and an independent fp32 draft, which the kernels accept
    return CausalLM(llama), CausalLM(tiny_llama(layers=2, seed=5, dtype=torch.float32))


HEADS = {
    "cuda-fused": {"kernel": "cuda"},
    "cuda-packed": {"kernel": "cuda", "mode": "packed"},
    "torch-packed": {"kernel": "torch", "mode": "packed"},
    "cuda-union": {"kernel": "cuda", "batch": "union"},
    "torch-union-all": {"kernel": "torch", "batch": "union", "union_view": "all"},
    "cuda-stock": {"kernel": "cuda", "batch": "stock"},
}
CASES = [(h, p) for h in list(HEADS)[:3] for p in ("window", "union-of-windows")] + [
    (h, "window") for h in list(HEADS)[3:]
]


@pytest.mark.parametrize("head,policy", [(HEADS[h], p) for h, p in CASES], ids=[f"{h}-{p}" for h, p in CASES])
def test_greedy_output_through_kernels_equals_target_only(fp32_models, head, policy):
    target, draft = fp32_models
    if policy == "window":
        cfg = {"policy": "window", "capacity": 40, "head": head}
    else:
        cfg = {
            "policy": "union",
            "capacity": 60,
            "head": head,
            "members": [
                {"policy": "window", "capacity": 30},
                {"policy": "window", "capacity": 30, "window": {"sources": ["extension"]}},
            ],
        }
    dec = SpeculativeDecoder(
        target, draft, parse_config(cfg), DraftShape(steps=4, topk=3, draft_tokens=8), eos_token_ids=[2]
    )
    g = torch.Generator().manual_seed(3)
    for n in (5, 60):
        prompt = [1] + torch.randint(3, 512, (n,), generator=g).tolist()
        assert dec.generate(prompt, 30).tokens == greedy_generate(target, prompt, 30, eos_token_ids=[2])
    if head.get("mode") == "packed":  # the packed rows are the LM-head rows of the live set
        h = dec.head
        cnt = int(dec.policy.table.cnt[dec.SLOT])
        live = h.packed_ids[dec.SLOT, :cnt].long()
        assert sorted(live.tolist()) == dec.policy.table.row(dec.SLOT)
        assert torch.equal(h.packed[dec.SLOT, :cnt], draft.weight[live])


# --- the build without nvcc ----------------------------------------------------------------------


@pytest.mark.slow
def test_build_without_nvcc_installs_cpu_kernels_and_says_so(tmp_path):
    """No nvcc: the extension still builds (CPU kernels only) and the build says so clearly."""
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "csrc", tmp_path / "csrc")
    (tmp_path / "sglang_specvocab").mkdir()
    # the version's one source (setuptools reads it without importing the package)
    shutil.copy(ROOT / "sglang_specvocab" / "__init__.py", tmp_path / "sglang_specvocab" / "__init__.py")
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    env["SPECVOCAB_NO_CUDA"] = "1"
    build = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--inplace"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert build.returncode == 0, build.stderr[-3000:]
    assert "no nvcc found" in build.stderr and "CPU kernels only" in build.stderr
    lib = next((tmp_path / "sglang_specvocab").glob("_C*.so"))
    probe = (
        "import torch, sys; torch.ops.load_library(sys.argv[1]); "
        "k = torch._C._dispatch_has_kernel_for_dispatch_key; "
        "print(k('specvocab::indexed_logits', 'CPU'), k('specvocab::indexed_logits', 'CUDA'))"
    )
    out = subprocess.run([sys.executable, "-c", probe, str(lib)], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "False"]
