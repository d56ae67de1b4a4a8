"""EAGLE-3's training objective: KL(target || draft) over every unrolled draft pass (training-time test)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from ..errors import SpecVocabError
from .model import Eagle3Draft, ttt_forward


def _chunk_kl(h, w, teacher_flat, rows, hot_ids):
    """KL(teacher || draft) summed over ``rows`` of the flattened teacher logits, and whether the
    draft's top-1 (as a target id) is the target's top-1 over its full vocabulary (what greedy
    verification accepts)."""
    logq = torch.log_softmax((h @ w.T).float(), dim=-1)
    t = teacher_flat[rows].float()
    target_top1 = t.argmax(-1)
    if hot_ids is not None:
        t = t[:, hot_ids]  # the target's distribution restricted to (renormalised over) the draft vocab
    logp = torch.log_softmax(t, dim=-1)
    kl = (logp.exp() * (logp - logq)).sum(-1)
    top1 = logq.argmax(-1)
    if hot_ids is not None:
        top1 = hot_ids[top1]
    return kl.sum(), top1 == target_top1


def kl_rows(draft: Eagle3Draft, h: torch.Tensor, teacher_flat: torch.Tensor, rows: torch.Tensor, chunk: int = 1024):
    """(sum of KL over rows, per-row top-1 agreement) of draft outputs ``h [N, hidden]`` against the
    teacher logits ``teacher_flat[rows]`` (``teacher_flat``: ``[B*T, V]``). Chunks of rows are
    recomputed in backward (activation checkpointing), so no ``[rows, vocab]`` tensor outlives
    its chunk and the teacher rows are gathered inside the chunk, never all at once."""
    total = h.new_zeros((), dtype=torch.float32)
    agree = []
    w = draft.head_weight
    for s in range(0, h.shape[0], chunk):
        kl, ok = checkpoint(
            _chunk_kl,
            h[s : s + chunk],
            w,
            teacher_flat,
            rows[s : s + chunk],
            draft.hot_ids,
            use_reentrant=False,
        )
        total = total + kl
        agree.append(ok)
    return total, torch.cat(agree) if agree else h.new_zeros(0, dtype=torch.bool)


@dataclass
class StepStats:
    loss: float  # mean over passes of the mean KL per row
    kl: list[float]  # per pass
    accuracy: list[float]  # per pass: draft top-1 == target top-1
    accept_length: float  # 1 + mean length of the correct prefix of a full chain (greedy, topk 1)


def ttt_loss(
    draft: Eagle3Draft,
    input_ids: torch.Tensor,
    lengths: torch.Tensor,
    prompt_lens: torch.Tensor,
    aux: torch.Tensor,
    teacher_logits: torch.Tensor,
    steps: int,
) -> tuple[torch.Tensor, StepStats]:
    """Training-time-test loss of one batch: the mean over passes of KL(target || draft).

    Pass ``k``'s row ``i`` is scored against the target's distribution at position
    ``j = i + k + 1``, only where that position is in the response (``j >= prompt_len - 1``:
    it predicts a response token) and its next token is in the data (``j <= length - 2``),
    so padding and positions past the data never count.
    """
    b, t = input_ids.shape
    cols = torch.arange(t, device=input_ids.device)[None, :]
    teacher_flat = teacher_logits.reshape(b * t, -1)
    outs = ttt_forward(draft, input_ids, aux, steps)
    losses, kls, accs, oks = [], [], [], []
    for k, normed in enumerate(outs):
        j = cols + k + 1
        valid = (j >= (prompt_lens[:, None] - 1)) & (j <= lengths[:, None] - 2)
        bi, ii = valid.nonzero(as_tuple=True)
        full = torch.zeros(b, t, dtype=torch.bool, device=input_ids.device)
        oks.append((full, valid))
        if len(bi) == 0:  # short sequences: nothing this deep into the chain
            kls.append(float("nan"))
            accs.append(float("nan"))
            continue
        kl_sum, ok = kl_rows(draft, normed[bi, ii], teacher_flat, bi * t + ii + k + 1)
        losses.append(kl_sum / len(bi))
        kls.append(float(losses[-1].detach()))
        accs.append(float(ok.float().mean()))
        full[bi, ii] = ok
    if not losses:
        raise SpecVocabError("a training batch has no response positions to learn from (prompts too long?)")
    # Chains whose every pass is scored: how many leading passes are right.
    all_valid = torch.stack([v for _, v in oks]).all(0)
    run = torch.ones_like(all_valid)
    accepted = torch.zeros(b, t, device=input_ids.device)
    for full, _ in oks:
        run = run & full
        accepted += run.float()
    accept = 1.0 + float(accepted[all_valid].mean()) if all_valid.any() else float("nan")
    loss = torch.stack(losses).mean()
    return loss, StepStats(float(loss.detach()), kls, accs, accept)
