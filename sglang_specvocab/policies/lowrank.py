"""``lowrank``: SpecVocab, a low-rank ranker on the draft hidden state picks each step's set.

Approximate logits ``(hidden @ W_down.T) @ W_vocab.T`` (``W_down[d', d]``, ``W_vocab[V, d']``)
rank the whole vocabulary; the ``topk`` best ids become the request's set and the head then
computes exact logits over them.

Rows of one request (its beams) share one set: the top-k of the element-wise **maximum** of
their approximate logits. That keeps the set exactly ``topk`` ids wide (no cap, no padding)
and lets an id in that any branch ranks highly enter; a union of per-row top-k would need a
cap and an order to cut it by.

Ranker, ``ranker:``
- ``svd`` (training-free, beyond the paper): the rank-d' truncated SVD of the LM head,
  ``W = U S V^T``: ``W_down = V_r^T``, ``W_vocab = U_r S_r = W V_r``; cached per weights.
- a path: a ranker trained by ``sglang-specvocab train-ranker`` on recorded draft hidden states.
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


def load_ranker(
    path, vocab_size: int, hidden_size: int, rank: int, where: str
) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """A trained ranker file, checked against the model and the config: (w_down, w_vocab, what it was fit on)."""
    data = load_trained(path, ("w_down", "w_vocab"), "ranker", "train-ranker", where)
    w_down, w_vocab = data["w_down"], data["w_vocab"]
    want = {"w_down": (rank, hidden_size), "w_vocab": (vocab_size, rank)}
    for name, t in (("w_down", w_down), ("w_vocab", w_vocab)):
        if tuple(t.shape) != want[name]:
            raise ConfigError(
                f"{where}: ranker file {path}: {name} has shape {tuple(t.shape)}, the model and rank = {rank} "
                f"need {want[name]}"
            )
    return w_down, w_vocab, data["recording"]


class LowRankPolicy(Policy):
    name = "lowrank"
    stepwise = True

    def __init__(self, config: LowRankConfig, table: CandidateTable, model: ModelContext | None = None) -> None:
        super().__init__(config, table, model)
        weight = self.require("weight")
        vocab, hidden = weight.shape
        c = config.lowrank
        if c.rank > hidden:
            raise ConfigError(
                f"{config.source}: lowrank.rank = {c.rank} is invalid: must be at most the hidden size {hidden}"
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
            w_down, w_vocab, recording = load_ranker(path, vocab, hidden, c.rank, config.source)
            self.trained = {"what": "ranker", "file": str(path), "recording": recording}
        self.w_down = w_down.to(table.device, weight.dtype)
        self.w_vocab = w_vocab.to(table.device, weight.dtype)
        self.topk = c.topk

    def scores(self, hidden: torch.Tensor) -> torch.Tensor:
        """Approximate logits ``[..., V]`` of hidden states ``[..., d]``."""
        return (hidden.to(self.w_down.dtype) @ self.w_down.T) @ self.w_vocab.T

    def select(self, rows: torch.Tensor, step: int, hidden: torch.Tensor, tokens: torch.Tensor) -> None:
        best = self.scores(hidden).amax(dim=1).topk(self.topk, dim=-1).indices
        self.table.assign(rows, best)
