"""The head's batch modes in ``bench kernels``: what one draft step's head costs, ours against the stock heads.

Per (d, V, draft kind, rows per request, batch) the sweep times, on the same inputs:

- ``head`` (our ``DraftHead`` call and its top-k with probabilities, what the server runs per draft step), once per
  plan: ``per-request``, ``union-indexed``, ``union-gemm``, ``stock``; the plan ``auto`` picks for the shape (the cost
  model of this device, ``headcost.costs_for``) is recorded on every record as ``auto_mode``;
- ``stock``: EAGLE3's own draft head step in the pinned SGLang (``EagleDraftWorker.draft_forward``, ``eagle_worker_v2.py``):
  the dense GEMM over the draft's rows in the weight's dtype, the logits cast to fp32 (``LogitsProcessor._get_logits``),
  then for topk > 1 ``renorm_draft_probs`` (SGLang's sampling softmax: ``torch.softmax`` on every GPU but SM 10.3) and
  ``fast_topk`` (``torch.topk``); for topk = 1 on CUDA the Triton split argmax ``draft_topk1_postprocess`` (no
  softmax; it advances ``positions`` and, for a full draft, writes the chain buffer; copied in ``copies/from-sglang/eagle3_topk1.py``),
  ``torch.argmax`` on a CPU; for a d2t draft the ``hot_token_id`` remap. Where ``auto`` picks the plan ``stock`` the
  server runs this code path (``integration/logits.py``), so the reports take auto's time there from this op;
- ``gemma4_mtp`` (full kind): the Gemma-4 MTP assistant's centroid head as the pinned SGLang describes it, written from
  that description: per hidden row, centroid scores ``[N, 2048]``, their top 32 clusters, the rows of those clusters
  gathered per row (``32 x V/2048`` = 4096 of 262,144 tokens), one batched GEMV, the logits scattered into a
  full-vocabulary tensor filled with the dtype's minimum / 2, then the same draft top-k as the stock step.

Draft kinds: ``d2t`` (a stock EAGLE-3 checkpoint: a 32,768-row head and its d2t map into V) and ``full`` (a head over
all V ids). Sets are full (``cnt = W``); a batch's sets are W-id subsets of one pool of ``ratio(bs) * W`` ids (the lab's
measured union-to-set ratio, ``configs/data/union-sizes.json``), so the union is as large as measured. ``k`` of the
top-k is the rows per request (the tree's ``topk``).
"""

from __future__ import annotations

import torch

from ... import headcost
from ...copies import installed_sglang_version, load_copy, supported_versions
from ...head import DraftHead, head_options
from ...table import CandidateTable
from ...vocab import VocabSpace

HEAD_PLANS = headcost.MODES
D2T_ROWS = 32768
MTP_CLUSTERS, MTP_TOP = 2048, 32


def pool_size(bs: int, W: int, space: int, sizes: headcost.UnionSizes) -> int:
    """Ids the batch's sets are drawn from: the expected union of ``bs`` full sets, within the id space."""
    return max(W, min(space, round(sizes.expected(bs, W))))


def make_tables(
    bs: int, W: int, space: torch.Tensor, pool: int, n: int, gen: torch.Generator, device: torch.device
) -> list[CandidateTable]:
    """``n`` tables of ``bs + 1`` rows (row 0 padding): each batch's W-id sets drawn from its own pool of ``pool``
    ids of ``space`` (sorted, full: cnt = W)."""
    out = []
    for _ in range(n):
        t = CandidateTable(bs + 1, W, device=device, fallback_id=int(space[0]))
        chosen = space[torch.randperm(space.numel(), generator=gen, device=space.device)[:pool]]
        key = torch.rand(bs, pool, generator=gen, device=device)
        sets = chosen[key.argsort(dim=1)[:, :W]]
        t.assign(torch.arange(1, bs + 1, device=device), sets)
        out.append(t)
    return out


def eagle3_stock(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    k: int,
    hot: torch.Tensor | None,
    positions: torch.Tensor | None = None,
    chain: torch.Tensor | None = None,
):
    """EAGLE3's draft head step in the pinned SGLang (see the module doc): logits, fp32, then softmax + ``torch.topk``
    (k > 1) or the split argmax (k = 1; ``positions [N]`` int64 advanced, ``chain [N, >= 2]`` int64 written in column 1
    for a full draft), then the d2t remap."""
    return eagle3_topk((hidden @ weight.T).float(), k, hot, positions, chain)


def eagle3_topk(
    logits: torch.Tensor,
    k: int,
    hot: torch.Tensor | None,
    positions: torch.Tensor | None = None,
    chain: torch.Tensor | None = None,
):
    """EAGLE3's draft top-k of fp32 logits ``[N, H]`` (``eagle3_stock`` after the GEMM)."""
    if k > 1:
        p, i = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
    elif logits.is_cuda:
        # SGLang's own kernel, copied: the installed version's, else the newest supported (Triton: GPU only)
        topk1 = load_copy("eagle3_topk1", installed_sglang_version() or supported_versions()[-1])
        draft_topk1_postprocess = topk1.draft_topk1_postprocess
        if positions is None:
            positions = torch.zeros(logits.shape[0], dtype=torch.int64, device=logits.device)
        p, i = draft_topk1_postprocess(logits, positions, chain if hot is None else None, 1)
    else:
        i = torch.argmax(logits, dim=-1, keepdim=True)
        p = torch.ones_like(i, dtype=torch.float32)
        if positions is not None:
            positions.add_(1)
    return p, (hot[i] if hot is not None else i)


class Gemma4MTP:
    """The Gemma-4 MTP assistant's centroid-masked head (see the module doc), over a centroid-ordered weight."""

    def __init__(self, weight: torch.Tensor, V: int, gen: torch.Generator):
        self.vpc = V // MTP_CLUSTERS  # tokens per cluster; the rest of V is in no cluster
        d = weight.shape[1]
        self.weight = weight[: MTP_CLUSTERS * self.vpc].view(MTP_CLUSTERS, self.vpc, d)
        self.centroids = (torch.randn(MTP_CLUSTERS, d, generator=gen, device=weight.device) * 0.05).to(weight.dtype)
        self.ordering = torch.randperm(V, generator=gen, device=weight.device)[: MTP_CLUSTERS * self.vpc]
        self.V = V

    def __call__(self, hidden: torch.Tensor, k: int):
        N = hidden.shape[0]
        top = (hidden @ self.centroids.T).topk(MTP_TOP, dim=-1).indices  # [N, 32]
        rows = self.weight[top].reshape(N, MTP_TOP * self.vpc, -1)  # gathered per hidden row
        logits = torch.bmm(hidden[:, None, :], rows.transpose(1, 2)).squeeze(1)
        idx = self.ordering.view(MTP_CLUSTERS, self.vpc)[top].reshape(N, -1)
        full = torch.full((N, self.V), torch.finfo(logits.dtype).min / 2, dtype=logits.dtype, device=logits.device)
        full.scatter_(1, idx, logits)
        return eagle3_topk(full.float(), k, None)


def head_calls(
    weight: torch.Tensor | list[torch.Tensor],
    tables: list[CandidateTable],
    hiddens: list[torch.Tensor],
    plan: str,
    k: int,
    kernel: str,
    hot: torch.Tensor | None,
    V: int,
    C: int,
):
    """One call per input set: our head in ``plan`` (one head per table, over ``weight`` or its own of a list) and its
    top-k with probabilities."""
    weights = weight if isinstance(weight, list) else [weight] * len(tables)
    options = head_options(kernel=kernel, batch=plan, union_capacity=C)
    heads = [
        DraftHead(w, t, VocabSpace.build(V, head_ids=hot, fallback_id=t.fallback_id, device=w.device), options)
        for w, t in zip(weights, tables, strict=True)
    ]
    rows = torch.arange(1, tables[0].num_rows, device=weights[0].device)
    return heads, [(lambda h=h, x=x: h(x, rows).topk_probs(k)) for h, x in zip(heads, hiddens, strict=True)]


def expected_bytes(plan: str, bs: int, W: int, d: int, H: int, U: float, C: int, e: int) -> float:
    """Bytes of head rows the plan must read at the least (for the GB/s column)."""
    rows = {"per-request": bs * W, "union-indexed": U, "union-gemm": 3 * C, "stock": H}[plan]
    return rows * d * e


def auto_plan(bs: int, rows: int, W: int, d: int, H: int, V: int, C: int, elem: int, device: torch.device) -> str:
    """What ``head.batch: auto`` runs for the shape on this device: ``DraftHead.plan``'s function of its shape."""
    costs = headcost.costs_for(torch.cuda.get_device_name(device) if device.type == "cuda" else device.type)
    shape = headcost.Shape(bs, rows, W, d, H, V, C, elem=elem, mapped=H != V)
    return headcost.choose(shape, costs, headcost.shipped_union_sizes())
