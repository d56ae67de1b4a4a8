"""``lowrank``: SpecVocab, a low-rank ranker on the draft hidden state picks each step's set.

Approximate logits ``(hidden @ W_down.T) @ W_vocab.T`` (``W_down[d', d]``, ``W_vocab[V, d']``) rank the whole
vocabulary; the ``topk`` best ids become the request's set and the head then computes exact logits over them. The ranker
ranks the draft head's rows: a d2t draft's rows are mapped to their target ids (the ``ModelContext``'s
``space.head_ids``); a tensor-parallel head is ranked whole on every rank (``head_weight``), so the set is the same on
every rank and at every TP size, with no collective in the draft step (each rank reads the whole ranker, ``V x d'``, a
step: the head's cost at TP 1).

Rows of one request (its beams) share one set: the top-k of the element-wise **maximum** of
their approximate logits. That keeps the set exactly ``topk`` ids wide (no cap, no padding)
and lets an id in that any branch ranks highly enter; a union of per-row top-k would need a
cap and an order to cut it by.

Ranker, ``ranker:``
- ``svd`` (training-free, beyond the paper): the rank-d' truncated SVD of the LM head,
  ``W = U S V^T``: ``W_down = V_r^T``, ``W_vocab = U_r S_r = W V_r``; cached per weights.
- a path: a ranker fit by ``sglang-specvocab train-ranker`` on recorded draft hidden states: by KL
  distillation (``--fit kl``, the paper's; the file holds ``W_down`` and ``W_vocab``) or in closed form
  (``--fit whitened``, beyond the paper): the rank-d' map that best reproduces the head's logits over the
  recorded states' distribution, i.e. the truncated SVD of ``W L`` where ``L L^T`` is the states' second
  moment; the file holds ``W_down = V_r^T L^-1`` and ``P = L V_r`` (``[d, d']``, so it stays small) and
  ``W_vocab = W P`` is computed from the head at load. The plain SVD treats every direction of the hidden
  space alike; real states use few of them, which the whitened fit spends its rank on (measured:
  docs/policies.md, "Fidelity").
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from pydantic import Field

from ..cache import cached, weights_key
from ..config import PolicyConfig, Section
from ..errors import ConfigError
from ..table import CandidateTable
from .base import ModelContext, Policy, load_trained


class LowRankSection(Section):
    rank: int = Field(ge=1, description="d', the ranker's inner dimension (the paper: d/16 to d/8)")
    topk: int = Field(ge=1, description="ids per request per draft step (the paper: 2048)")
    ranker: str = Field("svd", description="'svd' (training-free) or a ranker file from sglang-specvocab train-ranker")


class LowRankConfig(PolicyConfig):
    policy: Literal["lowrank"]
    lowrank: LowRankSection

    capacity_key: ClassVar[str] = "lowrank.topk"
    file_keys: ClassVar[tuple] = (("lowrank", "ranker", "svd", "train-ranker"),)

    @property
    def table_capacity(self) -> int:
        return self.lowrank.topk


def svd_ranker(weight: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(W_down [rank, d], W_vocab [V, rank]) of the truncated SVD of ``weight[V, d]``."""
    w = weight.detach().double()
    evals, evecs = torch.linalg.eigh(w.T @ w)  # right singular vectors, without a [V, V] factor
    v = evecs[:, evals.argsort(descending=True)[:rank]]
    return v.T.contiguous(), (w @ v).contiguous()


def whitened_ranker(weight: torch.Tensor, hidden: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(W_down [rank, d], P [d, rank], share): the rank-``rank`` ranker ``W P W_down h`` that minimises
    E||W h - W P W_down h||^2 over the states ``hidden[N, d]``, and the share of E||W h||^2 it keeps.

    With the states' second moment C = L L^T, the error is ||(W - W P W_down) L||_F^2, least at the truncated SVD
    of M = W L = U S V^T: W P W_down = U_r S_r V_r^T L^-1, so P = L V_r and W_down = V_r^T L^-1."""
    w, h = weight.detach().double(), hidden.detach().double()
    c = h.T @ h / max(len(h), 1)
    c += torch.eye(c.shape[0], dtype=c.dtype) * (1e-6 * float(c.diagonal().mean()) + 1e-12)  # unused directions
    lo = torch.linalg.cholesky(c)
    m = w @ lo
    evals, evecs = torch.linalg.eigh(m.T @ m)  # right singular vectors of M, without a [V, V] factor
    order = evals.argsort(descending=True)
    v = evecs[:, order[:rank]]
    w_down = torch.linalg.solve_triangular(lo.T, v, upper=True).T  # V_r^T L^-1
    share = float(evals[order[:rank]].sum() / evals.sum())
    return w_down.contiguous(), (lo @ v).contiguous(), share


def read_ranker(path, head_rows: int, hidden_size: int, rank: int, where: str) -> dict:
    """A trained ranker file's tensors, their shapes checked against a draft head of ``head_rows`` rows of
    ``hidden_size`` and the config's ``rank`` (the server's argument resolution runs this before any weights load).

    A whitened file (``w_proj``) of a higher rank serves a lower one: its directions are stored most important
    first, and the leading ``rank`` of them are exactly the rank-``rank`` fit (``whitened_ranker``), so one file
    lets a config trade fidelity for the ranker's reads without a refit."""
    data = load_trained(path, ("w_down",), "ranker", "train-ranker", where, optional=("w_vocab", "w_proj"))
    if ("w_vocab" in data) == ("w_proj" in data):
        raise ConfigError(f"{where}: ranker file {path} must hold exactly one of w_vocab and w_proj (train-ranker)")
    down, proj = data["w_down"], data.get("w_proj")
    # only a consistent file is cut; any other shape is for the check below to name
    if proj is not None and down.ndim == proj.ndim == 2 and rank < len(down) == proj.shape[1]:
        data = {**data, "w_down": down[:rank], "w_proj": proj[:, :rank]}
    want = {"w_down": (rank, hidden_size), "w_vocab": (head_rows, rank), "w_proj": (hidden_size, rank)}
    for name in ("w_down", "w_vocab", "w_proj"):
        if name in data and tuple(data[name].shape) != want[name]:
            raise ConfigError(
                f"{where}: ranker file {path}: {name} has shape {tuple(data[name].shape)}, the model and rank = "
                f"{rank} need {want[name]}"
                + (" (a whitened file serves its rank or lower)" if "w_proj" in data else "")
            )
    return data


def load_ranker(path, weight: torch.Tensor, rank: int, where: str) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """A trained ranker file, checked against the model and the config: (w_down, w_vocab, what it was fit on).
    A whitened file's ``w_vocab`` is the head ``weight`` times its ``w_proj``."""
    data = read_ranker(path, weight.shape[0], weight.shape[1], rank, where)
    w_vocab = data["w_vocab"] if "w_vocab" in data else head_times(weight, data["w_proj"])
    return data["w_down"], w_vocab, data["recording"]


def head_times(weight: torch.Tensor, proj: torch.Tensor, block_rows: int = 16384) -> torch.Tensor:
    """``weight @ proj`` in fp64 on the head's device, ``block_rows`` head rows at a time: an fp64 copy of the
    whole head (8 bytes per entry of ``[V, d]``, 1.3 GB for Gemma-3's) would land on a server's GPU at start-up,
    after SGLang has sized its memory pools."""
    proj = proj.to(weight.device, torch.float64)
    out = torch.empty(weight.shape[0], proj.shape[1], dtype=torch.float64, device=weight.device)
    for i in range(0, weight.shape[0], block_rows):
        out[i : i + block_rows] = weight[i : i + block_rows].detach().double() @ proj
    return out


class LowRankPolicy(Policy):
    name = "lowrank"
    stepwise = True

    def __init__(self, config: LowRankConfig, table: CandidateTable, model: ModelContext | None = None) -> None:
        super().__init__(config, table, model)
        weight = self.require("weight")  # the whole head: every rank ranks every row, no collective per step
        rows, hidden = weight.shape
        c = config.lowrank
        if c.rank > hidden:
            raise ConfigError(
                f"{config.source}: lowrank.rank = {c.rank} is invalid: must be at most the hidden size {hidden}"
            )
        if c.topk > rows:
            raise ConfigError(
                f"{config.source}: lowrank.topk = {c.topk} is invalid: must be at most the draft head's {rows} rows"
            )
        if c.ranker == "svd":
            key = weights_key(weight, rank=c.rank)
            data = cached(
                "lowrank-svd",
                key,
                lambda: dict(zip(("w_down", "w_vocab"), svd_ranker(weight, c.rank), strict=True)),
                self.model.cache_dir,
            )
            w_down, w_vocab = data["w_down"], data["w_vocab"]
        else:
            path = config.resolve(c.ranker)
            w_down, w_vocab, recording = load_ranker(path, weight, c.rank, config.source)
            self.trained = {"what": "ranker", "file": str(path), "recording": recording}
        self.w_down = w_down.to(table.device, weight.dtype)
        self.w_vocab = w_vocab.to(table.device, weight.dtype)
        self.topk = c.topk
        # the ranker ranks head rows; a d2t draft's row j is the target id head_ids[j]
        ids = None if self.model.space is None else self.model.space.head_ids
        self.row_ids = None if ids is None else ids.to(table.device, torch.long)

    def selection_reads(self) -> int:
        return self.w_down.numel() + self.w_vocab.numel()  # [rank, d] then [V, rank] per step

    def scores(self, hidden: torch.Tensor) -> torch.Tensor:
        """Approximate logits ``[..., V]`` of hidden states ``[..., d]``."""
        return (hidden.to(self.w_down.dtype) @ self.w_down.T) @ self.w_vocab.T

    def select(self, rows: torch.Tensor, step: int, hidden: torch.Tensor, tokens: torch.Tensor) -> None:
        best = self.scores(hidden).amax(dim=1).topk(self.topk, dim=-1).indices
        self.table.assign(rows, best if self.row_ids is None else self.row_ids[best])
