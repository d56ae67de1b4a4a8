"""``sglang-specvocab train-eagle3``: the command around the trainer (``train.py``).

``run``: the training text (ShareGPT conversations, or the target's greedy answers) and the target's
states on it are computed once and cached (``data``), a draft as wide as the target is built
(``model``) and trained on the training-time-test loss (``loss``) with held-out validation, then saved
as SGLang loads it (``checkpoint``). ``sglang-specvocab train-eagle3 --help`` describes the options.
"""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...cache import cache_dir
from ...errors import SpecVocabError
from .checkpoint import load_into, save_checkpoint
from .data import OnlineStates, SelfDistillData, batch_of, compute_states
from .loss import Objective, StepStats, evaluate
from .model import Eagle3Config, Eagle3Draft, TargetTap, build_draft, capture_layers_from_ids, init_from_target
from .report import machine
from .settings import TrainEagle3
from .train import (
    Stopped,
    TrainRun,
    TrainSettings,
    cache_path,
    hot_ids,
    load_target,
    pad_id,
    train_draft,
    trainable,
    training_data,
    validation_data,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
END_SAVE_S = 5.0  # --time-budget-s: writing the draft and the training state at the end


def run(args: TrainEagle3) -> int:
    """``sglang-specvocab train-eagle3``: data and target states (cached), the draft, training with
    held-out validation, the checkpoint (with ``training.json``: the curves, timings and command)."""
    # --time-budget-s counts from the command's start (the CLI notes it before importing torch).
    start, cpu_start = args.started or time.perf_counter(), time.process_time()
    _settle_args(args)
    device = torch.device(args.device)
    model, with_tokenizer = load_target(args.target, DTYPES[args.dtype])
    model.to(device)
    vocab = model.get_input_embeddings().weight.shape[0]
    if args.head == "d2t" and args.draft_vocab >= vocab:
        raise SpecVocabError(
            f"--draft-vocab {args.draft_vocab} is not below the target's {vocab} tokens; use --head full"
        )
    data = training_data(args, model, with_tokenizer)
    val = validation_data(args, model, with_tokenizer)
    if args.prepare_data:
        print(f"[eagle3] --prepare-data: the training data is in {args.data}; stopping before training")
        return 0
    ids, vocab_source = hot_ids(
        data, vocab, head=args.head, draft_vocab=args.draft_vocab, freq=args.freq, target=args.target
    )
    capture = (
        None
        if args.aux_layer_ids is None
        else capture_layers_from_ids(args.aux_layer_ids, model.config.num_hidden_layers)
    )
    cfg = Eagle3Config.for_target(
        model, draft_vocab_size=None if ids is None else len(ids), capture_layers=capture, fc_norm=args.fc_norm
    )
    tap = TargetTap(model, cfg.capture_layers)
    if len(trainable(data, args.seq_len)) == 0:
        raise SpecVocabError(f"no training sequence has a response within --seq-len {args.seq_len}")
    states, val_batches = _target_states(args, cfg, tap, data, val, device)
    data_seconds, data_cpu = (time.perf_counter() - start, time.process_time() - cpu_start)
    draft = _new_draft(args, model, cfg, ids, device)
    n_params = sum(p.numel() for p in draft.parameters() if p.requires_grad)
    print(
        f"[eagle3] target {args.target}: {model.config.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
        f"vocab {vocab}; capture layers {cfg.capture_layers} ({tap.style} features); head {cfg.head}"
        + (f" over {cfg.draft_vocab_size} tokens ({vocab_source})" if ids is not None else "")
        + f"; {n_params / 1e6:.1f}M trainable parameters",
        file=sys.stderr,
    )
    objective = _objective(args, model, data, vocab, ids)
    job = _Run(args, start, cpu_start, device, draft, val_batches, data_seconds, data_cpu)
    history = _train(job, data, states, objective, pad_id(model))
    if history is None:  # stopped: the state and the draft so far are saved
        return 124
    job.train_time()
    return _finish(job, data, history, vocab_source, tap.style)


def _settle_args(args: TrainEagle3) -> None:
    """--device, --dtype and --out where left to the command; --device and --val checked."""
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SpecVocabError("--device cuda: no CUDA device is available")
    if args.dtype == "auto":
        args.dtype = "bfloat16" if args.device == "cuda" else "float32"
    if args.val > args.skip:
        raise SpecVocabError(
            f"--val = {args.val} is invalid: the held-out prompts come from the first --skip "
            f"({args.skip}) conversations"
        )
    if args.out is None:
        size = "" if args.head == "full" else f"{args.draft_vocab // 1024}k"
        args.out = str(cache_dir() / "drafts" / f"{Path(args.target).name}-eagle3-{args.head}{size}")


def _target_states(
    args: TrainEagle3,
    cfg: Eagle3Config,
    tap: TargetTap,
    data: SelfDistillData,
    val: SelfDistillData | None,
    device: torch.device,
):
    """The target's states on the training data (cached, or computed at every step with --states online), and
    the validation batches on ``device`` (None without --val)."""
    layers = "-".join(map(str, cfg.capture_layers))
    states_path = (
        Path(args.states)
        if args.states and args.states != "online"
        else cache_path(args, f"states-{args.source}-skip{args.skip}-L{args.seq_len}-{args.dtype}-c{layers}")
    )
    if args.states == "online":  # the target runs at every step: nothing kept, any data size
        states = OnlineStates(tap, args.seq_len)
    else:
        states = compute_states(tap, data, args.seq_len, cache=states_path, progress=True)
    val_batches = None
    if val is not None:
        val_len = max(len(x) for x in val.sequences)
        val_states = compute_states(
            tap, val, val_len, cache=cache_path(args, f"val-states-{args.dtype}-c{layers}"), progress=True
        )
        idx = trainable(val, val_len)
        val_batches = [batch_of(val, val_states, idx[s : s + 8]).to(device) for s in range(0, len(idx), 8)]
    return states, val_batches


def _new_draft(args: TrainEagle3, model, cfg: Eagle3Config, ids, device: torch.device) -> Eagle3Draft:
    """The draft, initialised as --init and --init-from say, on ``device``."""
    draft = build_draft(model, cfg, ids, seed=args.seed)
    if args.init == "target":
        init_from_target(draft, model)
    if args.init_from:
        load_into(draft, args.init_from)
    draft.to(device)
    return draft


def _objective(args: TrainEagle3, model, data: SelfDistillData, vocab: int, ids) -> Objective:
    """The training loss: over the full vocabulary, or (a full head with --loss-vocab) its hot tokens."""
    loss_ids = None
    if ids is None and args.loss_vocab:
        loss_ids, _ = hot_ids(data, vocab, head="d2t", draft_vocab=args.loss_vocab, freq=args.freq, target=args.target)
    objective = Objective.for_target(
        model, loss_ids=loss_ids, dtype=DTYPES[args.train_dtype], step_weight=args.step_weight
    )
    objective.head = objective.head.float()
    return objective


@dataclass
class _Run:
    """One train-eagle3 command once its draft is built: its clocks, what validation and the training time keep,
    and the schedule train_draft follows."""

    args: TrainEagle3
    start: float  # time.perf_counter() at the command's start
    cpu_start: float  # time.process_time() then
    device: torch.device
    draft: Eagle3Draft
    val_batches: list | None
    data_seconds: float
    data_cpu: float
    # Carried across --resume-state (train_draft's ``extra``): the validation curve and the training time.
    kept: dict = field(default_factory=lambda: {"curve": [], "train_seconds": 0.0, "train_cpu_seconds": 0.0})
    plan: dict = field(
        default_factory=dict
    )  # the schedule train_draft follows: --steps, or what fits in --time-budget-s
    t0: float = 0.0  # when the training time was last counted (perf_counter, process_time)
    c0: float = 0.0

    def validate(self, step: int, _stats=None) -> None:
        """The held-out agreement at ``step``, every --val-every steps and at the last, added to the curve."""
        args = self.args
        if self.val_batches is None or (step % args.val_every and step != self.plan["steps"]):
            return
        r = evaluate(self.draft, self.val_batches, args.ttt_steps)
        r.update(
            step=step,
            seconds=round(time.perf_counter() - self.start, 1),
            cpu_seconds=round(time.process_time() - self.cpu_start, 1),
        )
        self.kept["curve"].append(r)
        print(
            f"[eagle3] step {step}: validation top-1 per step {[round(a, 3) for a in r['accuracy']]}, "
            f"accept length {r['accept_length']:.3f} ({r['rows']} positions)",
            file=sys.stderr,
        )

    def train_time(self) -> None:
        """Adds the time since it was last counted to the training time."""
        self.kept["train_seconds"] += time.perf_counter() - self.t0
        self.kept["train_cpu_seconds"] += time.process_time() - self.c0
        self.t0, self.c0 = time.perf_counter(), time.process_time()

    def on_step(self, step: int, stats) -> None:
        """train_draft's ``on_step``: the training time, then validation where due."""
        self.train_time()  # kept with the state
        self.validate(step, stats)


def _train(job: _Run, data: SelfDistillData, states, objective: Objective, pad_token_id: int) -> list[StepStats] | None:
    """train_draft with validation and SIGTERM as a request to stop; None when stopped (the state and the
    draft so far saved)."""
    args = job.args
    resume, val_seconds = args.resume_state, 0.0
    if not (resume and Path(resume).is_file()):
        t = time.perf_counter()
        job.validate(0)
        val_seconds = time.perf_counter() - t  # what the last validation will take (a resumed call keeps it)
    stop = {"asked": False}

    def on_sigterm(_signum, _frame):  # a device call's time limit: finish the step, save, leave
        stop["asked"] = True

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    job.t0, job.c0 = time.perf_counter(), time.process_time()
    try:
        settings = TrainSettings(
            steps=args.steps,
            batch_size=args.batch_size,
            lr=args.lr,
            ttt_steps=args.ttt_steps,
            seed=args.seed,
            pad_token_id=pad_token_id,
            warmup=args.warmup,
            lr_floor=args.lr_floor,
            save_every=args.val_every,
            time_budget_s=args.time_budget_s,
            # The end: the last validation (as long as step 0's) and saving the draft and the state.
            reserve=val_seconds + END_SAVE_S,
            overhead_per_step=val_seconds / args.val_every,  # the validations every --val-every steps
            log_every=args.log_every,
            progress=True,
        )
        run = TrainRun(
            on_step=job.on_step,
            should_stop=lambda: stop["asked"],
            resume=resume,
            extra=job.kept,
            plan=job.plan,
            started=job.start,
        )
        return train_draft(job.draft, data, states, objective, settings, run)
    except Stopped as exc:
        out = save_checkpoint(job.draft, args.out, DTYPES[args.save_dtype], None)
        print(
            f"[eagle3] stopped after step {exc.step} of {job.plan['steps']} ({exc.reason}): state in {exc.path}, "
            f"the draft so far in {out}; run the same command again to continue",
            file=sys.stderr,
        )
        return None
    finally:
        signal.signal(signal.SIGTERM, previous)


def _final_stats(args: TrainEagle3, history: list[StepStats]) -> tuple[list[float], float]:
    """Prints how the loss moved and the last tenth of the steps' agreement; returns that agreement per draft
    step and the estimated accept length."""
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
    return acc, accept


def _finish(job: _Run, data: SelfDistillData, history: list[StepStats], vocab_source, capture_style: str) -> int:
    """The summary of the last steps, and the draft written with its training record."""
    import transformers  # heavy: already loaded with the target

    args, plan = job.args, job.plan

    acc, accept = _final_stats(args, history)
    extra = {
        "args": args.record(),
        "command": args.command_line,
        "sequences": len(data),
        "tokens": sum(min(len(x), args.seq_len) for x in data.sequences),
        "data_source": data.meta.get("source"),
        "vocab_source": vocab_source,
        "capture_style": capture_style,
        "loss": [h.loss for h in history],
        "train_top1": [h.accuracy for h in history],
        "train_accept_length": [h.accept_length for h in history],
        "validation": job.kept["curve"],
        "time_budget_s": args.time_budget_s,
        "probe": plan["probe"],  # the rate that fitted the steps (or the last call's)
        "refit": plan.get("refit"),  # the rate after the probe that fitted them again
        "fitted_steps": plan["steps"] if plan["fitted"] else None,
        "final_top1_per_step": acc,
        "final_estimated_accept_length": accept,
        "seconds": round(time.perf_counter() - job.start, 1),
        "data_seconds": round(job.data_seconds, 1),
        "data_cpu_seconds": round(job.data_cpu, 1),
        "train_seconds": round(job.kept["train_seconds"], 1),
        "train_cpu_seconds": round(job.kept["train_cpu_seconds"], 1),
        "threads": torch.get_num_threads(),
        "machine": {**machine(), "device": str(job.device)},
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": sys.version.split()[0],
        },
    }
    try:
        out = save_checkpoint(job.draft, args.out, DTYPES[args.save_dtype], extra)
    except OSError as exc:
        raise SpecVocabError(f"cannot write {args.out}: {exc.strerror or exc}") from None
    print(f"[eagle3] wrote {out}/config.json and {out}/model.safetensors")
    return 0
