"""``cluster``: DynaSpec, a router picks clusters of token ids for each draft step.

Offline, the normalised LM-head rows are partitioned by spherical k-means (faiss), cached on
disk per weights and settings. Within a cluster, ids are kept most-central first. The rows are the whole
head's on every tensor-parallel rank (``ModelContext.head_weight``), a d2t draft's mapped to their target ids.

Per draft step t a request's set is the union of its ``budget(t)`` best-scoring clusters, in
score order, cut at ``capacity`` ids (the last cluster may be cut: its most central ids stay):
position-aware budget ``k0`` for the first draft token (t = 0), ``k1`` for the second, and
``max(1, floor((k1 + t) / (2 t)))`` after. Clusters partition the vocabulary, so the union
has no repeats. A request's rows (beams) share one set, chosen by the maximum of their scores.

Router, ``router:``
- ``centroid`` (training-free, beyond the paper): score = draft hidden state . cluster centroid;
- a path: the paper's two-layer MLP on [embedding of the input token, draft hidden state],
  trained by ``sglang-specvocab train-router`` (multi-label BCE, positives = the clusters holding the
  draft's top-L tokens).
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from pydantic import Field, model_validator

from ..cache import cached, weights_key
from ..config import PolicyConfig, Section
from ..errors import ConfigError, SpecVocabError
from ..table import CandidateTable
from .base import ModelContext, Policy, load_trained


class ClusterSection(Section):
    clusters: int = Field(ge=2, description="number of k-means clusters of the vocabulary")
    budget: list[int] = Field(min_length=2, max_length=2, description="[k0, k1]: clusters for draft tokens 1 and 2")
    router: str = Field(
        "centroid", description="'centroid' (training-free) or a router file from sglang-specvocab train-router"
    )
    iterations: int = Field(20, ge=1, description="k-means iterations")
    seed: int = Field(0, ge=0, description="k-means seed")

    @model_validator(mode="after")
    def _budget(self) -> ClusterSection:
        for name, k in zip(("k0", "k1"), self.budget, strict=True):
            if not 1 <= k <= self.clusters:
                raise ValueError(f"cluster.budget {name} = {k} is invalid: must be in [1, clusters = {self.clusters}]")
        return self


class ClusterConfig(PolicyConfig):
    policy: Literal["cluster"]
    capacity: int = Field(ge=1, description="the most ids in a request's set")
    cluster: ClusterSection

    file_keys: ClassVar[tuple] = (("cluster", "router", "centroid", "train-router"),)


def step_budget(k0: int, k1: int, step: int) -> int:
    """Clusters chosen at draft step ``step`` (0-based): DynaSpec's position-aware budget."""
    if step == 0:
        return k0
    if step == 1:
        return k1
    return max(1, (k1 + step) // (2 * step))


def spherical_kmeans(weight: torch.Tensor, clusters: int, iterations: int, seed: int) -> dict[str, torch.Tensor]:
    """Clusters of the normalised rows of ``weight[V, d]``: ``perm`` (ids grouped by cluster,
    most central first), ``offsets[C + 1]`` (cluster c is ``perm[offsets[c]:offsets[c+1]]``) and
    unit ``centroids[C, d]``."""
    try:
        import faiss  # optional and heavy: only when the clusters are built (not when cached)
    except ImportError as exc:
        raise SpecVocabError(
            "policy 'cluster' builds its clusters of LM-head rows with faiss, which is not installed: "
            "pip install 'sglang-specvocab[cluster]'"
        ) from exc

    x = torch.nn.functional.normalize(weight.detach().float().cpu(), dim=1).numpy()
    km = faiss.Kmeans(
        x.shape[1],
        clusters,
        niter=iterations,
        seed=seed,
        spherical=True,
        verbose=False,
        max_points_per_centroid=max(256, -(-x.shape[0] // clusters)),
    )
    km.train(x)
    sim, assign = km.index.search(x, 1)
    assign = torch.from_numpy(assign[:, 0]).long()
    sim = torch.from_numpy(sim[:, 0]).double()
    # Group by cluster, most central (highest cosine to the centroid) first, ties by id.
    key = assign.double() * 4.0 - sim  # cosine is in [-1, 1], so clusters never interleave
    perm = torch.sort(key, stable=True).indices  # stable: equal keys stay in id order
    counts = torch.bincount(assign, minlength=clusters)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
    centroids = torch.nn.functional.normalize(torch.from_numpy(km.centroids).float(), dim=1)
    return {"perm": perm, "offsets": offsets, "centroids": centroids}


class Router(torch.nn.Module):
    """DynaSpec's router: a two-layer MLP on [token embedding, draft hidden state] -> cluster logits."""

    def __init__(self, hidden_size: int, width: int, clusters: int) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(2 * hidden_size, width)
        self.fc2 = torch.nn.Linear(width, clusters)

    def forward(self, embedded: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.silu(self.fc1(torch.cat([embedded, hidden], dim=-1))))


def load_router(path, hidden_size: int, clusters_key: str, where: str) -> tuple[Router, dict | None]:
    """A trained router file, checked against the clusters: (the router, what it was fit on)."""
    data = load_trained(path, ("state", "clusters_key", "width", "clusters"), "router", "train-router", where)
    state, key, width, n = data["state"], data["clusters_key"], data["width"], data["clusters"]
    if key != clusters_key:
        raise ConfigError(
            f"{where}: router file {path} was trained for other clusters (another model or other "
            "clusters/iterations/seed); retrain it with sglang-specvocab train-router"
        )
    router = Router(hidden_size, width, n)
    router.load_state_dict(state)
    return router.eval(), data["recording"]


class ClusterPolicy(Policy):
    name = "cluster"
    stepwise = True

    def __init__(self, config: ClusterConfig, table: CandidateTable, model: ModelContext | None = None) -> None:
        super().__init__(config, table, model)
        weight = self.require("weight")
        c = config.cluster
        if c.clusters > weight.shape[0]:
            raise ConfigError(
                f"{config.source}: cluster.clusters = {c.clusters} is invalid: must be at most the draft head's "
                f"{weight.shape[0]} rows"
            )
        self.clusters_key = weights_key(weight, clusters=c.clusters, iterations=c.iterations, seed=c.seed)
        data = cached(
            "clusters",
            self.clusters_key,
            lambda: spherical_kmeans(weight, c.clusters, c.iterations, c.seed),
            self.model.cache_dir,
        )
        dev = table.device
        self.perm = self.model.row_ids(data["perm"]).to(dev)  # head rows -> target ids (a d2t draft's map)
        self.offsets = data["offsets"].to(dev)
        self.centroids = data["centroids"].to(dev)
        self.router = None
        if c.router != "centroid":
            self.embedding = self.require("embedding")
            path = config.resolve(c.router)
            router, recording = load_router(path, weight.shape[1], self.clusters_key, config.source)
            self.router = router.to(dev)
            self.trained = {"what": "router", "file": str(path), "recording": recording}
        self.k0, self.k1 = c.budget
        self.capacity = config.capacity

    def selection_reads(self) -> int:
        if self.router is None:
            return self.centroids.numel()
        return sum(p.numel() for p in self.router.parameters()) + self.embedding.shape[1]  # + the token's embedding

    def scores(self, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Router scores ``[..., C]`` of hidden states ``[..., d]`` and their input tokens ``[...]``."""
        if self.router is None:
            return hidden.float() @ self.centroids.T
        emb = self.embedding[tokens.clamp(min=0)]
        p = self.router.fc1.weight
        with torch.no_grad():
            return self.router(emb.to(p.dtype), hidden.to(p.dtype)).float()

    def select(self, rows: torch.Tensor, step: int, hidden: torch.Tensor, tokens: torch.Tensor) -> None:
        b = step_budget(self.k0, self.k1, step)
        chosen = self.scores(hidden, tokens).amax(dim=1).topk(b, dim=-1).indices  # [B, b], best first
        self.table.assign(rows, self.gather(chosen))

    def gather(self, chosen: torch.Tensor) -> torch.Tensor:
        """The ids of clusters ``chosen[B, b]`` in order, the first ``capacity`` of them, -1 padded."""
        start = self.offsets[chosen]
        size = self.offsets[chosen + 1] - start
        end = size.cumsum(1)
        j = torch.arange(self.capacity, device=chosen.device).expand(chosen.shape[0], -1)
        which = torch.searchsorted(end, j.contiguous(), right=True).clamp(max=chosen.shape[1] - 1)
        pos = start.gather(1, which) + j - (end - size).gather(1, which)
        live = j < end[:, -1:]
        ids = self.perm[torch.where(live, pos, 0)]
        return torch.where(live, ids, -1)
