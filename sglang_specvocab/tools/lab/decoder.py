"""A small CPU speculative decoder over Hugging Face models, using the same policies and head.

It is the oracle for tests (greedy output must equal target-only greedy decoding, for every
policy) and the engine of the policy lab. Per round:

1. draft: EAGLE-2-style tree from the root (the last committed token): each of ``steps``
   draft passes expands every beam by its ``topk`` best tokens under the draft head (over
   the request's candidate set), keeps the ``topk`` best cumulative log-probabilities as the
   next beams, and the ``draft_tokens - 1`` best nodes overall form the tree (a chain when
   ``topk == 1``);
2. verify: the target scores every root-to-leaf path at once (one batch row per path, on a
   shared KV-cache prefix) and accepts the longest path prefix that equals its own greedy
   choice, plus the bonus token; with ``temperature > 0``, speculative sampling instead
   (``_verify_sampled``): the output is distributed exactly as the target's own sampling;
3. the policy gets the same events as in SGLang: the draft-tree tokens (root first), the
   target's top-K ids at the verified positions, and the committed tokens.

Prefill gives the policy the prompt ids and the target's top-K ids after every prompt
position (computed in chunks from the final hidden states).

``batch`` > 1 decodes that many requests in lockstep over one candidate table (slots 1..B): each
draft step scores every request's rows in one head call, as a server batch does, so the head's
``batch``/``union_view`` modes act as in SGLang; everything else stays per request.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ...config import PolicyConfig
from ...errors import SpecVocabError
from ...head import DraftHead
from ...policies import ModelContext, build_policy
from ...vocab import VocabSpace
from ..train.checkpoint import load_checkpoint
from ..train.model import TargetTap
from .align import OnlineLoRA


class CausalLM:
    """A Hugging Face decoder-only LM as body (ids -> final hidden states, KV cache) + head weight.

    ``num_layers`` makes a layer-truncated self-draft: the model's first ``num_layers``
    decoder layers, its final norm and its LM head, sharing the model's parameters.
    """

    def __init__(self, model, num_layers: int | None = None, name: str | None = None) -> None:
        self.model = model
        body = model.get_decoder()
        total = body.config.num_hidden_layers
        if num_layers is not None:
            if not 1 <= num_layers <= total:
                raise SpecVocabError(f"draft layers = {num_layers} is invalid: must be in [1, {total}]")
            body = copy.copy(body)  # shares every submodule and parameter; only the config differs
            cfg = copy.deepcopy(body.config)
            cfg.num_hidden_layers = num_layers
            if getattr(cfg, "layer_types", None):
                cfg.layer_types = list(cfg.layer_types)[:num_layers]
            body.config = cfg
        self.body = body
        self.num_layers = body.config.num_hidden_layers
        head = model.get_output_embeddings()
        if getattr(head, "bias", None) is not None:
            raise SpecVocabError("LM heads with a bias are not supported")
        self.weight = head.weight
        self.embedding = model.get_input_embeddings().weight
        self.softcap = getattr(model.config, "final_logit_softcapping", None)
        self.vocab_size = self.weight.shape[0]
        self.name = name or type(model).__name__

    def new_cache(self):
        from transformers import DynamicCache  # heavy: transformers

        # Full (non-sliding) layers for every layer, so the cache can be cropped after a
        # rejected draft; sliding-window attention is still applied by the model's masks.
        return DynamicCache()

    @property
    def head_size(self) -> int:
        """Rows of the draft head (the whole vocabulary)."""
        return self.vocab_size

    @torch.no_grad()
    def hidden(self, input_ids: torch.Tensor, cache, tap=None):
        """Final (normed) hidden states ``[B, n, d]`` of ``input_ids[B, n]``, appended to ``cache``;
        with ``tap`` (an EAGLE-3 ``TargetTap`` of this model), also the captured features."""
        if tap is None:
            return self.body(input_ids=input_ids, past_key_values=cache, use_cache=True).last_hidden_state
        with tap.capturing() as collect:
            out = self.body(input_ids=input_ids, past_key_values=cache, use_cache=True, output_hidden_states=True)
            return out.last_hidden_state, collect(out.hidden_states)

    @torch.no_grad()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary logits of final hidden states, in fp32 (fp64 for an fp64 model)."""
        logits = hidden.to(self.weight.dtype) @ self.weight.T
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    @torch.no_grad()
    def topk_ids(self, hidden: torch.Tensor, k: int, chunk: int = 256) -> torch.Tensor:
        """Top-k token ids ``[n, k]`` after each of ``hidden[n, d]``, in chunks (no ``[n, V]`` tensor)."""
        return torch.cat([self.logits(h).topk(k, dim=-1).indices for h in hidden.split(chunk)])


class Eagle3LM:
    """An EAGLE-3 draft (SGLang's ``LlamaForCausalLMEagle3`` checkpoint format) as the decoder drives it.

    Draft extend: the committed positions, each with the next token and the target's captured
    features there; draft steps: the proposed token with the draft's own previous pre-norm
    output. ``weight`` is the head in target-id space: the target's own head for a
    full-vocabulary draft; for a d2t draft its rows at the hot ids and zeros elsewhere, with
    ``in_vocab`` marking the ids it can propose (the others get ``-inf``).
    """

    def __init__(self, module, name: str | None = None) -> None:
        self.module = module.eval()
        cfg = module.cfg
        self.capture_layers = list(cfg.capture_layers)
        self.vocab_size = cfg.vocab_size
        self.embedding = module.embed_tokens
        self.softcap = None  # SGLang's Llama head has no soft-capping
        if module.hot_ids is None:
            self.weight, self.in_vocab = module.target_head, None
            self.head_size = cfg.vocab_size
        else:
            w = module.lm_head.weight.detach()
            self.weight = w.new_zeros(cfg.vocab_size, w.shape[1]).index_copy_(0, module.hot_ids, w)
            self.in_vocab = torch.zeros(cfg.vocab_size, dtype=torch.bool).index_fill_(0, module.hot_ids, True)
            self.head_size = len(module.hot_ids)
        self.name = name or f"EAGLE-3 draft ({cfg.head} head)"

    @classmethod
    def load(cls, path, target_model) -> Eagle3LM:
        return cls(load_checkpoint(path, target_model), name=f"EAGLE-3 draft {path}")

    def new_cache(self):
        from transformers import DynamicCache  # heavy: only for models that keep a KV cache

        return DynamicCache()

    def extend(self, tokens: torch.Tensor, aux: torch.Tensor, cache) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft extend of ``tokens [n]`` with the target's features ``aux [n, k*d]`` of the positions
        before them: (normed, pre-norm) hidden states ``[n, d]``."""
        start = cache.get_seq_length()
        pos = torch.arange(start, start + len(tokens))
        pre, normed = self.module.decode(tokens[None], aux[None].float(), pos, cache)
        return normed[0], pre[0]

    def step(self, tokens: torch.Tensor, pre: torch.Tensor, cache) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step of beams ``tokens [B]`` fed their parents' pre-norm outputs ``pre [B, d]``."""
        pos = torch.tensor([cache.get_seq_length()])
        out, normed = self.module.decode(tokens[:, None], pre[:, None], pos, cache)
        return normed[:, 0], out[:, 0]


def _prompt_tensor(prompt_ids: Sequence[int]) -> torch.Tensor:
    if len(prompt_ids) == 0:
        raise SpecVocabError("prompt is empty: give at least one token (e.g. BOS)")
    return torch.tensor([list(prompt_ids)])


def _trim(cache, length: int) -> None:
    """Drop cache entries past ``length`` tokens."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


@dataclass(frozen=True)
class DraftShape:
    """How much the draft proposes per round (SGLang's steps / topk / num_draft_tokens)."""

    steps: int = 4
    topk: int = 1
    draft_tokens: int | None = None  # tree nodes per round, root included; default steps + 1 (chain)

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise SpecVocabError(f"draft steps = {self.steps} is invalid: must be >= 1")
        if self.topk < 1:
            raise SpecVocabError(f"draft topk = {self.topk} is invalid: must be >= 1")
        most = 1 + self.topk + (self.steps - 1) * self.topk * self.topk
        n = self.num_draft_tokens
        if not 2 <= n <= most:
            raise SpecVocabError(
                f"draft tokens = {n} is invalid: must be in [2, {most}] for steps={self.steps}, topk={self.topk}"
            )

    @property
    def num_draft_tokens(self) -> int:
        if self.draft_tokens is not None:
            return self.draft_tokens
        return self.steps + 1 if self.topk == 1 else min(8, 1 + self.topk + (self.steps - 1) * self.topk**2)


@dataclass
class RoundStats:
    set_size: float  # ids in the request's set while this round drafted (mean over draft steps for
    # ranker policies; the vocabulary size when dense)
    accepted: int  # draft tokens the target accepted
    committed: int  # tokens the round added to the output (accepted + bonus, cut at EOS / the limit)
    in_set: int  # of the checked committed tokens, how many were in the set used at their position
    checked: int = -1  # committed tokens checked for coverage (-1: all of them)
    union_size: float = 0.0  # distinct ids in the sets of the request's lockstep batch while it drafted (mean
    # over draft steps; its own set's size at batch 1; the draft head's rows when dense)

    def __post_init__(self) -> None:
        if self.checked < 0:
            self.checked = self.committed


@dataclass
class Generation:
    tokens: list[int]
    rounds: list[RoundStats] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def accept_length(self) -> float:
        """Committed tokens per verify round, bonus included (0 when no round ran)."""
        return sum(r.committed for r in self.rounds) / len(self.rounds) if self.rounds else 0.0

    @property
    def coverage(self) -> float:
        """Share of the target's tokens that were in the set the draft used (1.0 when no round ran)."""
        total = sum(r.checked for r in self.rounds)
        return sum(r.in_set for r in self.rounds) / total if total else 1.0


def check_batch(config: PolicyConfig, batch: int) -> None:
    """Refuse a lockstep batch the decoder cannot run with ``config`` (before any model work)."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise SpecVocabError(f"batch = {batch!r} is invalid: must be an integer >= 1 (requests in lockstep)")
    if batch > 1 and getattr(config, "align", None) is not None:
        raise SpecVocabError(
            f"{config.source}: align (online LoRA of the one draft, updated after every verify) decodes one request "
            f"at a time: batch = {batch} is invalid with it, must be 1"
        )


@dataclass
class _Tree:
    tokens: list[int]  # selected nodes, best first
    parents: list[int]  # index into ``tokens`` or -1 for the root


@dataclass
class _Request:
    """One request's decoding state: its table slot, caches, output and what its draft has not seen yet."""

    slot: int  # its table row
    tcache: Any  # the target's KV cache
    dcache: Any  # the draft's KV cache
    gen: Generation
    root: int  # the last committed token
    pending: list[int]  # committed tokens the draft has not seen; the last is the root
    pending_aux: torch.Tensor | None  # EAGLE-3: the target's features of the position before each of ``pending``
    late: int | None = None  # ranker policies: a bonus token to check at the next round
    sets: list[tuple[set[int], int]] = field(default_factory=list)  # ranker policies: (set, size) per draft step

    @property
    def rows(self) -> torch.Tensor:
        return torch.tensor([self.slot])


@dataclass
class _Walk:
    """A request's draft tree of one round while it grows, one draft step at a time (EAGLE-2 beams)."""

    set_size: int  # ids in the request's set when the round began (the draft head's rows when dense)
    base: int  # the draft cache's length before the draft steps
    hidden: torch.Tensor  # the next draft step's hidden rows [n, d] (n = 1 at step 0, then topk)
    inputs: torch.Tensor  # their input tokens [n]
    state: torch.Tensor | None  # EAGLE-3: each beam's own pre-norm output, fed to its next step
    late_hit: int | None  # ranker policies: whether the last round's late bonus was in its set
    unions: list[int] = field(default_factory=list)  # the batch's union size at each draft step
    beam_scores: torch.Tensor | None = None
    beam_tokens: torch.Tensor | None = None
    beam_nodes: list[int] = field(default_factory=list)
    node_tok: list[int] = field(default_factory=list)
    node_score: list[float] = field(default_factory=list)
    node_parent: list[int] = field(default_factory=list)
    node_depth: list[int] = field(default_factory=list)


class SpeculativeDecoder:
    """Speculative decoding through a policy and the draft head, of one request or of ``batch`` requests in
    lockstep. In lockstep every draft step scores all requests' rows in one head call over the shared table, as a
    server batch does (so ``head.batch: union`` and its ``union_view`` act as there); the draft and target forwards,
    the verification and the policy's events stay per request, exactly as with one request."""

    SLOT = 1  # the first request's table row; row 0 is the padding row, as in SGLang

    def __init__(
        self,
        target: CausalLM,
        draft: CausalLM | Eagle3LM,
        config: PolicyConfig,
        shape: DraftShape = DraftShape(),
        *,
        eos_token_ids: Sequence[int] = (),
        recorder: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
        batch: int = 1,
    ) -> None:
        check_batch(config, batch)
        if draft.vocab_size != target.vocab_size:
            raise SpecVocabError(
                f"draft vocabulary ({draft.vocab_size}) differs from the target's ({target.vocab_size})"
            )
        config.check_vocab(draft.vocab_size, draft.name)
        config.check_draft_topk(shape.topk, "draft topk")
        align = getattr(config, "align", None)
        self.eagle3 = isinstance(draft, Eagle3LM)
        self.tap = None
        if self.eagle3:
            if align is not None:
                raise SpecVocabError(
                    f"{config.source}: align (online LoRA) needs a Hugging Face draft, not an EAGLE-3 draft"
                )
            self.tap = TargetTap(target.model, draft.capture_layers)
        self.aligner = OnlineLoRA(draft, align) if align is not None else None
        if self.aligner is not None:
            draft = self.aligner.draft  # a private LoRA'd copy: the target stays untouched
        self.target, self.draft, self.config, self.shape = target, draft, config, shape
        self.batch = batch
        self.eos = {int(t) for t in eos_token_ids}
        space = VocabSpace.build(draft.vocab_size, eos_token_ids=self.eos, device=draft.weight.device)
        model = ModelContext(
            weight=draft.weight.detach(),
            embedding=draft.embedding.detach(),
            space=space,
            eos_token_ids=tuple(sorted(self.eos)),
        )
        self.policy = build_policy(config, num_rows=batch + 1, model=model)
        head = config.head
        if head.batch == "auto" and self.policy.table is not None:
            # auto is a speed choice (it may pick the stock dense head); the lab measures the policy's sets, so it
            # scores per request unless a mode is named (union own drafts the same; union all or stock differ)
            head = head.model_copy(update={"batch": "per-request"})
        self.head = DraftHead(draft.weight, self.policy.table, space, head, logit_softcap=draft.softcap)
        self.recorder = recorder  # gets (draft hidden states [n, d], their input tokens [n]) per request and step
        self._temperature, self._generator = 0.0, None  # of the current generate call

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        *,
        temperature: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> Generation:
        """Greedy (``temperature`` 0) or sampled output; ``generator`` drives every random draw."""
        return self.generate_batch([prompt_ids], max_new_tokens, temperature=temperature, generator=generator)[0]

    @torch.no_grad()
    def generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        *,
        temperature: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> list[Generation]:
        """Decode 1 to ``batch`` prompts in lockstep, in table slots 1, 2, ...: each round drafts every unfinished
        request (one head call per draft step for all of them), then verifies each. ``seconds`` of every output is
        the whole batch's time."""
        if not 1 <= len(prompts) <= self.batch:
            raise SpecVocabError(
                f"{len(prompts)} prompts: this decoder decodes 1 to {self.batch} at once (its batch = {self.batch})"
            )
        if not temperature >= 0:
            raise SpecVocabError(f"temperature = {temperature!r} is invalid: must be >= 0")
        self._temperature, self._generator = float(temperature), generator
        tensors = [_prompt_tensor(p) for p in prompts]  # an empty prompt is refused before any work
        start = time.perf_counter()
        reqs = [self._prefill(slot, prompt) for slot, prompt in enumerate(tensors, start=self.SLOT)]
        while active := [r for r in reqs if not self._finished(r.gen.tokens, max_new_tokens)]:
            for req, walk in zip(active, self._draft_trees(active), strict=True):
                self._round(req, walk, max_new_tokens)
        for req in reqs:
            req.gen.tokens = req.gen.tokens[:max_new_tokens]
            req.gen.seconds = time.perf_counter() - start
        return [req.gen for req in reqs]

    def _prefill(self, slot: int, prompt: torch.Tensor) -> _Request:
        pol, rows = self.policy, torch.tensor([slot])
        tcache, dcache = self.target.new_cache(), self.draft.new_cache()
        pol.on_reset(rows)
        self.head.refresh(rows)
        aux = None
        if self.eagle3:
            hidden, aux = self.target.hidden(prompt, tcache, self.tap)
            hidden, aux = hidden[0], aux[0]
        else:
            hidden = self.target.hidden(prompt, tcache)[0]
        topk = self.target.topk_ids(hidden, pol.prefill_topk)[None] if pol.prefill_topk else None
        pol.on_prefill(rows, prompt, topk)
        self.head.refresh(rows)
        root = self._pick(self.target.logits(hidden[-1]))
        if self.eagle3:
            # SGLang's draft extend after prefill: prompt positions, each with the next token (the
            # root last) and the target's features there. ``pending_aux[i]`` belongs to the
            # position before ``pending[i]``.
            pending = prompt[0, 1:].tolist() + [root]
        else:
            self.draft.hidden(prompt, dcache)
            pending = [root]
        return _Request(slot, tcache, dcache, Generation(tokens=[root]), root, pending, aux)

    def _round(self, req: _Request, walk: _Walk, max_new_tokens: int) -> None:
        """Verify a request's drafted tree, commit, and give the policy the round's events."""
        pol, rows, gen = self.policy, req.rows, req.gen
        tree, set_size = self._tree(walk), walk.set_size
        if walk.late_hit is not None:
            gen.rounds[-1].in_set += walk.late_hit
            gen.rounds[-1].checked += 1
        accepted, bonus, verified_logits, verified_aux = self._verify(req.root, tree, req.tcache)
        committed = self._cut(accepted + [bonus], gen.tokens, max_new_tokens)
        committed_t = torch.tensor([committed])
        in_set, checked, req.late = len(committed), len(committed), None
        if pol.stepwise:
            # Position j was drafted from step j's set; a bonus past the last step is checked
            # against the set its position gets at the next round (from the same hidden state).
            set_size = sum(n for _, n in req.sets) / len(req.sets)
            checked = min(len(committed), len(req.sets))
            in_set = sum(int(t in req.sets[j][0] and self._drafts(t)) for j, t in enumerate(committed[:checked]))
            if checked < len(committed):
                req.late = len(accepted)
        elif not pol.dense:
            in_set = int((pol.table.contains(rows, committed_t)[0] & self._in_vocab(committed_t[0])).sum())
        else:
            in_set = int(self._in_vocab(committed_t[0]).sum())
        vtopk = verified_logits.topk(pol.verify_topk, dim=-1).indices[None] if pol.verify_topk else None
        pol.on_verify(rows, torch.tensor([[req.root] + tree.tokens]), vtopk, committed_t)
        self.head.refresh(rows)
        if self.aligner is not None:
            self.aligner.update(req.dcache, req.root, accepted, verified_logits)
        union = sum(walk.unions) / len(walk.unions)
        gen.rounds.append(RoundStats(set_size, len(accepted), len(committed), in_set, checked, union))
        gen.tokens.extend(committed)
        req.pending, req.root, req.pending_aux = accepted + [bonus], bonus, verified_aux

    def _pick(self, logits: torch.Tensor) -> int:
        """The target's next token from its logits: greedy, or a sample at the temperature."""
        if self._temperature == 0:
            return int(logits.argmax())
        return int(torch.multinomial(self._probs(logits), 1, generator=self._generator))

    def _probs(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.softmax(logits.double() / self._temperature, dim=-1)

    def _accept(self, probs: torch.Tensor, token: int) -> bool:
        """Speculative sampling's test for a drafted token: accept with min(1, p(x) / q(x)) = p(x).

        The draft's tokens are its top-k over the candidate set, chosen deterministically (as SGLang's
        EAGLE tree without rejection sampling), so the draft distribution q of each drafted child is a
        point mass on it; ``probs`` is the target's p, already renormalised after earlier rejections."""
        u = torch.rand((), generator=self._generator, dtype=torch.float64)
        return bool(u < probs[token])

    def _finished(self, tokens: list[int], limit: int) -> bool:
        return len(tokens) >= limit or tokens[-1] in self.eos

    def _cut(self, new: list[int], done: list[int], limit: int) -> list[int]:
        new = new[: max(limit - len(done), 0)]
        for i, t in enumerate(new):
            if t in self.eos:
                return new[: i + 1]
        return new

    def _in_vocab(self, tokens: torch.Tensor) -> torch.Tensor:
        """Which of ``tokens`` the draft head can propose (a d2t draft: its own vocabulary)."""
        mask = getattr(self.draft, "in_vocab", None)
        return torch.ones_like(tokens, dtype=torch.bool) if mask is None else mask[tokens]

    def _drafts(self, token: int) -> bool:
        return bool(self._in_vocab(torch.tensor([token]))[0])

    def _select(self, reqs: list[_Request], step: int, hidden: torch.Tensor, tokens: torch.Tensor) -> None:
        """Ranker policies choose the sets of draft step ``step`` from the beams' hidden states ``[bs, n, d]``
        (one call for the batch, as the server makes it)."""
        pol = self.policy
        pol.select(torch.tensor([r.slot for r in reqs]), step, hidden, tokens)
        for r in reqs:
            n = int(pol.table.cnt[r.slot])
            r.sets.append((set(pol.table.ids[r.slot, :n].tolist()), n))

    def _draft_logprobs(self, reqs: list[_Request], walks: list[_Walk], step: int, k: int):
        """Top-k (log-prob, token id) of every request's hidden rows under the draft head over its set (or the
        batch's union): one head call, rows request-major."""
        hidden, inputs = [w.hidden for w in walks], [w.inputs for w in walks]
        if self.recorder is not None:
            for h, t in zip(hidden, inputs, strict=True):
                self.recorder(h, t)
        rows = torch.tensor([r.slot for r in reqs])
        if self.policy.stepwise:
            self._select(reqs, step, torch.stack(hidden), torch.stack(inputs))
        union = self._union_size(rows)
        for w in walks:
            w.unions.append(union)
        out = self.head(torch.cat(hidden), rows)
        mask = getattr(self.draft, "in_vocab", None)
        if mask is not None:  # a d2t draft scores only its own vocabulary
            n, width = out.logits.shape
            cols = out.tokens(torch.arange(width).expand(n, width))  # each column's token id (-1: none)
            out.logits = out.logits.masked_fill(~((cols >= 0) & mask[cols.clamp(min=0)]), float("-inf"))
        # A row with nothing it can propose is all -inf: its tokens stay out of the tree.
        out.logits = torch.log_softmax(out.logits, dim=-1).nan_to_num(nan=float("-inf"))
        return out.topk(k)

    def _union_size(self, rows: torch.Tensor) -> int:
        """Distinct ids in the sets of table ``rows`` (what a union head scores; the draft head's rows when dense)."""
        t = self.policy.table
        if t is None:
            return self.draft.head_size
        live = torch.arange(t.capacity)[None, :] < t.cnt[rows][:, None]
        return int(torch.unique(t.ids[rows][live]).numel())

    def _draft_trees(self, reqs: list[_Request]) -> list[_Walk]:
        """Every request's draft tree of the round, grown in lockstep: each draft step scores all requests' rows in
        one head call (every request has the same number of rows at a step: 1, then topk)."""
        walks = [self._begin(r) for r in reqs]
        for step in range(self.shape.steps):
            if step:
                for r, w in zip(reqs, walks, strict=True):
                    self._advance(r, w, step)
            scores, tokens = self._draft_logprobs(reqs, walks, step, self.shape.topk)
            n = walks[0].hidden.shape[0]
            for i, (r, w) in enumerate(zip(reqs, walks, strict=True)):
                self._grow(r, w, step, scores[i * n : (i + 1) * n], tokens[i * n : (i + 1) * n])
        for r, w in zip(reqs, walks, strict=True):
            if self.shape.topk > 1 and self.shape.steps > 1:
                r.dcache.batch_select_indices(torch.tensor([0]))
            _trim(r.dcache, w.base)
        return walks

    def _begin(self, req: _Request) -> _Walk:
        """The draft extend over the request's pending tokens: the hidden row of draft step 0."""
        pol, pending = self.policy, req.pending
        set_size = self.draft.head_size if pol.dense else int(pol.table.cnt[req.slot])
        state = None
        if self.eagle3:
            hs, pre = self.draft.extend(torch.tensor(pending), req.pending_aux, req.dcache)
            state = pre[-1:]  # the draft's own hidden state, fed to its next step
        else:
            hs = self.draft.hidden(torch.tensor([pending]), req.dcache)[0]
        req.sets = []
        late_hit = None
        if req.late is not None:  # the hidden state before the last round's bonus token predicted it
            self._select([req], req.late, hs[None, -2:-1], torch.tensor([pending[-2:-1]]))
            late_hit = int(pending[-1] in req.sets.pop()[0])
        return _Walk(set_size, req.dcache.get_seq_length(), hs[-1:], torch.tensor(pending[-1:]), state, late_hit)

    def _advance(self, req: _Request, w: _Walk, step: int) -> None:
        """Run the draft on the request's beams: the hidden rows of draft step ``step`` (>= 1)."""
        k = self.shape.topk
        if step == 1 and k > 1:
            req.dcache.batch_repeat_interleave(k)
        if self.eagle3:
            w.hidden, w.state = self.draft.step(w.beam_tokens, w.state.expand(len(w.beam_tokens), -1), req.dcache)
        else:
            w.hidden = self.draft.hidden(w.beam_tokens[:, None], req.dcache)[:, -1]
        w.inputs = w.beam_tokens

    def _grow(self, req: _Request, w: _Walk, step: int, scores: torch.Tensor, tokens: torch.Tensor) -> None:
        """Add the children of the request's beams (their top-k ``scores``/``tokens``) and keep the best k beams."""
        k = self.shape.topk
        if step == 0:
            w.beam_scores, w.beam_tokens = scores[0], tokens[0]
            w.node_tok, w.node_score = tokens[0].tolist(), scores[0].tolist()
            w.node_parent, w.node_depth, w.beam_nodes = [-1] * k, [1] * k, list(range(k))
            return
        cand = (w.beam_scores[:, None] + scores).reshape(-1)
        first = len(w.node_tok)
        w.node_tok += tokens.reshape(-1).tolist()
        w.node_score += cand.tolist()
        w.node_parent += [w.beam_nodes[i // k] for i in range(k * k)]
        w.node_depth += [step + 1] * (k * k)
        best = torch.sort(cand, descending=True, stable=True).indices[:k]
        if k > 1:
            req.dcache.batch_select_indices(best // k)
            if self.eagle3:
                w.state = w.state[best // k]
        w.beam_nodes = [first + int(i) for i in best]
        w.beam_scores, w.beam_tokens = cand[best], tokens.reshape(-1)[best]

    def _tree(self, w: _Walk) -> _Tree:
        """The round's tree: best nodes first; a parent never scores below its child, and ties go to the
        shallower node, so the chosen nodes always include their ancestors."""
        live = [i for i in range(len(w.node_tok)) if w.node_score[i] != float("-inf")]
        live.sort(key=lambda i: (-w.node_score[i], w.node_depth[i], i))
        chosen = live[: self.shape.num_draft_tokens - 1]
        where = {node: j for j, node in enumerate(chosen)}
        return _Tree(
            tokens=[w.node_tok[i] for i in chosen],
            parents=[where[w.node_parent[i]] if w.node_parent[i] >= 0 else -1 for i in chosen],
        )

    def _verify(self, root: int, tree: _Tree, tcache):
        """Greedy verification of every root-to-leaf path; returns (accepted, bonus, logits at the
        accepted path, and for an EAGLE-3 draft the target's features there, else None)."""
        inner = set(tree.parents)
        node_paths = []  # tree node indices of each root-to-leaf path
        for leaf in (i for i in range(len(tree.tokens)) if i not in inner):
            path = []
            while leaf >= 0:
                path.append(leaf)
                leaf = tree.parents[leaf]
            node_paths.append(path[::-1])
        node_paths = node_paths or [[]]
        paths = [[tree.tokens[i] for i in p] for p in node_paths]
        width = max(len(p) for p in paths)
        batch = torch.tensor([[root] + p + [root] * (width - len(p)) for p in paths])
        base = tcache.get_seq_length()
        if len(paths) > 1:
            tcache.batch_repeat_interleave(len(paths))
        aux = None
        if self.eagle3:
            hidden, aux = self.target.hidden(batch, tcache, self.tap)
        else:
            hidden = self.target.hidden(batch, tcache)
        logits = self.target.logits(hidden)
        if self._temperature > 0:
            best, n, bonus = self._verify_sampled(tree, node_paths, logits)
            if len(paths) > 1:
                tcache.batch_select_indices(torch.tensor([best]))
            _trim(tcache, base + 1 + n)
            return paths[best][:n], bonus, logits[best, : n + 1], None if aux is None else aux[best, : n + 1]
        pred = logits.argmax(-1)
        match = pred[:, :width] == batch[:, 1:]
        lengths = torch.tensor([len(p) for p in paths])
        valid = torch.arange(width)[None, :] < lengths[:, None]
        accepted_n = (match & valid).int().cumprod(1).sum(1)
        best = int(accepted_n.argmax())
        n = int(accepted_n[best])
        if len(paths) > 1:
            tcache.batch_select_indices(torch.tensor([best]))
        _trim(tcache, base + 1 + n)
        return paths[best][:n], int(pred[best, n]), logits[best, : n + 1], None if aux is None else aux[best, : n + 1]

    def _verify_sampled(self, tree: _Tree, node_paths: list[list[int]], logits: torch.Tensor) -> tuple[int, int, int]:
        """Speculative sampling over the tree (SGLang's target-only rule): from the root, try the children of
        the current node best first, each accepted with probability p(child) under the target's distribution
        p there; a rejected child's token is removed from p (the residual max(p - q, 0) of a point-mass q),
        renormalised; the first accepted child becomes the current node. When none is accepted (or the node
        is a leaf), the bonus is sampled from what is left of p. Returns (path row, accepted count, bonus)."""
        children: dict[int, list[int]] = {}
        for i, parent in enumerate(tree.parents):
            children.setdefault(parent, []).append(i)
        row_of = {node: r for r, path in reversed(list(enumerate(node_paths))) for node in path}
        node, row, n = -1, 0, 0
        while True:
            p = self._probs(logits[row, n])
            nxt = None
            for child in children.get(node, []):
                token = tree.tokens[child]
                if self._accept(p, token):
                    nxt = child
                    break
                p[token] = 0.0
                p = p / p.sum()
            if nxt is None:
                return row, n, int(torch.multinomial(p, 1, generator=self._generator))
            node, row, n = nxt, row_of[nxt], n + 1


@torch.no_grad()
def greedy_generate(
    target: CausalLM, prompt_ids: Sequence[int], max_new_tokens: int, eos_token_ids: Sequence[int] = ()
) -> list[int]:
    """Target-only greedy decoding, one token per forward: what speculative decoding must reproduce."""
    prompt = _prompt_tensor(prompt_ids)
    eos = {int(t) for t in eos_token_ids}
    cache = target.new_cache()
    hidden = target.hidden(prompt, cache)
    out: list[int] = []
    while len(out) < max_new_tokens:
        token = int(target.logits(hidden[0, -1]).argmax())
        out.append(token)
        if token in eos:
            break
        hidden = target.hidden(torch.tensor([[token]]), cache)
    return out
