"""The EAGLE-3 draft as the pinned SGLang's ``LlamaForCausalLMEagle3`` computes it, and what it reads of the target.

- **Model.** One Llama decoder layer (``num_hidden_layers: 1``) whose attention input is
  ``cat([input_layernorm(embed(token)), hidden_norm(h)])`` (``2*hidden`` wide); ``h`` is
  ``fc(cat(aux_0, aux_1, aux_2))`` on the first draft step (``fc``: ``3*target_hidden -> hidden``,
  no bias) and the draft's own previous *pre-norm* output on later steps (SGLang skips ``fc`` when
  ``hidden.shape[-1] == embed.shape[-1]``). Residual: ``h`` itself; then
  ``post_attention_layernorm`` (fused add), SiLU MLP, final ``norm`` (fused add) and ``lm_head``.
  The draft shares the target's embedding (SGLang's EAGLE-3 worker hands it over when
  ``target_hidden_size == hidden_size``) and, with ``draft_vocab_size: null``, its LM head.
- **Captured target layers.** With no ``eagle_config`` the target captures
  ``[2, n // 2, n - 3]``; with ``eagle_config.eagle_aux_hidden_state_layer_ids`` it is
  ``[i + 1 for i in ids]``. "Capture layer ``l``" means the hidden state entering layer ``l``,
  appended in layer order. Llama-style models capture the residual stream entering layer ``l``
  (Hugging Face's ``hidden_states[l]``); SGLang's Gemma-3 carries the residual separately and
  appends the previous layer's MLP branch after ``post_feedforward_layernorm`` (the scaled
  embedding for ``l == 0``). :class:`TargetTap` reproduces both, so the draft trains on the
  features it will be served.
- **Training-time test** (:func:`ttt_forward`): the draft unrolled over a whole sequence with the
  attention each draft step has in SGLang's draft loop.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import SpecVocabError

SGLANG_ARCHITECTURE = "LlamaForCausalLMEagle3"
HEAD_MODES = ("full", "d2t")


# --- which target layers, and what of them ---------------------------------------------------------


def sglang_default_capture_layers(num_layers: int) -> list[int]:
    """SGLang's default EAGLE-3 capture layers for a target of ``num_layers`` decoder layers."""
    return check_capture_layers([2, num_layers // 2, num_layers - 3], num_layers)


def check_capture_layers(layers: Sequence[int], num_layers: int) -> list[int]:
    """``layers`` sorted, checked to be distinct and inside the target (SGLang captures each layer
    once, in layer order, so duplicates would feed the draft fewer states than its ``fc`` expects)."""
    out = sorted(int(x) for x in layers)
    if len(set(out)) != len(out) or not out or out[0] < 0 or out[-1] >= num_layers:
        raise SpecVocabError(
            f"EAGLE-3 capture layers {list(layers)} are invalid for a {num_layers}-layer target: they must be "
            f"distinct and in [0, {num_layers - 1}] (SGLang's default [2, n//2, n-3] needs at least 7 layers; "
            "pass eagle_aux_hidden_state_layer_ids explicitly for smaller targets)"
        )
    return out


def capture_layers_from_ids(ids: Sequence[int], num_layers: int) -> list[int]:
    """Capture layers for a config's ``eagle_aux_hidden_state_layer_ids`` (SGLang adds 1)."""
    return check_capture_layers([int(i) + 1 for i in ids], num_layers)


def _decoder_layers(model) -> nn.ModuleList:
    layers = getattr(model.get_decoder(), "layers", None)
    if layers is None:
        raise SpecVocabError(f"{type(model).__name__}: cannot find its decoder layers (model.get_decoder().layers)")
    return layers


def capture_style(model) -> str:
    """``'gemma3'`` (SGLang's Gemma-3 captures the MLP branch) or ``'stream'`` (the residual stream)."""
    model_type = getattr(model.config, "model_type", "") or ""
    return "gemma3" if model_type.startswith("gemma3") else "stream"


class TargetTap:
    """Runs the target and returns what SGLang would hand the draft: the aux hidden states
    ``[B, T, k * hidden]`` (the capture layers in layer order) and the logits ``[B, T, V]``."""

    def __init__(self, model, capture_layers: Sequence[int], style: str | None = None) -> None:
        self.model = model
        self.layers = check_capture_layers(capture_layers, model.config.num_hidden_layers)
        self.style = style or capture_style(model)
        if self.style not in ("gemma3", "stream"):
            raise SpecVocabError(f"capture style {self.style!r} is invalid: 'gemma3' or 'stream'")
        if self.style == "gemma3":
            decoder = _decoder_layers(model)
            if any(not hasattr(decoder[i - 1], "post_feedforward_layernorm") for i in self.layers if i > 0):
                raise SpecVocabError("gemma3 capture style needs layers with post_feedforward_layernorm")

    @contextmanager
    def capturing(self):
        """Inside: run the target (or its decoder) with ``output_hidden_states=True``; the yielded
        function turns that call's ``hidden_states`` into the aux features ``[B, T, k * hidden]``."""
        grabbed: dict[int, torch.Tensor] = {}
        handles = []
        if self.style == "gemma3":
            decoder = _decoder_layers(self.model)
            for i in self.layers:
                if i > 0:  # entering layer i in SGLang = layer i-1's post-FFN-norm MLP output
                    handles.append(
                        decoder[i - 1].post_feedforward_layernorm.register_forward_hook(
                            lambda _m, _a, out, i=i: grabbed.__setitem__(i, out)
                        )
                    )

        def collect(hidden_states) -> torch.Tensor:
            # hidden_states[i] is the residual stream entering layer i (index 0: the embedding output).
            return torch.cat([grabbed[i] if i in grabbed else hidden_states[i] for i in self.layers], dim=-1)

        try:
            yield collect
        finally:
            for h in handles:
                h.remove()

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        with self.capturing() as collect:
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
            return collect(out.hidden_states), out.logits

    @torch.no_grad()
    def states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        """(aux features, the final normed hidden states ``[B, T, hidden]``) without the LM head."""
        with self.capturing() as collect:
            out = self.model.get_decoder()(
                input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True
            )
            return collect(out.hidden_states), out.last_hidden_state


# --- the draft model ---------------------------------------------------------------------------------


@dataclass
class Eagle3Config:
    """The draft's shape; :meth:`to_hf_config` writes it the way SGLang reads it."""

    vocab_size: int  # target vocabulary (the embedding SGLang shares with the draft)
    hidden_size: int
    target_hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    capture_layers: list[int]  # SGLang's layers_to_capture (the config stores them minus 1)
    draft_vocab_size: int | None = None  # None: the target's LM head (head mode 'full')
    fc_norm: bool = False  # an RMSNorm per captured layer before fc (SGLang's config ``fc_norm: true``)
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None

    @property
    def head(self) -> str:
        return "full" if self.draft_vocab_size is None else "d2t"

    @classmethod
    def for_target(
        cls, target, *, draft_vocab_size: int | None = None, capture_layers=None, fc_norm: bool = False
    ) -> Eagle3Config:
        """A draft as wide as the target (needed for SGLang to share the target's embedding)."""
        c = target.config
        hidden = c.hidden_size
        heads = c.num_attention_heads
        vocab = target.get_input_embeddings().weight.shape[0]
        if draft_vocab_size is not None and not 1 <= draft_vocab_size < vocab:
            raise SpecVocabError(
                f"draft vocabulary size {draft_vocab_size} is invalid: must be in [1, {vocab - 1}] "
                f"(the target has {vocab} tokens; use --head full for the whole vocabulary)"
            )
        layers = (
            sglang_default_capture_layers(c.num_hidden_layers)
            if capture_layers is None
            else check_capture_layers(capture_layers, c.num_hidden_layers)
        )
        return cls(
            vocab_size=vocab,
            hidden_size=hidden,
            target_hidden_size=hidden,
            intermediate_size=c.intermediate_size,
            num_attention_heads=heads,
            num_key_value_heads=getattr(c, "num_key_value_heads", None) or heads,
            head_dim=getattr(c, "head_dim", None) or hidden // heads,
            rms_norm_eps=float(getattr(c, "rms_norm_eps", 1e-6)),
            rope_theta=_rope_theta(c),
            max_position_embeddings=int(getattr(c, "max_position_embeddings", 8192)),
            capture_layers=layers,
            draft_vocab_size=draft_vocab_size,
            fc_norm=fc_norm,
            bos_token_id=getattr(c, "bos_token_id", None),
            eos_token_id=getattr(c, "eos_token_id", None),
            pad_token_id=getattr(c, "pad_token_id", None),
        )

    def to_hf_config(self, dtype: torch.dtype = torch.bfloat16) -> dict:
        from transformers import LlamaConfig  # heavy: transformers

        cfg = LlamaConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=1,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            hidden_act="silu",
            max_position_embeddings=self.max_position_embeddings,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            tie_word_embeddings=False,  # True would make lm_head the draft's own embedding
            bos_token_id=self.bos_token_id,
            eos_token_id=self.eos_token_id,
            pad_token_id=self.pad_token_id,
        ).to_dict()
        cfg["architectures"] = [SGLANG_ARCHITECTURE]
        cfg["dtype"] = str(dtype).removeprefix("torch.")
        cfg["draft_vocab_size"] = self.draft_vocab_size  # null: SGLang shares the target's LM head
        cfg["target_hidden_size"] = self.target_hidden_size
        if self.fc_norm:  # SGLang reads it from the top level; a draft without it loads no fc_norm weights
            cfg["fc_norm"] = True
        cfg["eagle_config"] = {
            "use_aux_hidden_state": True,
            "eagle_aux_hidden_state_layer_ids": [i - 1 for i in self.capture_layers],
        }
        return cfg


def _rope_theta(config) -> float:
    """The target's RoPE base (its global-attention one when it has several), else 10000."""
    params = getattr(config, "rope_parameters", None) or {}
    if isinstance(params, dict):
        if "full_attention" in params and isinstance(params["full_attention"], dict):
            params = params["full_attention"]
        if params.get("rope_theta") is not None:
            return float(params["rope_theta"])
    return float(getattr(config, "rope_theta", None) or 10000.0)


class RMSNorm(nn.Module):
    """SGLang's ``RMSNorm.forward_native``: fp32 ``x * rsqrt(mean(x^2) + eps) * weight``."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


class _Attention(nn.Module):
    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        d_in = 2 * cfg.hidden_size  # cat(embedding, hidden)
        self.q_proj = nn.Linear(d_in, cfg.num_attention_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(d_in, cfg.num_key_value_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(d_in, cfg.num_key_value_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size, bias=False)


class _MLP(nn.Module):
    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _MidLayer(nn.Module):
    """SGLang's ``layers.0`` (checkpoint name ``midlayer``)."""

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.self_attn = _Attention(cfg)
        self.mlp = _MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


def _rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style RoPE (SGLang's Llama default, ``rope_is_neox_style=True``) of ``x [B, h, T, d]``
    at ``positions [T]``, computed in fp32 like SGLang's cos/sin cache."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    cos, sin = freqs.cos(), freqs.sin()
    x1, x2 = x.float()[..., : d // 2], x.float()[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class Eagle3Draft(nn.Module):
    """The trainable draft. Parameter names are the checkpoint's (``fc``, ``midlayer.*``, ``norm``,
    ``lm_head``); the target's embedding (and, in head mode 'full', its LM head) are frozen buffers
    that are not saved, because SGLang binds the target's own tensors at load time."""

    def __init__(
        self,
        cfg: Eagle3Config,
        embedding: torch.Tensor,
        head: torch.Tensor,
        hot_ids: torch.Tensor | None = None,
    ) -> None:
        """``head``: the target's LM head ``[V, hidden]``; in 'd2t' mode its ``hot_ids`` rows
        initialise the trainable ``lm_head``. The norms start at 1 (the target's final-norm scale,
        up to 300 for Gemma-3, makes a random draft's first distributions so sharp that the KL
        starts near 200 and stays ten times higher after 20 steps, for no better top-1)."""
        super().__init__()
        if (hot_ids is None) != (cfg.draft_vocab_size is None):
            raise ValueError("hot_ids must be given exactly when the config has a draft vocabulary")
        self.cfg = cfg
        self.fc = nn.Linear(len(cfg.capture_layers) * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        # SGLang's fc_norm: each captured layer's features normed on their own (their scales differ by layer)
        self.fc_norm = (
            nn.ModuleList(RMSNorm(cfg.target_hidden_size, cfg.rms_norm_eps) for _ in cfg.capture_layers)
            if cfg.fc_norm
            else None
        )
        self.midlayer = _MidLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self._init_weights()
        # Frozen and never written: an fp32 target's tensors are shared, not copied.
        self.register_buffer("embed_tokens", embedding.detach().float(), persistent=False)
        if hot_ids is None:
            self.lm_head = None
            self.register_buffer("target_head", head.detach().float(), persistent=False)
            self.register_buffer("hot_ids", None, persistent=False)
        else:
            hot_ids = hot_ids.to(torch.int64)
            if hot_ids.ndim != 1 or len(hot_ids) != cfg.draft_vocab_size or len(hot_ids.unique()) != len(hot_ids):
                raise ValueError(f"hot_ids must be {cfg.draft_vocab_size} distinct target ids")
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
            with torch.no_grad():
                self.lm_head.weight.copy_(head.detach().float()[hot_ids])
            self.register_buffer("target_head", None, persistent=False)
            self.register_buffer("hot_ids", hot_ids.clone(), persistent=False)

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)

    def project(self, aux: torch.Tensor) -> torch.Tensor:
        """``fc`` of the target's captured features ``[..., k * target_hidden]`` (each layer's normed first with
        ``fc_norm``), as SGLang's ``LlamaModel.forward`` of the EAGLE-3 draft does on draft extend."""
        if self.fc_norm is not None:
            chunks = aux.chunk(len(self.fc_norm), dim=-1)
            aux = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks, strict=True)], dim=-1)
        return self.fc(aux)

    @property
    def head_weight(self) -> torch.Tensor:
        """``[draft vocab, hidden]``: the trained head, or the target's (frozen) one."""
        return self.target_head if self.lm_head is None else self.lm_head.weight

    def layer(self, tokens, hidden, positions, cache: list[tuple[torch.Tensor, torch.Tensor]], *, diagonal: bool):
        """One draft forward (SGLang's ``LlamaDecoderLayer`` as the input layer, then the final norm).

        ``tokens [B, T]``, ``hidden [B, T, hidden]``; returns (pre-norm output, normed output).
        The new keys/values are appended to ``cache``. Attention: with ``diagonal=False`` the
        queries attend causally to their own keys (one forward over a sequence, and ``cache``
        must be empty); with ``diagonal=True`` row ``i`` attends to ``cache[0]``'s rows ``<= i``,
        then to row ``i`` of every later cache entry and of its own keys (see :func:`ttt_forward`).
        """
        if not diagonal and cache:
            raise ValueError("a causal (first) draft pass starts with an empty cache")
        q, k, v = self._qkv(tokens, hidden, positions)
        cache.append((k, v))
        return self._finish(_attend(q, cache, self.cfg.head_dim**-0.5), hidden)

    def _qkv(self, tokens, hidden, positions):
        """Rotated queries ``[B, h, T, d]`` and keys, and values, of ``cat(embed(tokens), hidden)``."""
        cfg = self.cfg
        ml = self.midlayer
        attn = ml.self_attn
        x = torch.cat([ml.input_layernorm(self.embed_tokens[tokens].to(hidden.dtype)), ml.hidden_norm(hidden)], -1)
        b, t, _ = x.shape
        q = attn.q_proj(x).view(b, t, cfg.num_attention_heads, cfg.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(b, t, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(b, t, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
        return (_rotate(q, positions, cfg.rope_theta), _rotate(k, positions, cfg.rope_theta), v)

    def _finish(self, o: torch.Tensor, residual: torch.Tensor):
        """(pre-norm output, normed output) from the attention output ``o [B, h, T, d]``."""
        ml = self.midlayer
        b, _, t, _ = o.shape
        o = ml.self_attn.o_proj(o.transpose(1, 2).reshape(b, t, -1))
        residual = o + residual  # post_attention_layernorm(o, residual): fused add, then norm
        m = ml.mlp(ml.post_attention_layernorm(residual))
        out = m + residual  # the final norm's fused add: SGLang feeds this (pre-norm) to the next step
        return out, self.norm(out)

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, cache):
        """Inference, as SGLang's draft runs: ``tokens [B, n]`` at ``positions [n]`` after the ones in
        ``cache`` (a Hugging Face ``DynamicCache``, layer 0), attending causally to everything
        before. ``hidden [B, n, .]`` is the target's captured features (``fc`` applies, as in
        draft extend) or the draft's own previous pre-norm output (draft decode steps).
        Returns (pre-norm output, normed output), ``[B, n, hidden]`` each."""
        if hidden.shape[-1] != self.cfg.hidden_size:
            hidden = self.project(hidden)
        q, k, v = self._qkv(tokens, hidden, positions)
        k, v = cache.update(k, v, 0)
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        n, total = q.shape[2], k.shape[2]
        visible = (
            torch.arange(total, device=q.device)[None, :] <= torch.arange(total - n, total, device=q.device)[:, None]
        )
        scores = (q @ k.transpose(-1, -2)) * self.cfg.head_dim**-0.5
        p = torch.softmax(scores.masked_fill(~visible, float("-inf")).float(), dim=-1).to(v.dtype)
        return self._finish(p @ v, hidden)

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        return normed @ self.head_weight.to(normed.dtype).T

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids if self.hot_ids is None else self.hot_ids[draft_ids]

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        """Tensors of ``model.safetensors`` under SGLang's checkpoint names (``d2t``/``t2d`` included)."""
        out = {name: p.detach() for name, p in self.named_parameters()}
        if self.hot_ids is not None:
            out["d2t"] = self.hot_ids - torch.arange(len(self.hot_ids), device=self.hot_ids.device)
            t2d = torch.zeros(self.cfg.vocab_size, dtype=torch.bool, device=self.hot_ids.device)
            out["t2d"] = t2d.index_fill_(0, self.hot_ids, True)
        return out


def _attend(q: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]], scale: float) -> torch.Tensor:
    """Attention of ``q [B, h, T, d]`` over the training-time-test cache (see :func:`ttt_forward`).

    Grouped-query heads are handled by grouping the queries of one key head (``[B, g, r, T, d]``)
    rather than repeating keys, and row ``i``'s keys of the later passes by batched contractions
    over ``(B, g, T)``: this is most of the cost of a deep unroll."""
    b, h, t, d = q.shape
    g = cache[0][0].shape[1]  # key heads; query head j uses key head j // (h // g)
    qg = q.view(b, g, h // g, t, d)
    k0, v0 = cache[0]
    scores = torch.einsum("bgrtd,bgsd->bgrts", qg, k0) * scale  # [B, g, r, T, T]
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    if len(cache) == 1:
        p = torch.softmax(scores.float(), dim=-1).to(v0.dtype)
        return torch.einsum("bgrts,bgsd->bgrtd", p, v0).reshape(b, h, t, d)
    ks = torch.stack([k for k, _ in cache[1:]], dim=3)  # [B, g, T, s, d]
    vs = torch.stack([v for _, v in cache[1:]], dim=3)
    diag = torch.einsum("bgrtd,bgtsd->bgrts", qg, ks) * scale  # row i with row i of each later pass
    p = torch.softmax(torch.cat([scores, diag], dim=-1).float(), dim=-1).to(v0.dtype)
    out = torch.einsum("bgrts,bgsd->bgrtd", p[..., :t], v0) + torch.einsum("bgrts,bgtsd->bgrtd", p[..., t:], vs)
    return out.reshape(b, h, t, d)


def shift_left(x: torch.Tensor, n: int, fill: int = 0) -> torch.Tensor:
    """``x[:, i + n]`` at column ``i`` (``fill`` past the end)."""
    if n == 0:
        return x
    return torch.cat([x[:, n:], x.new_full((x.shape[0], min(n, x.shape[1])), fill)], dim=1)[:, : x.shape[1]]


def ttt_forward(draft: Eagle3Draft, input_ids: torch.Tensor, aux: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """EAGLE-3's training-time test: ``steps`` unrolled draft passes over a whole sequence.

    Returns the normed draft output of every pass, ``[B, T, hidden]`` each. Row ``i`` of pass
    ``k`` is what SGLang computes at draft step ``k`` of a chain that starts after position
    ``i`` (the last verified token is ``x[i+1]``):

    - pass 0 is the draft-extend pass: position ``i``, token ``x[i+1]``, hidden
      ``fc(aux[i])`` (the target's features at ``i``), plain causal attention;
    - pass ``k >= 1`` is draft step ``k``: position ``i + k``, token ``x[i+k+1]`` (the token
      the chain proposed, which equals the data's when the chain is still right; with
      self-distilled data that is the target's own greedy token), hidden = row ``i`` of pass
      ``k-1``'s pre-norm output (the draft's own hidden, fed back as in SGLang's draft loop).
      Its KV cache in SGLang holds the draft-extend keys of positions ``0..i`` (written with
      the target's features) and the keys of steps ``1..k-1`` of the same chain: so row ``i``
      attends to pass 0's rows ``<= i`` and to row ``i`` of passes ``1..k``.

    Every pass's output at row ``i`` predicts the token at ``i + k + 2``: its teacher is the
    target's distribution at position ``i + k + 1`` (see :func:`ttt_loss`).
    """
    if steps < 1:
        raise SpecVocabError(f"ttt steps = {steps} is invalid: must be at least 1")
    positions = torch.arange(input_ids.shape[1], device=input_ids.device)
    hidden = draft.project(aux)
    cache: list[tuple[torch.Tensor, torch.Tensor]] = []
    outs = []
    for k in range(steps):
        hidden, normed = draft.layer(shift_left(input_ids, k + 1), hidden, positions + k, cache, diagonal=k > 0)
        outs.append(normed)
    return outs


def build_draft(target, cfg: Eagle3Config, hot_ids: torch.Tensor | None = None, seed: int = 0) -> Eagle3Draft:
    """A fresh draft for ``target``: random layer weights, the target's embedding and head rows."""
    torch.manual_seed(seed)
    head = target.get_output_embeddings().weight
    return Eagle3Draft(cfg, target.get_input_embeddings().weight, head, hot_ids)


@torch.no_grad()
def init_from_target(draft: Eagle3Draft, target) -> None:
    """The draft's final norm takes the target's final-norm scale (whatever its parametrisation,
    e.g. Gemma's ``1 + weight``), so the draft's logits start at the target's temperature."""
    norm = getattr(target.get_decoder(), "norm", None)
    if norm is None:
        raise SpecVocabError(f"{type(target).__name__}: no final norm (model.get_decoder().norm) to start from")
    ones = torch.ones(1, draft.cfg.hidden_size, dtype=next(norm.parameters()).dtype, device=draft.norm.weight.device)
    eps = float(getattr(norm, "eps", None) or getattr(norm, "variance_epsilon", 0.0) or 0.0)
    draft.norm.weight.copy_(norm(ones)[0].float() * math.sqrt(1.0 + eps))
