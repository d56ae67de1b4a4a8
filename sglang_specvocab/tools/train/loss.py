"""EAGLE-3's training objective: KL(target || draft) over every unrolled draft pass (training-time test).

The KL runs over a set of columns (``Objective``: the d2t vocabulary, or frequent tokens plus the
target's top-8) with its gradient computed in the forward pass (``set_kl``); ``evaluate`` is the
exact full-head greedy agreement used for validation.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from ...errors import SpecVocabError
from .data import Batch
from .model import Eagle3Draft, ttt_forward


class _SetKL(torch.autograd.Function):
    """Sum over rows of KL(teacher || draft) over a set of columns (the draft's logits ``h @ w.T``,
    the teacher's probabilities ``p`` and ``sum p log p`` per row given), and each row's draft
    top-1 column.

    The gradient is computed in the forward pass, one chunk of rows at a time (``d KL / d z = q - p``),
    so no ``[rows, columns]`` tensor outlives its chunk and nothing is recomputed in backward. The
    draft's matmuls run in ``dtype`` (bfloat16 doubles CPU throughput), the rest in fp32."""

    @staticmethod
    def forward(ctx, h, w, p, plogp, chunk, dtype):
        hd, wd = h.detach(), w.detach()
        wc = wd.to(dtype)
        need_w = ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hd)
        grad_w = torch.zeros(wd.shape, dtype=torch.float32, device=wd.device) if need_w else None
        total = plogp.sum().float()
        cols = []
        for s in range(0, hd.shape[0], chunk):
            hc, pc = hd[s : s + chunk].to(dtype), p[s : s + chunk]
            z = (hc @ wc.T).float()
            cols.append(z.argmax(-1))
            lse = torch.logsumexp(z, dim=-1)
            total += lse.sum() - torch.dot(pc.flatten(), z.flatten())  # KL = sum p log p - sum p z + lse
            g = z.sub_(lse[:, None]).exp_().sub_(pc).to(dtype)  # q - p
            grad_h[s : s + chunk] = (g @ wc).to(hd.dtype)
            if need_w:
                grad_w += (g.T @ hc).float()
        ctx.save_for_backward(grad_h, grad_w if need_w else None)
        top1 = torch.cat(cols) if cols else hd.new_zeros(0, dtype=torch.int64)
        ctx.mark_non_differentiable(top1)
        ctx.w_dtype = wd.dtype
        return total, top1

    @staticmethod
    def backward(ctx, g_total, _g_top1):
        grad_h, grad_w = ctx.saved_tensors
        gw = None if grad_w is None else (g_total * grad_w).to(ctx.w_dtype)
        return g_total * grad_h, gw, None, None, None, None


def set_kl(h, w, p, plogp, *, chunk: int = 1024, dtype: torch.dtype = torch.float32):
    """(sum of KL(teacher || draft) over rows, each row's draft top-1 column): draft logits ``h @ w.T``
    softmaxed over the columns; the teacher's probabilities ``p [rows, columns]`` and ``plogp``
    (``sum p log p`` per row, see :func:`teacher_probs`). Differentiable in ``h`` and ``w``."""
    return _SetKL.apply(h, w, p, plogp, chunk, dtype)


@torch.no_grad()
def teacher_probs(hidden: torch.Tensor, w: torch.Tensor, softcap: float | None = None, chunk: int = 1024):
    """The target's distribution over the columns ``w`` (its head rows) from its final hidden states
    (fp32, soft-capped like the target), and ``sum p log p`` per row."""
    ps, plogps = [], []
    wf = w.float()
    with torch.autocast(hidden.device.type, enabled=False):  # the teacher stays fp32 under the draft's autocast
        for hc in hidden.split(chunk):
            z = hc.float() @ wf.T
            if softcap:
                z = torch.tanh(z / softcap) * softcap
            logp = torch.log_softmax(z, dim=-1)
            p = logp.exp()
            plogps.append((p * logp).sum(-1))
            ps.append(p)
    return torch.cat(ps), torch.cat(plogps)


@dataclass
class Objective:
    """The target's side of the loss: its LM head (frozen), soft-capping, and the columns the KL
    runs over. A d2t draft is scored over its own vocabulary; a full-vocabulary draft over the
    whole vocabulary when ``loss_ids`` is None, else over ``loss_ids`` plus the target's top-K at
    every scored position of the batch (a few times cheaper at a 262k vocabulary; the target's
    own choices are always among the columns)."""

    head: torch.Tensor  # [V, hidden]
    softcap: float | None = None
    loss_ids: torch.Tensor | None = None
    dtype: torch.dtype = torch.float32  # the draft-side head matmuls
    chunk: int = 1024
    #: Pass k's KL weighs step_weight**k (normalised over the passes that score rows): 1 weighs every draft step
    #: alike; the published recipes' 0.8 weighs the first steps, whose misses end a chain, more.
    step_weight: float = 1.0

    @classmethod
    def for_target(cls, target, **kw) -> Objective:
        head = target.get_output_embeddings().weight.detach()
        return cls(head, getattr(target.config, "final_logit_softcapping", None), **kw)


@dataclass
class StepStats:
    loss: float  # mean over passes of the mean KL per row
    kl: list[float]  # per pass
    accuracy: list[float]  # per pass: draft top-1 == target top-1
    accept_length: float  # 1 + mean length of the correct prefix of a full chain (greedy, topk 1)


def _scored(batch: Batch, k: int) -> torch.Tensor:
    """Pass ``k``'s scored rows ``[B, T]``: row ``i`` predicts the token after position ``j = i + k + 1``,
    scored where ``j`` predicts a response token (``j >= prompt_len - 1``) and its next token is in
    the data (``j <= length - 2``), so padding and positions past the data never count."""
    t = batch.input_ids.shape[1]
    j = torch.arange(t, device=batch.input_ids.device)[None, :] + k + 1
    return (j >= (batch.prompt_lens[:, None] - 1)) & (j <= batch.lengths[:, None] - 2)


def _chain_counts(oks: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, int]:
    """(sum of correct-prefix lengths, number of chains) over the chains whose every pass is scored;
    ``oks``: per pass, (draft right, scored) ``[B, T]``."""
    all_valid = torch.stack([v for _, v in oks]).all(0)
    run = torch.ones_like(all_valid)
    accepted = torch.zeros(all_valid.shape, device=all_valid.device)
    for ok, _ in oks:
        run = run & ok
        accepted += run.float()
    return float(accepted[all_valid].sum()), int(all_valid.sum())


def _accept_length(accepted: float, chains: int) -> float:
    return 1.0 + accepted / chains if chains else float("nan")


def ttt_loss(draft: Eagle3Draft, batch: Batch, steps: int, objective: Objective) -> tuple[torch.Tensor, StepStats]:
    """Training-time-test loss of one batch: the mean over passes of KL(target || draft) (weighted by
    ``objective.step_weight`` per pass).

    Pass ``k``'s row ``i`` is scored against the target's distribution at position
    ``j = i + k + 1`` (see :func:`_scored`), over the columns of ``objective``.
    """
    b, t = batch.input_ids.shape
    outs = ttt_forward(draft, batch.input_ids, batch.aux.float(), steps)
    masks = [_scored(batch, k) for k in range(steps)]
    head = objective.head
    if draft.hot_ids is not None:  # the draft's own vocabulary, and the target's rows for it
        cols, w, wt = draft.hot_ids, draft.lm_head.weight, head[draft.hot_ids]
    elif objective.loss_ids is None:
        cols, w, wt = None, draft.target_head, head
    else:
        j = torch.cat([m.nonzero() + torch.tensor([0, k + 1], device=m.device) for k, m in enumerate(masks)])
        seen = batch.topk[j[:, 0], j[:, 1]].flatten().to(objective.loss_ids.device)
        cols = torch.cat([objective.loss_ids, seen]).unique().to(head.device)  # indexed by top1, on the head's device
        w = wt = head[cols]
    # The teacher once per batch: every pass scores a subset of pass 0's positions j.
    b0, i0 = masks[0].nonzero(as_tuple=True)
    where = torch.full((b, t), -1, dtype=torch.int64, device=masks[0].device)
    where[b0, i0 + 1] = torch.arange(len(b0), device=where.device)
    p, plogp = teacher_probs(batch.hidden[b0, i0 + 1], wt, objective.softcap, objective.chunk)
    losses, weights, kls, accs, oks = [], [], [], [], []
    for k, (normed, valid) in enumerate(zip(outs, masks, strict=True)):
        bi, ii = valid.nonzero(as_tuple=True)
        full = torch.zeros(b, t, dtype=torch.bool, device=valid.device)
        oks.append((full, valid))
        if len(bi) == 0:  # short sequences: nothing this deep into the chain
            kls.append(float("nan"))
            accs.append(float("nan"))
            continue
        jj = ii + k + 1
        rows = where[bi, jj]
        kl_sum, top1 = set_kl(normed[bi, ii], w, p[rows], plogp[rows], chunk=objective.chunk, dtype=objective.dtype)
        ok = (top1 if cols is None else cols[top1]) == batch.topk[bi, jj, 0]
        losses.append(kl_sum / len(bi))
        weights.append(objective.step_weight**k)
        kls.append(float(losses[-1].detach()))
        accs.append(float(ok.float().mean()))
        full[bi, ii] = ok
    if not losses:
        raise SpecVocabError("a training batch has no response positions to learn from (prompts too long?)")
    if objective.step_weight == 1.0:
        loss = torch.stack(losses).mean()
    else:
        loss = (torch.stack(losses) * torch.tensor(weights, device=losses[0].device)).sum() / sum(weights)
    return loss, StepStats(float(loss.detach()), kls, accs, _accept_length(*_chain_counts(oks)))


@torch.no_grad()
def evaluate(draft: Eagle3Draft, batches: Iterable[Batch], steps: int, chunk: int = 256) -> dict:
    """Exact greedy agreement of a chain of ``steps`` draft tokens with the target, over the draft's
    whole head (fp32): per-pass top-1 accuracy and the estimated accept length."""
    draft.eval()
    hits = [0] * steps
    counts = [0] * steps
    accepted, chains = 0.0, 0
    w = draft.head_weight.float()
    for batch in batches:
        outs = ttt_forward(draft, batch.input_ids, batch.aux.float(), steps)
        oks = []
        for k, normed in enumerate(outs):
            valid = _scored(batch, k)
            bi, ii = valid.nonzero(as_tuple=True)
            top = torch.cat([(h.float() @ w.T).argmax(-1) for h in normed[bi, ii].split(chunk)]) if len(bi) else bi
            ok = draft.draft_to_target(top) == batch.topk[bi, ii + k + 1, 0]
            full = torch.zeros_like(valid)
            full[bi, ii] = ok
            oks.append((full, valid))
            hits[k] += int(ok.sum())
            counts[k] += len(bi)
        a, c = _chain_counts(oks)
        accepted += a
        chains += c
    return {
        "accuracy": [h / c if c else float("nan") for h, c in zip(hits, counts, strict=True)],
        "accept_length": _accept_length(accepted, chains),
        "rows": counts[0],
    }
