#!/usr/bin/env python
"""Spec-Bench on SGLang servers: speed, accepted length and speedup of each configuration, per category.

Run ``python scripts/bench_specbench.py --help`` for the options; the logic is sglang_specvocab.specbench.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from sglang_specvocab.bench.server import (
    SpecBenchError,
    check_unique,
    load_config_file,
    parse_config_spec,
    sigterm_as_interrupt,
)
from sglang_specvocab.bench.specbench import PROMPT_FORMATS, BenchSettings, run_bench
from sglang_specvocab.bench.specbench_report import markdown, write_report
from sglang_specvocab.errors import SpecVocabError
from sglang_specvocab.prompts import load_bench_questions

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_QUESTIONS = ROOT.parent / "shared" / "data" / "spec_bench" / "question.jsonl"

DESCRIPTION = f"""\
Run Spec-Bench (480 questions: MT-Bench's two-turn conversations, translation, summarization,
QA, GSM8K math, RAG) against one SGLang server per configuration, one configuration after the
other. A configuration either launches a server (python -m sglang.launch_server ARGS, waiting for
/health; --host/--port are added unless ARGS has them; its log goes to OUT/logs/NAME.log) or
reaches a running one by URL. The first configuration is the baseline of the speedups.

--config (repeatable; keys name, algorithm, args, url, env, launcher; quote values with commas):
  --config 'name=ar,args="--model-path M --attention-backend triton"'
  --config 'name=eagle3,args="--model-path M --speculative-algorithm EAGLE3 --speculative-draft-model-path D"'
  --config name=dynvocab,algorithm=DYNVOCAB,url=http://127.0.0.1:30000
--configs FILE.yaml: a list (or 'configs:' list) of mappings with the same keys, e.g.
  - name: ar
    args: --model-path M --attention-backend triton
  - name: dynvocab
    algorithm: DYNVOCAB          # a label: none|EAGLE|EAGLE3|DYNVOCAB|NGRAM|STANDALONE
    args: [--model-path, M, --speculative-algorithm, EAGLE3, --speculative-draft-model-path, D]
    env: {{SGLANG_DYNVOCAB: "1"}}
Configurations of --configs come first, then those of --config. 'algorithm' defaults to the
--speculative-algorithm in args (else none); a url configuration must state it.

Prompts: the conversation is rendered with the served model's chat template (tokenizer from
--tokenizer or the server's /model_info), tokenized client-side (the template carries BOS) and
sent as input_ids to /generate, whose meta_info has completion_tokens, spec_verify_ct,
e2e_latency and the DYNVOCAB telemetry (dynvocab_set_size, dynvocab_coverage). MT-Bench's second
turn includes the configuration's own first answer. --prompt-format plain sends a
"Question: ...\\nAnswer:" transcript instead (for base models without a template).

Measured as Spec-Bench does: per question, tokens/s = completion tokens / time (turns summed; time
is the server's e2e_latency); a configuration's tokens/s is the mean over questions; speedup is the
ratio of mean per-question tokens/s to the first configuration's (over the questions both
finished); accept length = completion tokens / verify steps. MT-Bench's eight categories are
reported together as mt_bench.

Resumable: every finished turn is appended to the cache (default OUT/specbench-cache.jsonl), keyed
by configuration, settings, question and turn; a rerun skips cached turns and starts no server for
a configuration that is complete. Writes OUT/NAME.json, OUT/NAME.md and OUT/NAME.png.

Default questions: {DEFAULT_QUESTIONS}
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", action="append", default=[], metavar="SPEC", help="a configuration (repeatable)")
    p.add_argument("--configs", type=Path, metavar="YAML", help="a file of configurations")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="results, cache and server logs go here")
    p.add_argument("--questions", type=Path, default=None, metavar="JSONL",
                   help="Spec-Bench question file (default: the shared copy, see below)")
    p.add_argument("--limit-per-category", type=int, metavar="N",
                   help="first N questions of each category (mt_bench: its eight subcategories in turn)")
    p.add_argument("--categories", metavar="CAT,CAT", help="only these categories (e.g. mt_bench,translation)")
    p.add_argument("--concurrency", type=int, default=1, metavar="N", help="questions in flight at once (default: 1)")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T", help="sampling temperature (default: 0, greedy)")
    p.add_argument("--max-new-tokens", type=int, default=1024, metavar="N", help="per turn (default: 1024, as Spec-Bench)")
    p.add_argument("--prompt-format", choices=PROMPT_FORMATS, default="auto",
                   help="chat: the tokenizer's chat template; plain: a Question:/Answer: transcript; "
                        "auto: chat when the tokenizer has a template (default)")
    p.add_argument("--tokenizer", metavar="PATH", help="tokenizer for prompts (default: the server's tokenizer_path)")
    p.add_argument("--warmup", type=int, default=2, metavar="N", help="untimed requests per server before timing (default: 2)")
    p.add_argument("--server-timeout", type=float, default=900.0, metavar="S",
                   help="seconds a server may take to become healthy (default: 900)")
    p.add_argument("--request-timeout", type=float, default=1800.0, metavar="S",
                   help="seconds one request may take (default: 1800)")
    p.add_argument("--launcher", default=f"{shlex.quote(sys.executable)} -m sglang.launch_server", metavar="CMD",
                   help="command that starts a server, before its args (default: this Python -m sglang.launch_server)")
    p.add_argument("--host", default="127.0.0.1", help="host for launched servers (default: %(default)s)")
    p.add_argument("--cache", type=Path, metavar="JSONL", help="per-turn result cache (default: OUT/specbench-cache.jsonl)")
    p.add_argument("--name", default="specbench", help="file name stem of the results (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    for name in ("limit_per_category", "concurrency", "max_new_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    for name in ("warmup", "temperature"):
        if getattr(args, name) < 0:
            p.error(f"--{name} must not be negative, got {getattr(args, name)}")
    for name in ("server_timeout", "request_timeout"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if not args.config and args.configs is None:
        p.error("give at least one --config or a --configs file")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = shlex.join(["python", "scripts/bench_specbench.py", *(sys.argv[1:] if argv is None else argv)])
    try:
        configs = (load_config_file(args.configs) if args.configs is not None else []) + [
            parse_config_spec(spec) for spec in args.config
        ]
        check_unique(configs)
        questions_path = args.questions or DEFAULT_QUESTIONS
        if args.questions is None and not questions_path.is_file():
            raise SpecBenchError(f"no --questions given and the default {questions_path} does not exist")
        categories = [c.strip() for c in args.categories.split(",") if c.strip()] if args.categories else None
        questions = load_bench_questions(questions_path, args.limit_per_category, categories)
        launcher = shlex.split(args.launcher)
        if not launcher:
            raise SpecBenchError("--launcher is empty")
        settings = BenchSettings(
            temperature=args.temperature, max_new_tokens=args.max_new_tokens, concurrency=args.concurrency,
            prompt_format=args.prompt_format, tokenizer=args.tokenizer, warmup=args.warmup,
            server_timeout=args.server_timeout, request_timeout=args.request_timeout, host=args.host,
            launcher=launcher,
        )
        turns = sum(len(q.turns) for q in questions)
        print(f"{len(questions)} questions ({turns} turns) x {len(configs)} configurations: "
              + ", ".join(f"{c.name} ({c.algorithm})" for c in configs), flush=True)
        with sigterm_as_interrupt():
            cache = args.cache or args.out / "specbench-cache.jsonl"
            result = run_bench(configs, questions, settings, cache_path=cache, log_dir=args.out / "logs",
                               command=command, progress=not args.no_progress)
    except SpecVocabError as exc:  # SpecBenchError and the question loader's errors
        print(f"bench_specbench: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench_specbench: interrupted; finished turns are cached, rerun the same command to resume",
              file=sys.stderr)
        return 130
    paths = write_report(result, args.out, args.name)
    print()
    print(markdown(result), end="")
    print()
    for path in paths:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
