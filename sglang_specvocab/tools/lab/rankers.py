"""Rankers and routers, the learned parts of the lowrank and cluster policies: record draft hidden states, fit one.

Both fit on draft hidden states against the draft's own full-vocabulary head as the teacher. The
states come from the reference decoder while it drafts (``decode``: the states the policy sees at
serve time, a few per generated token) or from whole ShareGPT conversations teacher-forced
(``text``: the draft's first-step state at every position, one forward per conversation, so
thousands of conversations fit in minutes on a CPU).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import torch

from ...errors import SpecVocabError
from ...policies import ModelContext, build_policy, load_config, parse_config
from ...policies.cluster import Router
from ...policies.lowrank import svd_ranker, whitened_ranker
from ...vocab import VocabSpace
from ..models import GEMMA3_270M, load_model
from ..options import FromArgs
from ..prompts import format_prompt, sharegpt_conversations
from ..train.checkpoint import checkpoint_fingerprint
from ..train.model import TargetTap, ttt_forward
from .decoder import CausalLM, DraftShape, Eagle3LM, SpeculativeDecoder
from .documents import mixed_documents


@torch.no_grad()
def record_draft_states(
    target: CausalLM,
    draft: CausalLM,
    prompts: Iterable[Sequence[int]],
    max_new_tokens: int,
    shape: DraftShape = DraftShape(),  # noqa: B008  (frozen: one shared default is safe)
    eos_token_ids: Sequence[int] = (),
    progress: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden ``[N, d]``, input tokens ``[N]``) of every draft step while decoding ``prompts``."""
    from tqdm import tqdm  # the lab extra

    hidden, tokens = [], []
    dec = SpeculativeDecoder(
        target,
        draft,
        parse_config({"policy": "full"}, source="<recording>"),
        shape,
        eos_token_ids=eos_token_ids,
        recorder=lambda h, t: (hidden.append(h.detach().cpu()), tokens.append(t.cpu())),
    )
    for prompt in tqdm(list(prompts), desc="record", unit="prompt", disable=not progress):
        dec.generate(prompt, max_new_tokens)
    return torch.cat(hidden), torch.cat(tokens)


@torch.no_grad()
def record_text_states(
    target: CausalLM,
    draft: CausalLM | Eagle3LM,
    sequences: Iterable[torch.Tensor],
    per_sequence: int = 0,
    seed: int = 0,
    progress: bool = False,
    steps: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden ``[N, d]``, input tokens ``[N]``), teacher-forced over whole texts: at each position, the
    draft's state when it drafts the next token from there. A self-draft's is its hidden state over the
    text; an EAGLE-3 draft's is its draft-extend state (the target's features of the position before,
    the token there), as ``decode`` records at a round's first draft step, and with ``steps`` > 1 also its
    states at draft steps 1 .. steps-1 of a chain that starts there (the training-time test's unrolled passes:
    the draft's own hidden fed back, the text's tokens as the chain's), which a served chain's later steps
    rank from. ``per_sequence`` > 0 keeps that many positions of each text (a seeded random choice, in
    order; every step's state at each); 0 keeps every position."""
    from tqdm import tqdm  # the lab extra

    eagle3 = isinstance(draft, Eagle3LM)
    tap = TargetTap(target.model, draft.capture_layers) if eagle3 else None
    g = torch.Generator().manual_seed(seed)
    hidden, tokens = [], []
    for seq in tqdm(list(sequences), desc="record", unit="text", disable=not progress):
        seq = torch.as_tensor(seq, dtype=torch.int64)
        if eagle3:
            if len(seq) < 2:
                continue
            _, aux = target.hidden(seq[None], target.new_cache(), tap)
            if steps == 1:
                h, _ = draft.extend(seq[1:], aux[0, :-1], draft.new_cache())
                passes = [h]
            else:  # pass k's row i drafts from token i + k + 1: rows past the text's end are cut
                outs = ttt_forward(draft.module, seq[None], aux.float(), steps)
                passes = [o[0, : max(0, len(seq) - 1 - k)] for k, o in enumerate(outs)]
            inputs = seq[1:]
        else:
            passes, inputs = [draft.hidden(seq[None], draft.new_cache())[0]], seq
        keep = torch.arange(len(inputs))
        if 0 < per_sequence < len(inputs):
            keep = torch.randperm(len(inputs), generator=g)[:per_sequence].sort().values
        for k, h in enumerate(passes):
            rows = keep[keep < len(h)]
            hidden.append(h[rows].detach().cpu())
            tokens.append(inputs[rows + k])
    if not hidden:
        raise SpecVocabError(
            "recording: no text to record states from (no sequence, or for an EAGLE-3 draft none of 2 tokens or more)"
        )
    return torch.cat(hidden), torch.cat(tokens)


def _batches(n: int, batch_size: int, steps: int, seed: int, desc: str, progress: bool):
    from tqdm import tqdm  # the lab extra

    g = torch.Generator().manual_seed(seed)
    for _ in tqdm(range(steps), desc=desc, unit="step", disable=not progress):
        yield torch.randint(0, n, (min(batch_size, n),), generator=g)


def train_ranker(
    weight: torch.Tensor,
    hidden: torch.Tensor,
    rank: int,
    *,
    steps: int = 200,
    lr: float = 1e-3,
    batch_size: int = 64,
    seed: int = 0,
    init: tuple[torch.Tensor, torch.Tensor] | None = None,
    progress: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, list[float]]:
    """Fit ``(W_down [rank, d], W_vocab [V, rank])`` so that softmax of the approximate logits
    matches the head's (KL(teacher || ranker), SpecVocab's distillation objective).

    Starts from the truncated SVD (or ``init``); returns the weights and the loss per step.
    """

    w = weight.detach().float()
    w_down, w_vocab = init if init is not None else svd_ranker(w, rank)
    w_down = w_down.float().clone().requires_grad_(True)
    w_vocab = w_vocab.float().clone().requires_grad_(True)
    opt = torch.optim.Adam([w_down, w_vocab], lr=lr)
    x = hidden.float()
    losses = []
    for idx in _batches(len(x), batch_size, steps, seed, "ranker", progress):
        h = x[idx]
        with torch.no_grad():
            teacher = torch.log_softmax(h @ w.T, dim=-1)
        student = torch.log_softmax((h @ w_down.T) @ w_vocab.T, dim=-1)
        loss = torch.nn.functional.kl_div(student, teacher, log_target=True, reduction="batchmean")
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return w_down.detach(), w_vocab.detach(), losses


def cluster_targets(
    weight: torch.Tensor, hidden: torch.Tensor, perm: torch.Tensor, offsets: torch.Tensor, top_l: int
) -> torch.Tensor:
    """Multi-hot ``[N, C]``: the clusters holding the head's top-L tokens of each hidden state."""
    cluster_of = torch.empty_like(perm)
    cluster_of[perm] = torch.repeat_interleave(torch.arange(len(offsets) - 1), offsets.diff())
    w = weight.detach().float()
    # In chunks: no [N, V] logits tensor.
    top = torch.cat([(h.float() @ w.T).topk(top_l, dim=-1).indices for h in hidden.split(1024)])
    out = torch.zeros(len(hidden), len(offsets) - 1)
    return out.scatter_(1, cluster_of[top], 1.0)


@dataclass(frozen=True)
class RouterSettings:
    """How ``train_router`` fits DynaSpec's router (``train-router``'s options): the head's top-L targets, the MLP's
    width, and the optimisation."""

    top_l: int = 8
    width: int = 512
    steps: int = 200
    lr: float = 1e-3
    batch_size: int = 64
    seed: int = 0
    progress: bool = False


def train_router(
    weight: torch.Tensor,
    embedding: torch.Tensor,
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    perm: torch.Tensor,
    offsets: torch.Tensor,
    settings: RouterSettings = RouterSettings(),
):
    """DynaSpec's router, fitted with multi-label BCE; returns (router, loss per step)."""
    top_l, width, steps, lr = settings.top_l, settings.width, settings.steps, settings.lr
    batch_size, seed, progress = settings.batch_size, settings.seed, settings.progress
    torch.manual_seed(seed)
    router = Router(hidden.shape[1], width, len(offsets) - 1)
    opt = torch.optim.Adam(router.parameters(), lr=lr)
    emb = embedding.detach().float()
    x = hidden.float()
    losses = []
    for idx in _batches(len(x), batch_size, steps, seed, "router", progress):
        # the batch's targets only: the head's top-L costs a full-vocabulary product per state
        targets = cluster_targets(weight, x[idx], perm, offsets, top_l)
        logits = router(emb[tokens[idx]], x[idx])
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return router.eval(), losses


# --- the commands (sglang-specvocab train-ranker / train-router) ----------------------------------

DEFAULT_PROMPTS = {"text": 2000, "mixed": 300, "decode": 32}  # conversations or documents per source (--prompts)


DRAFT_FORMS = {"layers": "'layers:N'", "eagle3": "'eagle3:DIR'", "target": "'target'", "auto": "'auto'"}


def parse_draft(spec: str, kinds: Sequence[str]) -> tuple[str, int | str | None]:
    """A ``--draft`` value as ``(kind, value)``: ``("layers", N)``, ``("eagle3", DIR)``, ``("target", None)``
    or ``("auto", None)``, of the ``kinds`` the command takes; anything else is refused naming them.
    The one parser of the lab's and the training commands' draft specs."""
    kind, _, value = spec.partition(":")
    if kind in kinds:
        if kind == "layers" and value.isdigit() and int(value) > 0:
            return kind, int(value)
        if kind == "eagle3" and value:
            return kind, value
        if kind in ("target", "auto") and spec == kind:
            return kind, None
    forms = [DRAFT_FORMS[k] for k in kinds]
    must = forms[0] if len(forms) == 1 else ", ".join(forms[:-1]) + " or " + forms[-1]
    raise SpecVocabError(f"--draft = {spec!r} is invalid: must be {must}")


@dataclass(frozen=True)
class Recording(FromArgs):
    """Which draft states ``train-ranker`` and ``train-router`` fit on (their shared recording options, read once with
    ``from_args``): the model and draft, the ShareGPT text (``source`` text: teacher-forced sequences; decode: the
    draft's own states while the target answers first turns) and the cache file ``states``."""

    model: str = GEMMA3_270M
    draft: str | None = None  # None: layers:draft_layers
    draft_layers: int = 12
    source: str = "text"
    prompts: int | None = None  # None: DEFAULT_PROMPTS of the source
    skip: int = 1000
    prompt_tokens: int = 256
    max_new_tokens: int = 64
    seq_len: int = 512
    positions: int = 64
    draft_steps: int = 4  # text and mixed, EAGLE-3 drafts: the chain's steps recorded at each position
    code_share: float = 0.25  # mixed: build-data's documents
    multilingual_share: float = 0.5
    seed: int = 0
    states: str | None = None

    @property
    def draft_or_layers(self) -> str:
        """``draft``, else the self-draft of ``draft_layers`` (``layers:N``)."""
        return self.draft or f"layers:{self.draft_layers}"

    @property
    def prompt_count(self) -> int:
        """``prompts``, else the source's default (the command line's default depends on the source)."""
        return DEFAULT_PROMPTS[self.source] if self.prompts is None else self.prompts


def recording_draft(args: Recording, lm) -> CausalLM | Eagle3LM:
    """The draft whose states the commands record: ``--draft layers:N`` or ``eagle3:DIR`` (default
    ``layers:`` ``--draft-layers``). A d2t EAGLE-3 draft is refused: its head is not the full vocabulary's."""
    spec = args.draft_or_layers
    kind, value = parse_draft(spec, ("layers", "eagle3", "target"))
    if kind == "target":  # the oracle draft: the target's own final states
        return CausalLM(lm.model)
    if kind == "layers":
        return CausalLM(lm.model, num_layers=value)
    draft = Eagle3LM.load(value, lm.model)
    if draft.in_vocab is not None:
        raise SpecVocabError(
            f"--draft {spec}: a d2t draft ({draft.head_size} ids) has no full-vocabulary head to learn from; "
            "train the ranker or router on a --head full draft"
        )
    return draft


def draft_spec(spec: str) -> str:
    """A draft spec as trained files record it: an EAGLE-3 draft by its absolute folder."""
    kind, _, value = spec.partition(":")  # as parse_draft splits it
    return f"eagle3:{Path(value).resolve()}" if kind == "eagle3" and value else spec


def recording_meta(args: Recording) -> dict:
    """What the recorded states depend on: a cache made with other values is refused, not reused."""
    spec = args.draft_or_layers
    meta = {
        "model": str(args.model),
        "draft": draft_spec(spec),
        "source": args.source,
        "prompts": args.prompt_count,
        "skip": args.skip,
    }
    kind, value = parse_draft(spec, ("layers", "eagle3", "target"))
    if kind == "eagle3":  # the draft itself, wherever its folder is (the server compares it: fit_mismatch)
        meta["draft_fingerprint"] = checkpoint_fingerprint(value)
    if args.source in ("text", "mixed"):
        meta |= {"seq_len": args.seq_len, "positions": args.positions, "seed": args.seed}
        if kind == "eagle3":
            meta["draft_steps"] = args.draft_steps
        if args.source == "mixed":
            meta |= {"code_share": args.code_share, "multilingual_share": args.multilingual_share}
    else:
        meta |= {"prompt_tokens": args.prompt_tokens, "max_new_tokens": args.max_new_tokens}
    return meta


def recorded_states(args: Recording, lm=None):
    """(loaded model, draft, hidden [N, d], tokens [N]) for the commands' recording arguments."""
    lm = lm or load_model(args.model)
    target = CausalLM(lm.model)
    draft = recording_draft(args, lm)
    meta = recording_meta(args)
    if args.states and Path(args.states).is_file():
        data = torch.load(args.states, weights_only=True)
        if "meta" in data:  # files of earlier versions carry none: read as they are
            made = json.loads(data["meta"])
            diff = {k: (made.get(k), v) for k, v in meta.items() if made.get(k) != v}
            if diff:
                what = ", ".join(f"{k} {a!r} (asked {b!r})" for k, (a, b) in diff.items())
                raise SpecVocabError(
                    f"--states {args.states} was recorded with other settings: {what}; delete it or pass another --states"
                )
        return lm, draft, data["hidden"], data["tokens"]
    if args.source in ("text", "mixed"):
        if args.source == "text":
            from ..train.train import sharegpt_sequences  # the EAGLE-3 trainer's ShareGPT text, same turns

            seqs = sharegpt_sequences(lm, args.skip, args.prompt_count, args.seq_len).sequences
            what = "ShareGPT conversations"
        else:
            seqs = mixed_documents(lm, args.prompt_count, args.seq_len, args.code_share, args.multilingual_share)
            what = "documents (ShareGPT, code and the target's answers in ten languages)"
        print(f"[recording] {len(seqs)} {what}, {sum(map(len, seqs)):,} tokens", file=sys.stderr)
        hidden, tokens = record_text_states(
            target, draft, seqs, args.positions, seed=args.seed, progress=True, steps=args.draft_steps
        )
    else:
        convs = islice(sharegpt_conversations(), args.skip, args.skip + args.prompt_count)
        prompts = [lm.encode(format_prompt(lm.tokenizer, [turns[0]], []))[: args.prompt_tokens] for turns in convs]
        hidden, tokens = record_draft_states(
            target, draft, prompts, args.max_new_tokens, eos_token_ids=lm.eos_token_ids, progress=True
        )
    if args.states:
        Path(args.states).parent.mkdir(parents=True, exist_ok=True)
        torch.save({"hidden": hidden, "tokens": tokens, "meta": json.dumps(meta)}, args.states)
    return lm, draft, hidden, tokens


def print_losses(name: str, loss_name: str, losses: list[float]) -> None:
    """How the loss moved: the mean of the first and of the last tenth of steps."""
    k = max(1, len(losses) // 10)
    print(
        f"[{name}] {loss_name} first {k} steps {sum(losses[:k]) / k:.4f} -> last {k} steps {sum(losses[-k:]) / k:.4f}"
    )


def save_trained(path, data: dict, name: str, recording: dict | None = None) -> None:
    """Write a trained file, with the ``recording`` settings it was fit on."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.save(data if recording is None else data | {"recording": json.dumps(recording)}, path)
    print(f"[{name}] wrote {path}")


def run_train_ranker(args) -> int:
    """``sglang-specvocab train-ranker``: record draft states, fit a SpecVocab ranker, write it."""
    recording = Recording.from_args(args)
    _, draft, hidden, _ = recorded_states(recording)
    print(f"[train-ranker] {len(hidden)} recorded draft states", file=sys.stderr)
    if args.fit == "whitened":
        w_down, w_proj, share = whitened_ranker(draft.weight, hidden, args.rank)
        print(f"[train-ranker] whitened SVD: keeps {share:.2%} of the states' E||W h||^2 at rank {args.rank}")
        data = {"w_down": w_down.float(), "w_proj": w_proj.float()}  # the policy computes W_vocab = W P at load
        save_trained(args.out, data, "train-ranker", recording_meta(recording) | {"fit": "whitened"})
        return 0
    w_down, w_vocab, losses = train_ranker(
        draft.weight,
        hidden,
        args.rank,
        steps=args.steps,
        lr=args.lr,
        batch_size=args.batch_size,
        seed=args.seed,
        progress=True,
    )
    data = {"w_down": w_down, "w_vocab": w_vocab}
    print_losses("train-ranker", "KL", losses)
    save_trained(args.out, data, "train-ranker", recording_meta(recording))
    return 0


def run_train_router(args) -> int:
    """``sglang-specvocab train-router``: record draft states, fit a DynaSpec router to a cluster config's clusters."""
    cfg = load_config(args.config)
    if cfg.policy != "cluster":
        raise SpecVocabError(f"{args.config}: policy = {cfg.policy!r}, a router needs a 'cluster' config")
    cfg = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"router": "centroid"})})
    recording = Recording.from_args(args)
    _, draft, hidden, tokens = recorded_states(recording)
    policy = build_policy(
        cfg, 1, model=ModelContext(weight=draft.weight.detach(), space=VocabSpace.build(draft.vocab_size))
    )
    print(f"[train-router] {len(hidden)} recorded draft states, {len(policy.offsets) - 1} clusters", file=sys.stderr)
    router, losses = train_router(
        draft.weight,
        draft.embedding,
        hidden,
        tokens,
        policy.perm,
        policy.offsets,
        RouterSettings(args.top_l, args.width, args.steps, args.lr, args.batch_size, args.seed, progress=True),
    )
    data = {
        "state": router.state_dict(),
        "clusters_key": policy.clusters_key,
        "width": args.width,
        "clusters": len(policy.offsets) - 1,
    }
    print_losses("train-router", "BCE", losses)
    save_trained(args.out, data, "train-router", recording_meta(recording))
    return 0
