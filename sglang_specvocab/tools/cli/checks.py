"""The checks' subcommands: check-config, check-lossless, tiny-checkpoints; each parser beside its runner."""

from __future__ import annotations

import json
from pathlib import Path

from ..bench.lossless import CHECKS  # the plain-Python side of bench/: --help imports no torch
from ._args import (
    POSITIVE,
    RAW,
    choices_csv,
    csv_list,
    int_csv,
    positive_float,
)
from .bench import add_server_args


def _add_check_config(sub) -> None:
    p = sub.add_parser("check-config", help="validate a policy config and print it resolved")
    p.add_argument("config", metavar="YAML")
    p.add_argument("--vocab-size", type=POSITIVE, default=None, help="also check the capacity against this vocabulary")
    p.set_defaults(run=_run_check_config)


def _run_check_config(args) -> int:
    from ...policies import load_config  # heavy: torch (the policies)

    cfg = load_config(args.config)
    cfg.check_files()
    if args.vocab_size is not None:
        cfg.check_vocab(args.vocab_size, f"--vocab-size {args.vocab_size}")
    print(json.dumps({"source": cfg.source, **cfg.model_dump()}, indent=2))
    return 0


CHECK_LOSSLESS = """\
Check that DYNVOCAB is lossless on SGLang servers: each configuration is launched once and runs
the checks (--checks); every DYNVOCAB result is compared with the target alone (the first
configuration, the reference) and with its EAGLE3 control (the EAGLE3 configuration with the same
server arguments but the algorithm and --speculative-dynvocab-config; or the one named by
control=NAME).

  greedy    the same Spec-Bench prompts (first turns, round-robin over categories) through
            /v1/chat/completions, /v1/completions and /generate at concurrency 1 and 8;
  sampling  temperature > 0: --samples continuations of --sample-tokens tokens per prompt; per
            prompt and position a chi-square test of homogeneity of the token counts, rejecting at
            p < --alpha / m (Bonferroni over the m tests that can fail the run: an exact server set
            fails with probability at most --alpha);
  load      --load-requests concurrent mixed requests (prompts of 1 to --load-max-prompt
            characters, greedy and sampled, chat, completions and generate, streamed or not, some
            aborted mid-stream or by /abort_request) against each DYNVOCAB server and its control: the
            server survives, every finished greedy output equals the control's, every finished
            non-streamed /generate request carries DYNVOCAB's telemetry.

A DYNVOCAB result that differs from the target but equals its control is the engine's numerics
(reported); one that differs from its control is ours (exit 1). A prompt longer than the served
context is skipped and counted. Writes OUT/NAME.json and OUT/NAME.md; server logs go to OUT/logs;
finished requests are cached in OUT/NAME-cache.jsonl (rerun the same command to resume). Exit
status 0: no DYNVOCAB result differs from its control; 1: some do (or a load run failed); 2: the
check could not run.

Examples:

    # on tiny random checkpoints (made if missing; fp32 where served, the target is batch-invariant
    # there): no speculation, EAGLE3 and DYNVOCAB with the d2t and full-vocabulary drafts, chains and trees
    sglang-specvocab check-lossless --tiny /tmp/tiny --checks greedy,sampling \\
        --out benchmarks/lossless-tiny-h100

    # any servers: the first --config is the reference
    sglang-specvocab check-lossless --out out/ \\
        --config name=target,args="--model-path M" \\
        --config name=eagle3,args="--model-path M --speculative-algorithm EAGLE3 --speculative-draft-model-path D" \\
        --config name=dynvocab,args="--model-path M --speculative-algorithm DYNVOCAB --speculative-draft-model-path D"
"""


def _add_check_lossless(sub) -> None:
    p = sub.add_parser(
        "check-lossless",
        help="DYNVOCAB's outputs (greedy, sampled, under load) against the target alone's and EAGLE3's",
        description=CHECK_LOSSLESS,
        formatter_class=RAW,
    )
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="results, cache and server logs go here")
    p.add_argument(
        "--checks",
        type=choices_csv(CHECKS),
        default=["greedy"],
        metavar="C,C",
        help="greedy, sampling, load (default: greedy)",
    )
    p.add_argument(
        "--tiny",
        type=Path,
        metavar="DIR",
        help="the tiny-checkpoint server set (sglang-specvocab tiny-checkpoints; made here if missing)",
    )
    p.add_argument(
        "--only",
        type=csv_list,
        metavar="NAME,NAME",
        help="with --tiny: only these configs (the reference and the DYNVOCAB ones' controls always run)",
    )
    p.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16"),
        help="with --tiny: the checkpoints' and servers' dtype, in DIR/DTYPE (default auto: float32, where the "
        "target is batch-invariant; bfloat16 where a float32 server does not start, the reason in "
        "DIR/float32.unserved)",
    )
    p.add_argument("--server-args", default="", metavar="ARGS", help="with --tiny: extra server arguments for all")
    p.add_argument("--dynvocab-config", metavar="YAML", help="with --tiny: --speculative-dynvocab-config of DYNVOCAB")
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="SPEC",
        help='name=NAME,args="SERVER ARGS" or name=NAME,algorithm=ALG,url=URL[,control=NAME] (repeatable)',
    )
    p.add_argument("--configs", type=Path, metavar="YAML", help="a file of configurations (bench specbench's format)")
    p.add_argument(
        "--questions",
        type=Path,
        metavar="JSONL",
        help="Spec-Bench questions (default: the file beside a source checkout)",
    )
    _add_lossless_checks(p)
    p.add_argument("--cache", type=Path, metavar="JSONL", help="result cache (default: OUT/NAME-cache.jsonl)")
    p.add_argument("--name", default="lossless", help="file name stem of the results (default: %(default)s)")
    add_server_args(p, warmup=1, request_timeout=600.0)
    p.set_defaults(
        run=_run_check_lossless, on_interrupt="finished requests are cached, rerun the same command to resume"
    )


def _add_lossless_checks(p) -> None:
    """The settings of each check: greedy, sampling, load."""
    g = p.add_argument_group("greedy")
    g.add_argument(
        "--prompts", type=POSITIVE, default=50, metavar="N", help="prompts, round-robin over categories (50)"
    )
    g.add_argument(
        "--max-new-tokens",
        type=POSITIVE,
        default=64,
        metavar="N",
        help="the longest request (default: 64); prompts take N, 7N/8, 6N/8, 5N/8 in turn, so requests in flight "
        "together end at different steps and several captured batch sizes replay",
    )
    g.add_argument(
        "--concurrency", type=int_csv, default=[1, 8], metavar="N,N", help="requests in flight (default: 1,8)"
    )
    g.add_argument(
        "--routes",
        type=csv_list,
        default=["chat", "completions", "generate"],
        metavar="R,R",
        help="chat, completions, generate (default: all three)",
    )
    g = p.add_argument_group("sampling")
    g.add_argument("--sampling-prompts", type=POSITIVE, default=8, metavar="N", help="prompts (default: 8)")
    g.add_argument("--samples", type=POSITIVE, default=480, metavar="N", help="samples per prompt (default: 480)")
    g.add_argument("--sample-tokens", type=POSITIVE, default=4, metavar="N", help="tokens per sample (default: 4)")
    g.add_argument(
        "--sampling-temperature",
        type=positive_float,
        default=0.3,
        metavar="T",
        help="temperature (default: 0.3; the tiny random target is nearly flat at 1, and a flat distribution "
        "gives the test nothing to compare)",
    )
    g.add_argument("--sampling-top-k", type=POSITIVE, default=None, metavar="K", help="top_k (default: none)")
    g.add_argument(
        "--alpha",
        type=positive_float,
        default=0.01,
        metavar="A",
        help="bound on the chance that an exact server set fails the sampling check (default: 0.01)",
    )
    g = p.add_argument_group("load")
    g.add_argument("--load-requests", type=POSITIVE, default=1000, metavar="N", help="requests (default: 1000)")
    g.add_argument(
        "--load-concurrency", type=POSITIVE, default=None, metavar="N", help="in flight (default: all of them)"
    )
    g.add_argument(
        "--load-max-prompt", type=POSITIVE, default=4096, metavar="N", help="longest prompt, characters (4096)"
    )
    g.add_argument("--load-seed", type=int, default=0, metavar="S", help="seed of the request mix (default: 0)")


def _run_check_lossless(args) -> int:
    from ..bench.lossless import run  # heavy: the tiny checkpoints need transformers

    return run(args)


def _add_tiny_checkpoints(sub) -> None:
    p = sub.add_parser(
        "tiny-checkpoints",
        help="write tiny random checkpoints (a Llama target, two EAGLE-3 drafts) for tests and first GPU runs",
        description="Writes DIR/target (a random Llama with an offline tokenizer), DIR/draft-d2t (an EAGLE-3 draft "
        "with its own 32768-token head and d2t) and DIR/draft-full (an EAGLE-3 draft that borrows the target's "
        "full-vocabulary LM head). Deterministic for a seed. Serve them with, e.g., python -m "
        "sglang.launch_server --model-path DIR/target --speculative-algorithm EAGLE3 "
        "--speculative-draft-model-path DIR/draft-d2t",
    )
    p.add_argument("--out", required=True, help="directory to write (must be empty or absent, unless --force)")
    p.add_argument("--vocab", type=POSITIVE, default=128256, help="target vocabulary size (default: %(default)s)")
    p.add_argument(
        "--draft-vocab", type=POSITIVE, default=32768, help="d2t draft vocabulary size (default: %(default)s)"
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    p.add_argument("--force", action="store_true", help="overwrite the target/draft folders of a non-empty --out")
    p.set_defaults(run=_run_tiny_checkpoints)


def _run_tiny_checkpoints(args) -> int:
    from ..testing.tiny import make_tiny_checkpoints  # heavy: transformers

    ck = make_tiny_checkpoints(
        args.out, vocab_size=args.vocab, seed=args.seed, force=args.force, draft_vocab_size=args.draft_vocab
    )
    print(ck.summary())
    return 0


def add(sub) -> None:
    for add_one in (_add_check_config, _add_check_lossless, _add_tiny_checkpoints):
        add_one(sub)
