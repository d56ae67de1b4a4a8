#!/usr/bin/env python3
"""Check that DYNVOCAB's greedy outputs equal the target alone's on SGLang servers.

Sends the same Spec-Bench prompts (first turns) through ``/v1/chat/completions``,
``/v1/completions`` and ``/generate`` at concurrency 1 and 8 to every configuration and compares
each output with the first configuration's (logic and rules: ``sglang_specvocab/lossless.py``).
Writes ``OUT/NAME.json`` and ``OUT/NAME.md``; server logs go to ``OUT/logs``; finished requests are
cached in ``OUT/NAME-cache.jsonl`` (rerun the same command to resume). Exit code 0: every DYNVOCAB
output equals the reference; 1: some differ; 2: the check could not run.

Examples:

    # the issue's set on tiny random checkpoints (made if missing): no speculation, EAGLE3 and
    # DYNVOCAB with the d2t and full-vocabulary drafts, chains and trees, CUDA graphs on
    python scripts/check_lossless.py --tiny /tmp/tiny --out benchmarks/lossless-tiny-h100

    # any servers: the first --config is the reference
    python scripts/check_lossless.py --out out/ \\
        --config name=target,args="--model-path M" \\
        --config name=dynvocab,args="--model-path M --speculative-algorithm DYNVOCAB --speculative-draft-model-path D"
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from sglang_specvocab.bench.lossless import (
    LosslessSettings,
    check_tiny_names,
    markdown,
    run_lossless,
    tiny_configs,
    write_report,
)
from sglang_specvocab.bench.server import (
    ServerSettings,
    SpecBenchError,
    load_config_file,
    parse_config_spec,
    sigterm_as_interrupt,
)
from sglang_specvocab.errors import SpecVocabError
from sglang_specvocab.prompts import round_robin_prompts

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_QUESTIONS = ROOT.parent / "shared" / "data" / "spec_bench" / "question.jsonl"


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="results, cache and server logs go here")
    p.add_argument("--tiny", type=Path, metavar="DIR",
                   help="the tiny-checkpoint server set (scripts/make_tiny_checkpoints.py; made here if missing)")
    p.add_argument("--only", metavar="NAME,NAME", help="with --tiny: only these configs (the reference always runs)")
    p.add_argument("--server-args", default="", metavar="ARGS", help="with --tiny: extra server arguments for all")
    p.add_argument("--dynvocab-config", metavar="YAML", help="with --tiny: --speculative-dynvocab-config of DYNVOCAB")
    p.add_argument("--config", action="append", default=[], metavar="SPEC",
                   help='name=NAME,args="SERVER ARGS" or name=NAME,algorithm=ALG,url=URL (repeatable)')
    p.add_argument("--configs", type=Path, metavar="YAML", help="a file of configurations (bench_specbench's format)")
    p.add_argument("--questions", type=Path, metavar="JSONL",
                   help=f"Spec-Bench questions (default: {DEFAULT_QUESTIONS})")
    p.add_argument("--prompts", type=int, default=50, metavar="N", help="prompts, round-robin over categories (50)")
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N", help="per request (default: 64)")
    p.add_argument("--concurrency", default="1,8", metavar="N,N", help="requests in flight (default: 1,8)")
    p.add_argument("--routes", default="chat,completions,generate", metavar="R,R",
                   help="chat, completions, generate (default: all three)")
    p.add_argument("--warmup", type=int, default=1, metavar="N", help="unrecorded requests per server (default: 1)")
    p.add_argument("--server-timeout", type=float, default=900.0, metavar="S", help="seconds to become healthy")
    p.add_argument("--request-timeout", type=float, default=600.0, metavar="S", help="seconds per request")
    p.add_argument("--launcher", default=f"{shlex.quote(sys.executable)} -m sglang.launch_server", metavar="CMD",
                   help="command that launches a server (default: %(default)s)")
    p.add_argument("--host", default="127.0.0.1", help="host for launched servers (default: %(default)s)")
    p.add_argument("--cache", type=Path, metavar="JSONL", help="result cache (default: OUT/NAME-cache.jsonl)")
    p.add_argument("--name", default="lossless", help="file name stem of the results (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    if args.prompts < 1 or args.max_new_tokens < 1 or args.warmup < 0:
        p.error("--prompts and --max-new-tokens must be at least 1, --warmup at least 0")
    try:
        args.concurrency = tuple(int(c) for c in _csv(args.concurrency))
    except ValueError:
        p.error(f"--concurrency must be integers separated by commas, got {args.concurrency!r}")
    if not args.concurrency or min(args.concurrency) < 1:
        p.error("--concurrency values must be at least 1")
    args.routes = tuple(_csv(args.routes))
    if args.tiny is None and (args.only or args.server_args or args.dynvocab_config):
        p.error("--only, --server-args and --dynvocab-config go with --tiny")
    if args.tiny is None and not args.config and args.configs is None:
        p.error("give --tiny DIR, or --config/--configs (the first configuration is the reference)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = shlex.join(["python", "scripts/check_lossless.py", *(sys.argv[1:] if argv is None else argv)])
    try:
        configs = []
        if args.tiny is not None:
            only = _csv(args.only) if args.only else None
            check_tiny_names(only)  # before minutes of making checkpoints
            if not (args.tiny / "target" / "config.json").is_file():
                from sglang_specvocab.testing.tiny import make_tiny_checkpoints

                print(f"making the tiny checkpoints in {args.tiny}", flush=True)
                make_tiny_checkpoints(args.tiny)
            configs += tiny_configs(args.tiny, shlex.split(args.server_args), args.dynvocab_config, only)
        configs += load_config_file(args.configs) if args.configs is not None else []
        configs += [parse_config_spec(spec) for spec in args.config]
        questions = args.questions or DEFAULT_QUESTIONS
        if not questions.is_file():
            raise SpecBenchError(f"questions file {questions}: no such file (pass --questions)")
        prompts = round_robin_prompts(questions, args.prompts)
        launcher = shlex.split(args.launcher)
        if not launcher:
            raise SpecBenchError("--launcher is empty")
        settings = LosslessSettings(
            max_new_tokens=args.max_new_tokens, concurrencies=args.concurrency, routes=args.routes,
            server=ServerSettings(warmup=args.warmup, server_timeout=args.server_timeout,
                                 request_timeout=args.request_timeout, host=args.host, launcher=launcher),
        )
        print(f"{len(prompts)} prompts x {len(settings.routes)} routes x concurrency "
              f"{','.join(map(str, settings.concurrencies))} x {len(configs)} configurations (reference: "
              f"{configs[0].name if configs else '-'})", flush=True)
        with sigterm_as_interrupt():
            cache = args.cache or args.out / f"{args.name}-cache.jsonl"
            result = run_lossless(configs, prompts, settings, cache_path=cache, log_dir=args.out / "logs",
                                  command=command, progress=not args.no_progress)
    except SpecVocabError as exc:
        print(f"check_lossless: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("check_lossless: interrupted; finished requests are cached, rerun the same command to resume",
              file=sys.stderr)
        return 130
    paths = write_report(result, args.out, args.name)
    print()
    print(markdown(result), end="")
    for path in paths:
        print(f"wrote {path}")
    return 0 if result["lossless"] else 1


if __name__ == "__main__":
    sys.exit(main())
