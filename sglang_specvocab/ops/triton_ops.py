"""Triton backend of the head ops ``indexed_logits`` and ``packed_logits``: the kernel, ``launch`` and ``compile_for``
(the ops' Triton wrappers, which check their arguments and call ``launch``, are in ``indexed_logits.py``).

Both ops are bandwidth bound: every live candidate row of the head (``d`` elements) is read once
per slot and multiplied with the few hidden rows of that slot (tree branches of one request sit in
consecutive rows). So one kernel serves both (constexpr ``PACKED`` picks the row address: a gather
through ``ids`` into ``weight``, or the contiguous ``packed[s, j]``), and its program owns a group of
``ROWS`` consecutive hidden rows and a tile of ``BLOCK_W`` candidate columns:

* grid ``(cdiv(M, ROWS), cdiv(W, BLOCK_W))``;
* the program loops over the distinct slots of its rows (one pass when the group holds one
  request, which is the common case; any ``row_to_slot`` stays correct, just with more passes); a slot per
  request of request-major rows (``row_to_slot [B]``) is expanded here, and ids go through ``row_map``
  (constexpr ``MAPPED``: a d2t draft's or a TP shard's id-to-row map) here too, not in separate ops;
* per pass it streams the slot's ``[BLOCK_W, d]`` candidate tile in ``BLOCK_D`` chunks, loading
  each chunk once and feeding it to ``tl.dot`` against all rows of the group that map to that slot
  (fp32 accumulation; fp32 inputs use ``input_precision="ieee"``, no tf32);
* columns ``j >= cnt[s]`` and columns whose id is negative are never loaded (masked), a tile that is
  wholly dead skips the ``d`` loop, and the output there is ``-inf``;
* bad table entries (``table.head_reads``: a slot outside ``[0, R)``, a count outside ``[1, W]``, an id
  ``>= V``) are read like the CUDA kernel reads them, never out of bounds; with a counter ``bad``
  (constexpr ``COUNT``) the program that owns them adds them with one masked atomic per slot pass,
  which touches memory only when there is one; without it no counting code is compiled;
* row addresses are int64 (``V * d`` and ``R * W * d`` may pass 2**31).

``launch`` only allocates and launches (no host syncs), so the ops can sit inside a CUDA-graph-captured
decoding loop. ``compile_for`` AOT-compiles the kernel for a ``GPUTarget`` without a GPU.

The Triton interpreter (``TRITON_INTERPRET=1``) treats bf16 ``tl.dot`` operands as raw uint16 bits;
when interpreting, bf16 tiles are upcast to fp32 before the dot (constexpr ``DOT_FP32``), which is
exact because bf16 products are exact in fp32.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.runtime.jit import JITFunction

from .checks import KERNEL_FLOATS

__all__ = ["compile_for", "launch"]

ROWS = 16  # hidden rows per program; tl.dot needs >= 16 on GPU targets
_INT32_MAX = tl.constexpr(2147483647)  # "no slot left" sentinel


@triton.jit
def _head_logits_kernel(
    h_ptr,
    w_ptr,
    ids_ptr,
    cnt_ptr,
    slot_ptr,
    map_ptr,
    out_ptr,
    bad_ptr,
    M,
    W,
    D,
    R,
    V,
    L,
    PER,
    stride_h,
    stride_ws,
    stride_wr,
    stride_ids,
    stride_out,
    PACKED: tl.constexpr,
    MAPPED: tl.constexpr,
    COUNT: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_w = tl.program_id(1)
    rows = pid_m * ROWS + tl.arange(0, ROWS)
    row_ok = rows < M
    rows64 = rows.to(tl.int64)
    slots = tl.load(slot_ptr + rows // PER, mask=row_ok, other=0)  # a slot per PER request-major rows
    slots = tl.where((slots >= 0) & (slots < R), slots, -1).to(tl.int32)  # every bad slot: one pass reading nothing
    cols = pid_w * BLOCK_W + tl.arange(0, BLOCK_W)
    col_in = cols < W
    offs_d = tl.arange(0, BLOCK_D)

    todo = row_ok
    s = tl.min(tl.where(todo, slots, _INT32_MAX), axis=0)
    while s != _INT32_MAX:
        act = todo & (slots == s)
        s64 = s.to(tl.int64)
        c_raw = tl.load(cnt_ptr + tl.maximum(s, 0), mask=s >= 0, other=0)  # a bad slot reads as count 0
        live = cols < tl.minimum(tl.maximum(c_raw, 0), W)
        if PACKED:
            roff = s64 * stride_ws + cols.to(tl.int64) * stride_wr
        else:
            idx = tl.load(ids_ptr + s64 * stride_ids + cols, mask=live, other=0)
            if MAPPED:  # ids to head rows: a negative id stays dead, one past the map is a bad row (V)
                row = tl.load(map_ptr + tl.minimum(tl.maximum(idx, 0), L - 1), mask=live & (idx >= 0) & (idx < L))
                idx = tl.where(idx < 0, -1, tl.where(idx >= L, V, row))
            if COUNT:
                n_bad = tl.sum((live & (idx >= V)).to(tl.int32), axis=0)
            live = live & (idx >= 0) & (idx < V)  # a negative id is a dead column, one >= V a bad one
            roff = tl.where(live, idx, 0).to(tl.int64) * stride_wr
        if COUNT:
            # one per hidden row whose slot or count is bad (by the first column tile), one per bad column
            n_rows = tl.sum(act.to(tl.int32), axis=0)
            row_bad = ((c_raw < 1) | (c_raw > W)) & (pid_w == 0)
            add = tl.where(row_bad, n_rows, 0)
            if not PACKED:
                add += n_bad * n_rows
            tl.atomic_add(bad_ptr, add.to(tl.int64), mask=add > 0)
        acc = tl.zeros((ROWS, BLOCK_W), dtype=tl.float32)
        d_end = tl.where(tl.max(live.to(tl.int32), axis=0) > 0, D, 0)  # a wholly dead tile reads nothing
        for k in range(0, d_end, BLOCK_D):
            dk = k + offs_d
            d_ok = dk < D
            h = tl.load(h_ptr + rows64[:, None] * stride_h + dk[None, :], mask=act[:, None] & d_ok[None, :], other=0.0)
            w = tl.load(w_ptr + roff[:, None] + dk[None, :], mask=live[:, None] & d_ok[None, :], other=0.0)
            if DOT_FP32:
                h = h.to(tl.float32)
                w = w.to(tl.float32)
            acc = tl.dot(h, tl.trans(w), acc, input_precision="ieee")
        res = tl.where(live[None, :], acc, float("-inf"))
        tl.store(out_ptr + rows64[:, None] * stride_out + cols[None, :], res, mask=act[:, None] & col_in[None, :])
        todo = todo & (slots != s)
        s = tl.min(tl.where(todo, slots, _INT32_MAX), axis=0)


_DTYPES = KERNEL_FLOATS
# Arguments the JIT sees as multiples of 16 in real use (torch pointers; d and row strides of a
# hidden size such as 4096): declared so for AOT, which lets loads vectorise and the d loop pipeline.
_ALIGNED = ("h_ptr", "w_ptr", "ids_ptr", "cnt_ptr", "slot_ptr", "out_ptr", "D", "stride_h", "stride_ws", "stride_wr")
_TL_NAME = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def _interpreting() -> bool:
    return not isinstance(_head_logits_kernel, JITFunction)


@functools.cache
def _sm_count(device: torch.device) -> int:
    """SMs of a GPU (asked once per device); the interpreter's CPU tensors count as one."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def _blocks(dtype: torch.dtype, M: int, W: int, sms: int) -> tuple[int, int]:
    """(BLOCK_W, BLOCK_D) from static shapes and the SM count only: the widest tile (64, 32, 16 columns) that still
    gives every SM two programs, so one request alone (bs 1: one row group) spreads over the whole GPU."""
    block_d = 128 if dtype != torch.float32 else 64
    for block_w in (64, 32):
        if triton.cdiv(M, ROWS) * triton.cdiv(W, block_w) >= 2 * sms:
            return block_w, block_d
    return 16, block_d


def _inner_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def launch(
    hidden, table, ids, cnt, row_to_slot, bad, W, packed, block_w, block_d, num_warps, row_map=None
) -> torch.Tensor:
    """The kernel over ``table``: ``weight`` rows through ``ids``, or the rows of ``packed`` (``packed``); the op's
    wrapper has checked the arguments."""
    for name, b in (("block_w", block_w), ("block_d", block_d)):
        # The interpreter runs any tile; a GPU compile needs tl.arange sizes that are powers of two and tl.dot
        # dimensions of at least 16.
        if b is not None and (b < 16 or b & (b - 1)):
            raise ValueError(f"{name} = {b} is invalid: must be a power of two >= 16")
    M, D = hidden.shape
    out = torch.empty((M, W), dtype=torch.float32, device=hidden.device)
    if M == 0:
        return out
    bw, bd = _blocks(hidden.dtype, M, W, _sm_count(hidden.device))
    block_w, block_d = block_w or bw, block_d or bd
    hidden = _inner_contiguous(hidden)
    table = _inner_contiguous(table)
    cnt = cnt.contiguous()
    row_to_slot = row_to_slot.contiguous()
    if packed:
        stride_ws, stride_wr = table.stride(0), table.stride(1)
        ids, stride_ids, V = cnt, 0, 0  # never read when PACKED
    else:
        ids = _inner_contiguous(ids)
        stride_ws, stride_wr, stride_ids, V = 0, table.stride(0), ids.stride(0), table.shape[0]
    grid = (triton.cdiv(M, ROWS), triton.cdiv(W, block_w))
    _head_logits_kernel[grid](
        hidden,
        table,
        ids,
        cnt,
        row_to_slot,
        cnt if row_map is None else row_map.contiguous(),  # never read without MAPPED
        out,
        cnt if bad is None else bad,  # never touched without COUNT
        M,
        W,
        D,
        cnt.shape[0],
        V,
        0 if row_map is None else row_map.shape[0],
        M // row_to_slot.shape[0],
        hidden.stride(0),
        stride_ws,
        stride_wr,
        stride_ids,
        out.stride(0),
        PACKED=packed,
        MAPPED=row_map is not None,
        COUNT=bad is not None,
        ROWS=ROWS,
        BLOCK_W=block_w,
        BLOCK_D=block_d,
        DOT_FP32=hidden.dtype == torch.bfloat16 and _interpreting(),
        num_warps=num_warps,
    )
    return out


def compile_for(
    target: GPUTarget,
    dtypes: tuple[torch.dtype, ...] = _DTYPES,
    packed: tuple[bool, ...] = (False, True),
    num_warps: int = 4,
    num_stages: int = 3,
    count: bool = False,
) -> dict[tuple[str, bool], object]:
    """AOT-compile the kernel for ``target`` (no GPU needed); ``{(dtype name, PACKED): CompiledKernel}``.

    Uses the default tiles of each dtype with ``BLOCK_W = 64``; pointers, ``d`` and the row strides of
    hidden/table are declared multiples of 16 (as the JIT specialises them for real shapes); ``count``:
    the variant that counts bad table entries (``COUNT``).
    ``CompiledKernel.asm`` holds ``ttir``, ``ttgir``, ``llir``, ``ptx`` and ``cubin``.
    """
    kernel = _head_logits_kernel
    if not isinstance(kernel, JITFunction):  # module imported under TRITON_INTERPRET=1
        kernel = JITFunction(kernel.fn)
    backend = triton.compiler.make_backend(target)
    options = backend.parse_options({"num_warps": num_warps, "num_stages": num_stages, "enable_fp_fusion": True})
    out = {}
    for dtype in dtypes:
        ty = _TL_NAME[dtype]
        for is_packed in packed:
            signature = {
                "h_ptr": f"*{ty}",
                "w_ptr": f"*{ty}",
                "ids_ptr": "*i32",
                "cnt_ptr": "*i32",
                "slot_ptr": "*i64",
                "map_ptr": "*i32",
                "out_ptr": "*fp32",
                "bad_ptr": "*i64",
                **{
                    name: "i32"
                    for name in (
                        "M",
                        "W",
                        "D",
                        "R",
                        "V",
                        "L",
                        "PER",
                        "stride_h",
                        "stride_ws",
                        "stride_wr",
                        "stride_ids",
                    )
                },
                "stride_out": "i32",
            }
            constexprs = {
                "PACKED": is_packed,
                "MAPPED": not is_packed,  # the server's per-request head: ids through the draft's row map
                "COUNT": count,
                "ROWS": ROWS,
                "BLOCK_W": 64,
                "BLOCK_D": _blocks(dtype, 1 << 20, 1 << 20, 1)[1],
                "DOT_FP32": False,
            }
            for name in constexprs:
                signature[name] = "constexpr"
            attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in _ALIGNED}
            src = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
            out[(ty, is_packed)] = triton.compile(src, target=target, options=options.__dict__)
    return out
