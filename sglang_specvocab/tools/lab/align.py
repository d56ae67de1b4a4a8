"""EvoSpec's online alignment: LoRA on the draft's q and v projections, fitted while serving.

After every verify round the draft is distilled towards the target on the round's verified
positions: per position, KL(target || draft) weighted by the target's confidence (its top
probability), one optimiser step per round. Only the LoRA factors train; the draft's own
weights, which a self-draft shares with the target, never change, so the target (and the
output) stays exactly the same. Opt-in with an ``align:`` block in a policy config; this is
the reference decoder's implementation.
"""

from __future__ import annotations

import copy

import torch

from ...policies.retrieval import AlignSection


class LoRALinear(torch.nn.Module):
    """``base(x) + (alpha / rank) * x A^T B^T``; B starts at zero, so the draft starts unchanged."""

    def __init__(self, base: torch.nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        self.base = base
        w = base.weight
        self.a = torch.nn.Parameter(torch.randn(rank, w.shape[1], dtype=w.dtype) / w.shape[1] ** 0.5)
        self.b = torch.nn.Parameter(torch.zeros(w.shape[0], rank, dtype=w.dtype))
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.a.T @ self.b.T) * self.scale


def _private(module: torch.nn.Module) -> torch.nn.Module:
    """A shallow copy whose child modules can be replaced without touching the original."""
    out = copy.copy(module)
    out._modules = dict(module._modules)
    return out


class OnlineLoRA:
    """A LoRA'd private copy of a draft (``.draft``) and its per-round update (``update``)."""

    def __init__(self, draft, config: AlignSection, seed: int = 0) -> None:
        torch.manual_seed(seed)
        for p in draft.model.parameters():  # only LoRA factors get gradients
            p.requires_grad_(False)
        body = _private(draft.body)
        layers = torch.nn.ModuleList(list(body.layers))
        params = []
        for i in range(draft.num_layers):
            layer = _private(layers[i])
            attn = _private(layer.self_attn)
            for name in ("q_proj", "v_proj"):
                lora = LoRALinear(getattr(attn, name), config.rank, config.alpha)
                setattr(attn, name, lora)
                params += [lora.a, lora.b]
            layer.self_attn = attn
            layers[i] = layer
        body.layers = layers
        self.draft = copy.copy(draft)
        self.draft.body = body
        self.optimizer = torch.optim.Adam(params, lr=config.lr)
        self.losses: list[float] = []

    def update(self, cache, root: int, accepted: list[int], target_logits: torch.Tensor) -> None:
        """One distillation step on the round's verified positions; ``cache`` ends where it started.

        ``cache`` holds the draft's context through ``root``; ``target_logits[j]`` is the target's
        distribution after ``[root] + accepted[:j]``.
        """
        d = self.draft
        cache.crop(-1)  # the root is recomputed with gradients
        with torch.enable_grad():
            ids = torch.tensor([[root, *accepted]])
            hidden = d.body(input_ids=ids, past_key_values=cache, use_cache=True).last_hidden_state[0]
            logits = hidden @ d.weight.T
            if d.softcap:
                logits = torch.tanh(logits / d.softcap) * d.softcap
            teacher = torch.log_softmax(target_logits[: ids.shape[1]].to(logits.dtype), dim=-1)
            student = torch.log_softmax(logits, dim=-1)
            kl = (teacher.exp() * (teacher - student)).sum(-1)
            weight = teacher.exp().amax(-1)  # the target's confidence
            loss = (weight * kl).sum() / weight.sum()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
        self.losses.append(float(loss.detach()))
        cache.crop(-ids.shape[1])
        for layer in cache.layers:  # the kept prefix must not carry this step's graph
            layer.keys, layer.values = layer.keys.detach(), layer.values.detach()
        d.hidden(ids[:, :1], cache)  # the root again, under the updated draft
