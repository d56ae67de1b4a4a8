"""The policy lab: every config (plus the ``full`` baseline) over one prompt set, in one run.

For each question (all turns, the conversation carried forward as in Spec-Bench) and each
config, the reference decoder generates greedily; the lab collects per round the set size,
the accepted length and whether the target's tokens were in the set, and checks that every
config produced the same tokens (lossless). With ``batch`` > 1 the first turns are decoded
``batch`` at a time in lockstep over one table (one head call per draft step for the group).

With ``oracle`` (the default) every config runs a second time with the target as its own draft: there the
full head's accept length is the ceiling, so a config's fraction of it is the cost of its set alone. A weak
draft can gain from a set (its full-vocabulary choice, where the set leaves it out, was mostly wrong anyway,
and the set's best token now and then matches the target instead), which the oracle cannot.

With ``temperature`` > 0 the target samples (speculative sampling: the output is distributed as the
target's own sampling, ``tests/test_sampling.py``), so configs draw different tokens and the token check
does not apply; every config draws from the same seed per turn.
"""

from __future__ import annotations

import platform
import sys
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ... import __version__
from ...cache import cache_dir
from ...config import PolicyConfig
from ...errors import SpecVocabError
from ...policies import load_config, parse_config
from ...policies.base import fit_mismatch
from ..models import GEMMA3_270M, load_model
from ..prompts import DEFAULT_PROMPTS, format_prompt, load_questions
from ..train.checkpoint import checkpoint_fingerprint, read_checkpoint
from .decoder import CausalLM, DraftShape, Eagle3LM, Generation, SpeculativeDecoder, check_batch
from .rankers import draft_spec
from .report import trained_label

FULL = "full"


@dataclass
class LabSettings:
    configs: list[str]
    model: str = GEMMA3_270M
    draft_layers: int | None = 12  # self-draft depth; None: the draft is the target itself
    eagle3: str | None = None  # an EAGLE-3 draft directory (SGLang's format); replaces the self-draft
    shape: DraftShape = field(default_factory=DraftShape)
    max_new_tokens: int = 48
    questions: list[str] | None = None  # question sources, one after the other (None: the lab's own prompts)
    per_category: int | None = None
    turns: int | None = None  # the first N turns of each question (None: all)
    command: str = ""
    batch: int = 1  # questions decoded in lockstep (first turns only when > 1)
    oracle: bool = True  # also run every config with the target as its own draft
    temperature: float = 0.0
    seed: int = 0  # of the sampled runs' generators (one per turn, the same for every config)


def trained_draft(model: str) -> Path | None:
    """The EAGLE-3 draft ``sglang-specvocab train-eagle3 --head full`` leaves in the cache for
    ``model`` (the lab's default draft when it exists), else None."""
    path = cache_dir() / "drafts" / f"{Path(model).name}-eagle3-full"
    return path if (path / "config.json").is_file() else None


def draft_label(settings: LabSettings) -> str:
    if settings.eagle3 is not None:
        return f"EAGLE-3 draft {settings.eagle3}"
    if settings.draft_layers is None:
        return "target"
    return f"self-draft, first {settings.draft_layers} layers"


def trained_on(settings: LabSettings, decoders: dict) -> dict:
    """Per config whose policy loaded a trained ranker or router: the file, the recording it was fit on, and
    whether that was this run's model and draft (None: a file of an earlier version, which records nothing).
    A trained file fit on another draft's states still runs (a transfer may be what is asked), with a warning."""
    spec = "target" if settings.draft_layers is None else f"layers:{settings.draft_layers}"
    if settings.eagle3 is not None:
        spec = draft_spec(f"eagle3:{settings.eagle3}")
    # An EAGLE-3 draft is known by its fc weight, not its folder (a committed file names the folder it was fit in).
    trained = any(dec.policy.trained is not None for dec in decoders.values())
    fingerprint = None if settings.eagle3 is None or not trained else checkpoint_fingerprint(settings.eagle3)
    out = {}
    for name, dec in decoders.items():
        if dec.policy.trained is None:
            continue
        rec = dec.policy.trained["recording"]
        if rec is None:
            matches = None
        elif fingerprint is not None or rec.get("draft_fingerprint") is not None:
            matches = fit_mismatch(dec.policy.trained, fingerprint) is None and rec.get("model") == settings.model
        else:
            matches = (rec.get("draft"), rec.get("model")) == (spec, settings.model)
        out[name] = dec.policy.trained | {"matches": matches, "draft": spec, "model": settings.model}
        if matches is False:
            print(f"[lab] warning: {trained_label(name, out[name])}", file=sys.stderr)
    return out


def _named_configs(paths: list[str]) -> list[tuple[str, PolicyConfig]]:
    named = [(Path(p).stem, load_config(p)) for p in paths]
    names = [n for n, _ in named]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise SpecVocabError(f"config names must differ (file stems are used as names): {', '.join(dupes)}")
    if not any(cfg.policy == FULL for _, cfg in named):
        named.insert(0, (FULL, parse_config({"policy": FULL}, source="<built-in full baseline>")))
    return named


def versions() -> dict[str, str]:
    import transformers  # heavy: transformers

    return {
        "sglang_specvocab": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "threads": str(torch.get_num_threads()),
    }


@dataclass
class _Run:
    """One draft's pass over the questions with every config."""

    decoders: dict
    gens: dict  # (config, category) -> turns
    mismatches: list[str]
    complete: bool


def run_lab(settings: LabSettings, progress: bool = True) -> dict:
    named = _named_configs(settings.configs)  # bad configs fail before the model loads
    for _, cfg in named:
        check_batch(cfg, settings.batch)
    if not settings.temperature >= 0:
        raise SpecVocabError(f"--temperature = {settings.temperature!r} is invalid: must be >= 0")
    questions = [q for src in settings.questions or [None] for q in load_questions(src, settings.per_category)]
    questions = [replace(q, turns=q.turns[: settings.turns]) for q in questions]
    if settings.eagle3 is not None:
        read_checkpoint(settings.eagle3)  # a missing or foreign draft fails before the model loads
    lm = load_model(settings.model)
    for _, cfg in named:
        cfg.check_vocab(lm.vocab_size, settings.model)
    target = CausalLM(lm.model, name=settings.model)
    if settings.eagle3 is not None:
        draft = Eagle3LM.load(settings.eagle3, lm.model)
    else:
        draft = target if settings.draft_layers is None else CausalLM(lm.model, num_layers=settings.draft_layers)
    if progress:
        print(f"[lab] draft: {draft_label(settings)}", file=sys.stderr)
    run = _run_draft(settings, named, lm, target, draft, questions, progress, "lab")
    result = _result(settings, named, lm, run, trained_on(settings, run.decoders))
    result["oracle"] = None
    if settings.oracle and draft is not target and run.complete:
        if progress:
            print("[lab] oracle draft: the target drafting for itself (the set's cost alone)", file=sys.stderr)
        orc = _run_draft(settings, named, lm, target, target, questions, progress, "oracle")
        result["oracle"] = {
            "draft": "target",
            "rows": _rows(named, orc.gens),
            "lossless": _lossless(settings, orc),
            "mismatches": orc.mismatches,
            "complete": orc.complete,
        }
        result["complete"] = orc.complete
    return result


def _run_draft(settings: LabSettings, named, lm, target, draft, questions, progress: bool, desc: str) -> _Run:
    decoders = {
        name: SpeculativeDecoder(
            target, draft, cfg, settings.shape, eos_token_ids=lm.eos_token_ids, batch=settings.batch
        )
        for name, cfg in named
    }
    if settings.batch > 1:
        return _lockstep(settings, decoders, questions, lm, progress, desc)
    from tqdm import tqdm  # the lab extra (progress bars)

    gens: dict[tuple[str, str], list[Generation]] = defaultdict(list)  # (config, category) -> turns
    mismatches: list[str] = []
    total = sum(len(q.turns) for q in questions) * len(named)
    bar = tqdm(total=total, desc=desc, unit="gen", disable=not progress, file=sys.stderr)
    complete = True
    done = 0  # turns so far: each turn's generator seed
    try:
        for q in questions:
            answers: list[str] = []
            for t in range(len(q.turns)):
                ids = lm.encode(format_prompt(lm.tokenizer, list(q.turns[: t + 1]), answers))
                turn: dict[str, Generation] = {}
                for name, dec in decoders.items():
                    bar.set_postfix_str(f"{q.category} q{q.qid} {name}")
                    turn[name] = dec.generate(ids, settings.max_new_tokens, **_sampling(settings, done))
                    bar.update()
                done += 1
                for name, gen in turn.items():  # a turn counts once every config has run it
                    gens[(name, q.category)].append(gen)
                first = next(iter(turn.values())).tokens
                mismatches += [f"question {q.qid} turn {t + 1}: {n}" for n, g in turn.items() if g.tokens != first]
                answers.append(lm.decode(first))  # sampled: every config continues from the first config's answer
    except KeyboardInterrupt:
        complete = False
        print("\n[lab] interrupted: reporting the turns that finished", file=sys.stderr)
    finally:
        bar.close()
    return _Run(decoders, gens, mismatches, complete)


def _sampling(settings: LabSettings, n: int) -> dict:
    """generate's sampling arguments for the ``n``-th turn or group: a fresh generator with the same seed for
    every config, so configs start from the same draws."""
    if settings.temperature == 0:
        return {}
    return {"temperature": settings.temperature, "generator": torch.Generator().manual_seed(settings.seed * 100003 + n)}


def _lossless(settings: LabSettings, run: _Run) -> bool | None:
    """Greedy: every config produced the same tokens. Sampled: None (the configs' samples differ by design)."""
    return None if settings.temperature > 0 else not run.mismatches


def _lockstep(settings: LabSettings, decoders: dict, questions, lm, progress: bool, desc: str) -> _Run:
    """``--batch B``: first turns, B questions at a time in lockstep; groups take questions in a stride over the
    file so a group mixes categories as a serving batch does."""
    from tqdm import tqdm  # the lab extra (progress bars)

    B = settings.batch
    prompts = [lm.encode(format_prompt(lm.tokenizer, [q.turns[0]], [])) for q in questions]
    order = sorted(range(len(questions)), key=lambda i: i % max(1, len(questions) // B))
    groups = [order[i : i + B] for i in range(0, len(order), B)]
    gens: dict[tuple[str, str], list[Generation]] = defaultdict(list)
    mismatches: list[str] = []
    bar = tqdm(total=len(groups) * len(decoders), desc=desc, unit="batch", disable=not progress, file=sys.stderr)
    complete = True
    try:
        for g, group in enumerate(groups):
            outs = {}
            for name, dec in decoders.items():
                bar.set_postfix_str(f"{len(group)} questions, {name}")
                batch = [prompts[i] for i in group]
                outs[name] = dec.generate_batch(batch, settings.max_new_tokens, **_sampling(settings, g))
                bar.update()
            for j, i in enumerate(group):  # a group counts once every config has run it
                for name in decoders:
                    gens[(name, questions[i].category)].append(outs[name][j])
                first = outs[next(iter(decoders))][j].tokens
                mismatches += [f"question {questions[i].qid}: {n}" for n in decoders if outs[n][j].tokens != first]
    except KeyboardInterrupt:
        complete = False
        print("\n[lab] interrupted: reporting the groups that finished", file=sys.stderr)
    finally:
        bar.close()
    return _Run(decoders, gens, mismatches, complete)


def head_label(dec: SpeculativeDecoder) -> str:
    """How a config's draft head scored the batch."""
    h = dec.head
    if h.table is None:
        return "stock (dense)"
    return f"union, union_view {h.union_view}" if h.batch.startswith("union") else h.batch


def head_reads(dec: SpeculativeDecoder) -> dict:
    """What one draft step reads, for the report's modelled cost: the entries that choose the set (a ranker's, a
    router's), the head's rows (a d2t draft's own rows, not the target's vocabulary) and the hidden size; the set's
    rows come from the measured set sizes."""
    weight = dec.draft.weight
    return {
        "selection": int(dec.policy.selection_reads()),
        "head_rows": int(getattr(dec.draft, "head_size", weight.shape[0])),
        "hidden": int(weight.shape[1]),
    }


def _rows(named, gens) -> list[dict]:
    policy_of = {name: cfg.policy for name, cfg in named}
    categories = sorted({cat for _, cat in gens})
    rows = []
    for name, _ in named:
        for cat in [*categories, "overall"]:
            turns = [g for c in categories if cat in (c, "overall") for g in gens[(name, c)]]
            rows.append(_row(name, policy_of[name], cat, turns))
    return rows


def _result(settings: LabSettings, named, lm, run: _Run, trained: dict) -> dict:
    return {
        "rows": _rows(named, run.gens),
        "model": settings.model,
        "vocab_size": lm.vocab_size,
        "draft": draft_label(settings),
        "draft_shape": {
            "steps": settings.shape.steps,
            "topk": settings.shape.topk,
            "num_draft_tokens": settings.shape.num_draft_tokens,
        },
        "batch": settings.batch,
        "temperature": settings.temperature,
        "seed": settings.seed,
        "heads": {name: head_label(dec) for name, dec in run.decoders.items()},
        "union_overflow": {name: int(dec.head.union_overflow) for name, dec in run.decoders.items()},
        "head_reads": {name: head_reads(dec) for name, dec in run.decoders.items()},
        "max_new_tokens": settings.max_new_tokens,
        "prompts": " + ".join(settings.questions) if settings.questions else DEFAULT_PROMPTS,
        "per_category": settings.per_category,
        "turns": settings.turns,
        "complete": run.complete,
        "lossless": _lossless(settings, run),
        "mismatches": run.mismatches if settings.temperature == 0 else [],
        "trained_on": trained,
        "versions": versions(),
        "command": settings.command,
    }


def _row(config: str, policy: str, category: str, turns: list[Generation]) -> dict:
    rounds = [r for g in turns for r in g.rounds]
    committed = sum(r.committed for r in rounds)
    speeds = [len(g.tokens) / g.seconds for g in turns if g.seconds > 0]
    return {
        "config": config,
        "policy": policy,
        "category": category,
        "accept_length": committed / len(rounds) if rounds else 0.0,
        "coverage": sum(r.in_set for r in rounds) / checked if (checked := sum(r.checked for r in rounds)) else 1.0,
        "mean_set_size": sum(r.set_size for r in rounds) / len(rounds) if rounds else 0.0,
        "mean_union_size": sum(r.union_size for r in rounds) / len(rounds) if rounds else 0.0,
        "max_set_size": max((r.set_size for r in rounds), default=0),
        "tokens_per_s": sum(speeds) / len(speeds) if speeds else 0.0,  # Spec-Bench: mean of per-prompt speeds
        "n_prompts": len(turns),
    }
