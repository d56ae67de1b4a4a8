"""``window_verify``: one verify round of the window policy in one op, from SGLang's verify tensors
(csrc/window_verify.cpp, csrc/window_verify_kernel.cu): ``WindowRound``, the round's arguments as one object, and
the op's argument check, torch reference, fake kernel and public entry.
"""

from __future__ import annotations

import dataclasses
import operator

import torch

from ..table import distinct_segments, safe_rows, set_contains
from ._backend import implementation, register
from ._ext import fake
from .checks import need, one_device
from .window_update import check_window_update, reference_window_update


@dataclasses.dataclass(kw_only=True, slots=True)
class WindowRound:
    """One verify round of the window policy: the window's state, which the op updates in place, and the round's
    tensors from SGLang's verify (``reference_window_verify`` says what each holds). The fields are in the order of
    the compiled op's arguments."""

    ring: torch.Tensor  # int32 [R, >= capacity]
    length: torch.Tensor  # int64 [R]
    ids: torch.Tensor  # the candidate table: int32 [R, capacity]
    cnt: torch.Tensor  # int32 [R]
    acc: torch.Tensor  # telemetry: float64 [4, R]
    rows: torch.Tensor  # int64 [B], distinct slots
    draft_token: torch.Tensor  # [B * nd]
    accept_index: torch.Tensor  # [B, S]
    accept_lens: torch.Tensor  # [B]
    predict: torch.Tensor  # [B * nd]
    topk_values: torch.Tensor  # float [B * nd, kk]
    topk_ids: torch.Tensor  # int64 [B * nd, kk]
    hot: torch.Tensor | None  # a d2t draft's vocabulary: bool [vocab]
    k: int
    context: bool
    compacted: bool
    fallback_id: int
    vocab_size: int


_in_schema_order = operator.attrgetter(*(f.name for f in dataclasses.fields(WindowRound)))


# --- argument check --------------------------------------------------------------------------------------


def check_window_verify(r: WindowRound) -> None:
    op = "window_verify"
    need(r.ids.dim() == 2, op, f"ids must be int32 [R, capacity], got {r.ids.dtype} {tuple(r.ids.shape)}")
    R = r.ids.shape[0]
    need(
        r.acc.dtype == torch.float64 and tuple(r.acc.shape) == (4, R) and r.acc.is_contiguous(),
        op,
        f"acc must be contiguous float64 [4, R={R}], got {r.acc.dtype} {tuple(r.acc.shape)}",
    )
    need(
        r.rows.dim() == 1 and r.rows.dtype == torch.int64,
        op,
        f"rows must be int64 [B], got {r.rows.dtype} {tuple(r.rows.shape)}",
    )
    B = r.rows.shape[0]
    need(
        r.accept_index.dim() == 2 and r.accept_index.shape[0] == B,
        op,
        f"accept_index must be [B={B}, S], got {tuple(r.accept_index.shape)}",
    )
    need(
        r.accept_lens.dim() == 1 and r.accept_lens.shape[0] == B,
        op,
        f"accept_lens must be [B={B}], got {tuple(r.accept_lens.shape)}",
    )
    need(
        B > 0 and r.draft_token.dim() == 1 and r.draft_token.numel() > 0 and r.draft_token.numel() % B == 0,
        op,
        f"draft_token must be [B * num_draft_tokens] with B={B} >= 1, got {tuple(r.draft_token.shape)}",
    )
    nd = r.draft_token.numel() // B
    need(
        r.predict.dim() == 1 and r.predict.numel() == B * nd,
        op,
        f"predict must be [B * num_draft_tokens={B * nd}], got {tuple(r.predict.shape)}",
    )
    need(
        r.topk_values.dim() == 2
        and r.topk_values.shape[0] == B * nd
        and r.topk_values.shape == r.topk_ids.shape
        and r.topk_ids.dtype == torch.int64
        and r.topk_values.is_floating_point(),
        op,
        f"topk_values (float) and topk_ids (int64) must both be [B * num_draft_tokens={B * nd}, kk], got "
        f"{r.topk_values.dtype} {tuple(r.topk_values.shape)} and {r.topk_ids.dtype} {tuple(r.topk_ids.shape)}",
    )
    for name, t in (
        ("draft_token", r.draft_token),
        ("accept_index", r.accept_index),
        ("accept_lens", r.accept_lens),
        ("predict", r.predict),
    ):
        need(
            not t.is_floating_point() and t.dtype != torch.bool, op, f"{name} must be an integer tensor, got {t.dtype}"
        )
    need(r.k >= 0, op, f"k = {r.k} must be >= 0")
    if r.hot is not None:
        need(
            r.hot.dim() == 1 and r.hot.dtype == torch.bool,
            op,
            f"hot must be a bool [vocab] mask, got {r.hot.dtype} {tuple(r.hot.shape)}",
        )
    one_device(op, *(t for t in _in_schema_order(r) if isinstance(t, torch.Tensor)))
    check_window_update(r.ring, r.length, r.ids, r.cnt, r.rows, None, r.fallback_id, r.vocab_size)


# --- torch reference -------------------------------------------------------------------------------------


def reference_window_verify(r: WindowRound) -> torch.Tensor:
    """One verify round of the window policy from SGLang's verify tensors, in place; returns ``accepted``.

    Inputs (``B`` requests, ``nd`` draft tokens each, ``S`` accept columns): ``draft_token`` ``[B * nd]``
    (root first), ``accept_index`` ``[B, S]`` (global node rows of the accepted path, -1 padded),
    ``accept_lens`` ``[B]``, ``predict`` ``[B * nd]`` (the committed token after each node; with
    ``compacted`` token s of request b sits at ``b * nd + min(s, nd - 1)``), ``topk_values``/``topk_ids``
    ``[B * nd, kk]`` (the target's top-``kk`` per node, ``kk <= k``), ``hot`` an optional bool mask of
    the draft vocabulary. Position s of request b is accepted when ``accept_index[b, s] >= 0`` and
    ``s < accept_lens[b]``.

    1. ``accepted[b, s]``: the committed token at each accepted position, else -1 (int64 ``[B, S]``).
    2. Telemetry, against the sets as they are before this round: ``acc[:, rows[b]] += (cnt[rows[b]],
       1, committed tokens in the set, committed tokens)``.
    3. The window entries, two segments: the draft tokens (if ``context``), then per position s
       ``k`` top-k ids in rank order (-1 where s is not accepted, past ``kk``, or the logit is -inf).
       An id outside ``[0, vocab_size)`` or ``hot`` is a hole; so is a repeat of an earlier id of its
       own segment. ``window_update(ring, length, ids, cnt, rows, entries, fallback_id, vocab_size)``.
    """
    check_window_verify(r)
    B, S = r.accept_index.shape
    nd = r.draft_token.numel() // B
    dev = r.ids.device
    steps = torch.arange(S, device=dev)
    index = r.accept_index.long()
    valid = (index >= 0) & (steps[None, :] < r.accept_lens.long()[:, None])
    pos = index.clamp(min=0)
    front = torch.arange(B, device=dev)[:, None] * nd + steps.clamp(max=nd - 1)[None, :]
    accepted = torch.where(valid, r.predict.long()[front if r.compacted else pos], -1)

    def keep(t: torch.Tensor) -> torch.Tensor:
        ok = (t >= 0) & (t < r.vocab_size)
        if r.hot is not None:
            ok &= (t < r.hot.numel()) & r.hot[t.clamp(0, max(r.hot.numel() - 1, 0))]
        return torch.where(ok, t, -1)

    segments = []
    if r.context:
        segments.append(keep(r.draft_token.long().view(B, nd)))
    if r.k:
        kk = r.topk_ids.shape[1]
        top = torch.where(valid[:, :, None] & (r.topk_values[pos] > float("-inf")), r.topk_ids[pos], -1)  # [B, S, kk]
        top = torch.nn.functional.pad(top[:, :, : r.k], (0, r.k - min(kk, r.k)), value=-1)
        segments.append(keep(top.reshape(B, S * r.k)))
    # each id that repeats an earlier one of its own segment is a hole
    block = distinct_segments(segments) if segments else torch.empty((B, 0), dtype=torch.int64, device=dev)

    safe, ok = safe_rows(r.rows, r.ids.shape[0])  # a row out of range (not refused: a GPU) adds no telemetry
    live = r.cnt.index_select(0, safe)
    hit = set_contains(r.ids, r.cnt, r.rows, accepted).sum(1)
    committed = (accepted >= 0).sum(1)
    r.acc.index_add_(
        1,
        safe,
        torch.stack(
            (live.double(), torch.ones_like(live, dtype=torch.float64), hit.double(), committed.double())
        ).masked_fill_(~ok, 0),
    )
    reference_window_update(r.ring, r.length, r.ids, r.cnt, r.rows, block.to(torch.int32), r.fallback_id, r.vocab_size)
    return accepted


def _compiled_window_verify(r: WindowRound) -> torch.Tensor:
    return torch.ops.specvocab.window_verify(*_in_schema_order(r))  # the op's schema: the fields, in order


@fake("window_verify")
def _fake_window_verify(ring, length, ids, cnt, acc, rows, draft_token, accept_index, *rest):
    return rows.new_empty(tuple(accept_index.shape), dtype=torch.int64)


register("window_verify", reference_window_verify, check=check_window_verify, cuda=_compiled_window_verify)


def window_verify(r: WindowRound, *, backend: str = "auto") -> torch.Tensor:
    """One verify round of the window policy, in place; returns the committed tokens (see
    ``reference_window_verify``)."""
    return implementation(backend, r.ids.device, "window_verify")(r)
