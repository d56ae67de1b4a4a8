"""Spec-Bench against SGLang servers: launch or reach each configuration (``server``), time every question.

How a question is asked: the client renders the conversation with the served model's chat template
(the tokenizer SGLang itself loads: ``--tokenizer`` or the server's ``/model_info``), tokenizes it
without adding special tokens (the template carries BOS, as in SGLang's own chat path) and POSTs the
ids to ``/generate``. ``/generate`` rather than ``/v1/chat/completions`` because its ``meta_info``
carries everything per request (``completion_tokens``, ``spec_verify_ct``, ``e2e_latency`` and any
extra fields such as DYNVOCAB's ``dynvocab_set_size``/``dynvocab_coverage``), whereas the OpenAI
route keeps only ``usage`` plus a fixed set of spec fields; and sending ids means every
configuration gets exactly the same prompt tokens. MT-Bench's second turn is asked with the
configuration's own first answer in the conversation.

At temperature 0 the report also compares the greedy outputs (``specbench_report.parity``): each
configuration against the first, each DYNVOCAB configuration against its EAGLE3 control; ``run``
exits 1 when a DYNVOCAB turn differs from both its control and the target.

Several concurrencies (``run_bench_levels``, ``--concurrency 1,8``): each server is started once and
asked at every concurrency in turn (warmed up once), before the next configuration's starts; one
result per concurrency. The concurrency is in the settings ``fingerprint``, so in every turn's key: a
turn cached at one concurrency is never used for another.

Results are cached per turn (``ResultCache``, ``turn_key``); ``specbench_report`` makes the table.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

from ..prompts import Question, format_prompt, load_bench_questions, spec_bench_file
from .lossless import controls
from .server import (
    ResultCache,
    Server,
    ServerConfig,
    ServerSettings,
    SpecBenchError,
    check_unique,
    config_fingerprint,
    configs_from_args,
    device_name,
    http_json,
    model_info,
    run_concurrently,
    server_settings,
    sigterm_as_interrupt,
    telemetry,
    versions,
)
from .specbench_report import Decode, markdown, parity, parity_failures, summarize, write_report
from .specbench_targets import targets

PROMPT_FORMATS = ("auto", "chat", "plain")
_PLAIN = SimpleNamespace(chat_template=None)  # makes format_prompt write its plain Question:/Answer: transcript


@dataclass
class BenchSettings(ServerSettings):
    temperature: float = 0.0
    max_new_tokens: int = 1024
    concurrency: int = 1
    prompt_format: str = "auto"  # auto: the chat template when the tokenizer has one, else a plain transcript
    tokenizer: str | None = None  # default: the server's /model_info tokenizer_path


def fingerprint(config: ServerConfig, settings: BenchSettings) -> str:
    """What a cached result depends on: a change of any of these re-runs the question."""
    facts = {
        "temperature": settings.temperature,
        "max_new_tokens": settings.max_new_tokens,
        "concurrency": settings.concurrency,
        "prompt_format": settings.prompt_format,
        "tokenizer": settings.tokenizer,
    }
    return config_fingerprint(config, facts)


def turn_key(config: str, fp: str, q: Question, turn: int) -> str:
    """The cache key of one turn: configuration, settings, question (id and text) and turn."""
    return f"{config}|{fp}|{q.qid}|{turn}|{_question_hash(q)}"


def _question_hash(q: Question) -> str:
    return hashlib.sha256(json.dumps([q.category, list(q.turns)]).encode()).hexdigest()[:12]


# --- running ------------------------------------------------------------------------------------


def prompt_ids(tokenizer, prompt_format: str, turns: list[str], answers: list[str]) -> list[int]:
    """Token ids of the conversation so far, ready for the model's next answer."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if prompt_format == "chat" or (prompt_format == "auto" and has_template):
        if not has_template:
            raise SpecBenchError(
                "the tokenizer has no chat template (--prompt-format chat); use --prompt-format plain, or a "
                "checkpoint with a template (sglang-specvocab convert-gemma3 --chat-template gemma)"
            )
        # The template writes BOS itself: encode without adding specials, as SGLang's chat route does.
        return tokenizer(format_prompt(tokenizer, turns, answers), add_special_tokens=False).input_ids
    return tokenizer(format_prompt(_PLAIN, turns, answers)).input_ids  # the tokenizer adds BOS if it does


def _load_tokenizer(path: str):
    from transformers import AutoTokenizer  # heavy: transformers

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise SpecBenchError(f"cannot load the tokenizer from {path!r}: {exc}") from None


def _decoder(tokenizers: dict, settings: BenchSettings, records: dict[str, list[dict]]) -> Decode:
    """A token id's text (None when no tokenizer can be had), with the tokenizer the prompts were made with:
    ``--tokenizer``, else the one the turns name (loaded on first use when this run loaded none)."""

    def decode(token_id: int) -> str | None:
        path = settings.tokenizer or next(
            (r["tokenizer"] for rs in records.values() for r in rs if r.get("tokenizer")), None
        )
        if path is not None and path not in tokenizers:
            try:
                tokenizers[path] = _load_tokenizer(path)
            except SpecBenchError:
                return None
        tokenizer = tokenizers.get(path) if path is not None else next(iter(tokenizers.values()), None)
        return None if tokenizer is None else tokenizer.decode([token_id])

    return decode


def _record(
    response, key: str, config: ServerConfig, fp: str, q: Question, turn: int, wall: float, tokenizer: str
) -> dict:
    if isinstance(response, list) and len(response) == 1:
        response = response[0]
    if not isinstance(response, dict):
        raise SpecBenchError(f"/generate returned {type(response).__name__}, expected a JSON object")
    meta = response.get("meta_info")
    if not isinstance(meta, dict):
        raise SpecBenchError(f"/generate reply has no meta_info object: {json.dumps(response)[:300]}")
    text = response.get("text")
    if not isinstance(text, str):
        raise SpecBenchError(
            "/generate reply has no 'text' (a server started with --skip-tokenizer-init cannot be used)"
        )
    tokens = meta.get("completion_tokens")
    if not isinstance(tokens, int):
        raise SpecBenchError(f"/generate meta_info has no integer completion_tokens: {json.dumps(meta)[:300]}")
    e2e = meta.get("e2e_latency")
    e2e = float(e2e) if isinstance(e2e, (int, float)) and not isinstance(e2e, bool) and e2e > 0 else None
    verify = meta.get("spec_verify_ct")
    ids = response.get("output_ids")  # the tokens themselves: greedy parity names the first that differs
    ids = ids if isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids) else None
    record = {
        "key": key,
        "config": config.name,
        "fingerprint": fp,
        "question_id": q.qid,
        "category": q.category,
        "turn": turn,
        "prompt_tokens": meta.get("prompt_tokens"),
        "completion_tokens": tokens,
        "spec_verify_ct": verify if isinstance(verify, int) else None,
        "e2e_latency": e2e,
        "wall_s": wall,
        "time_s": e2e if e2e is not None else wall,
        "finish_reason": meta.get("finish_reason"),
        "text": text,
        "output_ids": ids,
        "tokenizer": tokenizer,
    }
    record.update(telemetry(meta))  # a per-step list becomes the request's mean
    return record


def _run_config(
    config: ServerConfig,
    server: Server,
    questions: list[Question],
    settings: BenchSettings,
    cache: ResultCache,
    fp: str,
    tokenizers: dict,
    progress: bool,
    pending: int,
    warmup: int,
) -> None:
    """Ask ``questions`` of one running server at ``settings.concurrency``, after ``warmup`` untimed requests."""
    from tqdm import tqdm  # the lab extra (progress bars)

    tok_path = settings.tokenizer
    if tok_path is None:
        info = model_info(server.url)
        tok_path = info.get("tokenizer_path") or info.get("model_path")
        if not tok_path:
            raise SpecBenchError(
                f"server {config.name!r} did not say its tokenizer_path (GET /model_info): pass --tokenizer PATH"
            )
    if tok_path not in tokenizers:
        tokenizers[tok_path] = _load_tokenizer(tok_path)
    tokenizer = tokenizers[tok_path]
    tok_lock = threading.Lock()  # transformers re-configures the Rust tokenizer on each call: one at a time
    sampling = {"temperature": settings.temperature, "max_new_tokens": settings.max_new_tokens}

    def generate(ids: list[int], params: dict):
        try:
            return http_json(
                f"{server.url}/generate",
                {"input_ids": ids, "sampling_params": params},
                timeout=settings.request_timeout,
            )
        except SpecBenchError:
            server.check_alive()
            raise

    first = prompt_ids(tokenizer, settings.prompt_format, [questions[0].turns[0]], [])
    for _ in range(warmup):  # CUDA graphs, JIT and caches: not timed, not recorded
        generate(first, {**sampling, "max_new_tokens": min(32, settings.max_new_tokens)})

    stop = threading.Event()
    bar = tqdm(total=pending, desc=config.name, unit="turn", disable=not progress, dynamic_ncols=True)

    def ask(q: Question) -> None:
        answers: list[str] = []
        for turn in range(len(q.turns)):
            key = turn_key(config.name, fp, q, turn)
            record = cache.get(key)
            if record is None:
                if stop.is_set():
                    return
                with tok_lock:
                    ids = prompt_ids(tokenizer, settings.prompt_format, list(q.turns[: turn + 1]), answers)
                t0 = time.perf_counter()
                response = generate(ids, sampling)
                try:
                    record = _record(response, key, config, fp, q, turn, time.perf_counter() - t0, tok_path)
                except SpecBenchError as exc:
                    raise SpecBenchError(f"config {config.name!r}, question {q.qid} turn {turn + 1}: {exc}") from None
                cache.append(record)
                bar.update(1)
            answers.append(record["text"])

    todo = [
        q for q in questions if any(cache.get(turn_key(config.name, fp, q, t)) is None for t in range(len(q.turns)))
    ]
    try:
        run_concurrently(ask, todo, settings.concurrency, f"specbench-{config.name}")
    finally:
        stop.set()
        bar.close()


def _controls_if_clear(configs: list[ServerConfig]) -> dict[str, str | None]:
    """``controls``, or none where they are ambiguous (sampled: the run is not refused for it)."""
    try:
        return controls(configs)
    except SpecBenchError:
        return {}


def run_bench_levels(
    configs: list[ServerConfig],
    questions: list[Question],
    settings: BenchSettings,
    concurrencies: list[int],
    cache_path: Path,
    log_dir: Path,
    command: str,
    progress: bool = True,
) -> dict[int, dict]:
    """Ask every question of every configuration at each concurrency in turn, each server started once
    for all of them (a start with CUDA graphs takes 30-60 s); cached turns are skipped (the concurrency
    is in each turn's key). One result per concurrency (see ``summarize``)."""
    check_unique(configs)
    if not questions:
        raise SpecBenchError("no questions to ask")
    if not concurrencies or len(set(concurrencies)) != len(concurrencies) or min(concurrencies) < 1:
        raise SpecBenchError(f"concurrencies must be distinct positive integers, got {concurrencies}")
    if settings.prompt_format not in PROMPT_FORMATS:
        raise SpecBenchError(
            f"prompt format must be one of {', '.join(PROMPT_FORMATS)}, got {settings.prompt_format!r}"
        )
    pairs = controls(configs) if settings.temperature == 0 else {}  # greedy parity; refused before any server
    control_of = pairs if settings.temperature == 0 else _controls_if_clear(configs)  # the speed targets
    cache = ResultCache(cache_path)
    if cache.skipped_lines:
        print(f"cache {cache_path}: ignored {cache.skipped_lines} unreadable line(s)", file=sys.stderr)
    levels = {c: replace(settings, concurrency=c) for c in concurrencies}
    total = sum(len(q.turns) for q in questions)
    tokenizers: dict = {}

    def pending(config: ServerConfig, s: BenchSettings) -> int:
        fp = fingerprint(config, s)
        return sum(cache.get(turn_key(config.name, fp, q, t)) is None for q in questions for t in range(len(q.turns)))

    for config in configs:
        todo = {c: pending(config, s) for c, s in levels.items()}
        if not any(todo.values()):
            print(f"[{config.name}] all {total} turns are cached in {cache_path}: nothing to run", flush=True)
            continue
        with Server(config, settings, log_dir) as server:
            warmup = settings.warmup  # once per server: the later concurrencies find it warm
            for c, s in levels.items():
                if not todo[c]:
                    print(f"[{config.name}] concurrency {c}: all {total} turns are cached", flush=True)
                    continue
                print(
                    f"[{config.name}] concurrency {c}: {todo[c]} of {total} turns to run ({total - todo[c]} cached)",
                    flush=True,
                )
                fp = fingerprint(config, s)
                _run_config(config, server, questions, s, cache, fp, tokenizers, progress, todo[c], warmup)
                warmup = 0
    out = {}
    for c, s in levels.items():
        records = {
            cfg.name: [
                r
                for q in questions
                for t in range(len(q.turns))
                if (r := cache.get(turn_key(cfg.name, fingerprint(cfg, s), q, t))) is not None
            ]
            for cfg in configs
        }
        section = parity(
            configs, questions, records, settings.temperature, pairs, _decoder(tokenizers, settings, records)
        )
        out[c] = {
            "runs": summarize(configs, questions, records),
            "parity": section,
            "targets": targets(configs, questions, records, c, control_of, section),
            "device": device_name(),
            "versions": versions(),
            "command": command,
            "concurrency": c,
            "temperature": settings.temperature,
        }
    return out


def run(args) -> int:
    """``sglang-specvocab bench specbench``: configurations, questions, the run (resumable), the report.
    0 when done, 1 when greedy parity fails at any concurrency (temperature 0: a DYNVOCAB turn differs from its
    control and the target). Several concurrencies: one result each, written as OUT/NAME-cN.*."""
    configs = configs_from_args(args)
    check_unique(configs)  # also: at least one configuration
    questions = load_bench_questions(spec_bench_file(args.questions), args.limit_per_category, args.categories)
    levels = list(args.concurrency)
    settings = BenchSettings(
        temperature=args.temperature,
        max_new_tokens=args.max_new_tokens,
        concurrency=levels[0],
        prompt_format=args.prompt_format,
        tokenizer=args.tokenizer,
        **server_settings(args),
    )
    turns = sum(len(q.turns) for q in questions)
    print(
        f"{len(questions)} questions ({turns} turns) x {len(configs)} configurations: "
        + ", ".join(f"{c.name} ({c.algorithm})" for c in configs)
        + f"; concurrency {', '.join(map(str, levels))}",
        flush=True,
    )
    with sigterm_as_interrupt():
        cache = args.cache or args.out / "specbench-cache.jsonl"
        results = run_bench_levels(
            configs,
            questions,
            settings,
            levels,
            cache_path=cache,
            log_dir=args.out / "logs",
            command=args.command_line,
            progress=not args.no_progress,
        )
    failed = False
    for c, result in results.items():
        paths = write_report(result, args.out, args.name if len(levels) == 1 else f"{args.name}-c{c}")
        print()
        print(markdown(result), end="")
        print()
        for path in paths:
            print(f"wrote {path}")
        failures = parity_failures(result["parity"])
        if failures:
            failed = True
            print(f"greedy parity FAILED at concurrency {c} (see the report's Greedy parity section):", file=sys.stderr)
            for line in failures:
                print(f"  {line}", file=sys.stderr)
    return 1 if failed else 0
