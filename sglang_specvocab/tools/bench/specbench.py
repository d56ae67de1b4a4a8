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

Results are cached per turn (``ResultCache``, ``turn_key``); ``specbench_report`` makes the table,
``specbench_targets`` the verdicts. ``LevelRun`` rewrites the reports after each concurrency and each server
(and on an interrupt), each partial one naming what is missing and why; a configuration that fails is
recorded and the next runs; ``specbench_budget`` decides, under ``--time-budget-s``, which servers to start
and which later concurrencies to ask.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import threading
import time
from collections.abc import Callable
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
from .specbench_budget import DEFAULT_START_S, DEFAULT_STOP_S, DEFAULT_URL_START_S, Budget
from .specbench_report import Decode, markdown, parity, parity_failures, summarize, write_report
from .specbench_targets import targets

PROMPT_FORMATS = ("auto", "chat", "plain")
#: What the time budget is measured with (tests give a clock of their own).
clock = time.monotonic
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


@dataclass
class _Served:
    """A running server and the tokenizer its prompts are made with."""

    config: ServerConfig
    server: Server
    tokenizer: object
    tok_path: str

    def generate(self, ids: list[int], params: dict, timeout: float):
        try:
            return http_json(f"{self.server.url}/generate", {"input_ids": ids, "sampling_params": params}, timeout)
        except SpecBenchError:
            self.server.check_alive()
            raise


def _serve(config: ServerConfig, server: Server, settings: BenchSettings, tokenizers: dict, questions) -> _Served:
    """The prompt tokenizer of a running server (``--tokenizer``, else its /model_info), then ``settings.warmup``
    untimed requests (CUDA graphs, JIT and caches: not timed, not recorded)."""
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
    served = _Served(config, server, tokenizers[tok_path], tok_path)
    first = prompt_ids(served.tokenizer, settings.prompt_format, [questions[0].turns[0]], [])
    params = {"temperature": settings.temperature, "max_new_tokens": min(32, settings.max_new_tokens)}
    for _ in range(settings.warmup):
        served.generate(first, params, settings.request_timeout)
    return served


def _run_config(
    served: _Served,
    questions: list[Question],
    settings: BenchSettings,
    cache: ResultCache,
    fp: str,
    progress: bool,
    pending: int,
    out_of_time: Callable[[], bool] | None = None,
) -> None:
    """Ask ``questions`` of one running server at ``settings.concurrency`` (the turns not cached); no new turn
    once ``out_of_time()`` (the turns in flight finish)."""
    from tqdm import tqdm  # the lab extra (progress bars)

    config, tokenizer = served.config, served.tokenizer
    tok_lock = threading.Lock()  # transformers re-configures the Rust tokenizer on each call: one at a time
    sampling = {"temperature": settings.temperature, "max_new_tokens": settings.max_new_tokens}
    stop = threading.Event()
    bar = tqdm(total=pending, desc=config.name, unit="turn", disable=not progress, dynamic_ncols=True)

    def ask(q: Question) -> None:
        answers: list[str] = []
        for turn in range(len(q.turns)):
            key = turn_key(config.name, fp, q, turn)
            record = cache.get(key)
            if record is None:
                if stop.is_set() or (out_of_time is not None and out_of_time()):
                    stop.set()
                    return
                with tok_lock:
                    ids = prompt_ids(tokenizer, settings.prompt_format, list(q.turns[: turn + 1]), answers)
                t0 = time.perf_counter()
                response = served.generate(ids, sampling, settings.request_timeout)
                try:
                    record = _record(response, key, config, fp, q, turn, time.perf_counter() - t0, served.tok_path)
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


_LOG_TAIL = re.compile(r"^(.*?); last \d+ lines of (.+?):\n(.*)$", re.DOTALL)  # what Server.log_tail adds


def _first_line(text: str) -> str:
    """A failure in one line: its first, and the last line of the server log it quotes (often the error)."""
    found = _LOG_TAIL.match(text)
    if found is None:
        return text.strip().splitlines()[0] if text.strip() else text
    head, log, tail = found.groups()
    last = next((line.removeprefix("  | ").strip() for line in reversed(tail.splitlines()) if line.strip()), "")
    return f"{head.strip().splitlines()[0]} ({log}: {last})" if last else head.strip().splitlines()[0]


class LevelRun:
    """Every question of every configuration at each concurrency in turn, each server started once for all of
    them (a start with CUDA graphs takes 30-60 s); cached turns are skipped (the concurrency is in each turn's
    key). Whatever became of a (configuration, concurrency) not finished is kept (``why``: not reached,
    interrupted, time budget, server failed: ...) and goes into every report as ``missing``; with ``out``,
    the reports of every concurrency are rewritten (atomically) after each concurrency and each server, so a
    run cut short leaves them; with ``budget``, servers and later concurrencies are asked only as it allows
    (``specbench_budget``)."""

    def __init__(
        self,
        configs: list[ServerConfig],
        questions: list[Question],
        settings: BenchSettings,
        concurrencies: list[int],
        cache_path: Path,
        log_dir: Path,
        command: str,
        progress: bool = True,
        out: tuple[Path, Callable[[int], str]] | None = None,
        budget: Budget | None = None,
    ):
        check_unique(configs)
        if not questions:
            raise SpecBenchError("no questions to ask")
        if not concurrencies or len(set(concurrencies)) != len(concurrencies) or min(concurrencies) < 1:
            raise SpecBenchError(f"concurrencies must be distinct positive integers, got {concurrencies}")
        if settings.prompt_format not in PROMPT_FORMATS:
            raise SpecBenchError(
                f"prompt format must be one of {', '.join(PROMPT_FORMATS)}, got {settings.prompt_format!r}"
            )
        self.pairs = controls(configs) if settings.temperature == 0 else {}  # parity; refused before any server
        self.control_of = self.pairs if settings.temperature == 0 else _controls_if_clear(configs)  # speed targets
        self.configs, self.questions, self.settings = configs, questions, settings
        self.cache_path, self.log_dir, self.command, self.progress = Path(cache_path), log_dir, command, progress
        self.out, self.budget = out, budget
        self.clock = budget.clock if budget is not None else time.monotonic
        self.cache = ResultCache(cache_path)
        if self.cache.skipped_lines:
            print(f"cache {cache_path}: ignored {self.cache.skipped_lines} unreadable line(s)", file=sys.stderr)
        self.levels = {c: replace(settings, concurrency=c) for c in concurrencies}
        self.total = sum(len(q.turns) for q in questions)
        self.tokenizers: dict = {}
        self.why: dict[tuple[str, int], str] = {}  # (config, concurrency) -> why it is not finished
        self.failures: dict[str, str] = {}  # config -> its failure, in full
        self.current: tuple[str, int] | None = None  # what is being asked (or started for)
        self.facts = {"device": device_name(), "versions": versions()}

    def pending(self, config: ServerConfig, c: int) -> int:
        fp = fingerprint(config, self.levels[c])
        return sum(
            self.cache.get(turn_key(config.name, fp, q, t)) is None for q in self.questions for t in range(len(q.turns))
        )

    def run(self) -> dict[int, dict]:
        """The configurations in order; one result per concurrency (``results``). A KeyboardInterrupt (SIGTERM
        in ``sigterm_as_interrupt``) writes the reports of what finished, then goes on up."""
        try:
            for i, config in enumerate(self.configs):
                changed, t_stop = self._run_one(config, self.configs[i + 1 :])
                self.current = None
                if changed:
                    self.write()
                if t_stop is not None and self.budget is not None:
                    self.budget.stopped(self.clock() - t_stop)  # the server's stop and the reports
        except KeyboardInterrupt:
            if self.current is not None:
                self.why[self.current] = "interrupted"
            self.write()
            raise
        return self.results()

    def _run_one(self, config: ServerConfig, later: list[ServerConfig]) -> tuple[bool, float | None]:
        """One configuration's server, started (or reached) once for every concurrency with turns to ask:
        (anything changed?, when its server began to stop: None where none ran to the end)."""
        todo = {c: self.pending(config, c) for c in self.levels}
        if not any(todo.values()):
            print(f"[{config.name}] all {self.total} turns are cached in {self.cache_path}: nothing to run", flush=True)
            return False, None
        first = next(c for c, n in todo.items() if n)
        if self.budget is not None and not self.budget.may_start(config.name, config.url is None, first, todo[first]):
            for c, n in todo.items():
                if n:
                    self.why[(config.name, c)] = "time budget"
            return True, None
        self.current = (config.name, first)
        t0 = self.clock()
        try:
            with Server(config, self.settings, self.log_dir) as server:
                served = _serve(config, server, self.settings, self.tokenizers, self.questions)
                if self.budget is not None:
                    self.budget.started(config.url is None, self.clock() - t0)
                for c in self.levels:
                    self._ask_level(served, c, todo[c], first, later)
                t_stop = self.clock()
        except SpecBenchError as exc:  # it did not start, died, or answered wrongly: the others still run
            message = str(exc)
            print(f"[{config.name}] server failed: {message}", file=sys.stderr, flush=True)
            self.failures[config.name] = message
            for c, n in todo.items():
                if n and self.pending(config, c):
                    self.why[(config.name, c)] = f"server failed: {_first_line(message)}"
            return True, None
        return True, t_stop

    def _ask_level(self, served: _Served, c: int, todo: int, first: int, later: list[ServerConfig]) -> None:
        name = served.config.name
        if not todo:
            print(f"[{name}] concurrency {c}: all {self.total} turns are cached", flush=True)
            return
        if c != first and self.budget is not None and not self.budget.may_ask(name, c, todo, self._remaining(later)):
            self.why[(name, c)] = "time budget"
            return
        print(f"[{name}] concurrency {c}: {todo} of {self.total} turns to run ({self.total - todo} cached)", flush=True)
        self.current = (name, c)
        s = self.levels[c]
        t0 = self.clock()
        out_of_time = None if self.budget is None else self.budget.out_of_time
        _run_config(
            served, self.questions, s, self.cache, fingerprint(served.config, s), self.progress, todo, out_of_time
        )
        left = self.pending(served.config, c)  # none unless the budget ran out
        if self.budget is not None:
            self.budget.asked(c, todo - left, self.clock() - t0)
            if left:
                self.budget.cut(name, c, todo - left, todo)
                self.why[(name, c)] = "time budget"
        self.write()

    def _remaining(self, later: list[ServerConfig]) -> list[tuple[str, bool, int, int]]:
        """The servers still to run, each with its first concurrency to ask and its turns there."""
        out = []
        for config in later:
            todo = {c: self.pending(config, c) for c in self.levels}
            first = next((c for c, n in todo.items() if n), None)
            if first is not None:
                out.append((config.name, config.url is None, first, todo[first]))
        return out

    # --- results ----------------------------------------------------------------------------------

    def missing(self, c: int) -> list[dict]:
        """Each configuration with turns not finished at concurrency ``c``, and why."""
        out = []
        for config in self.configs:
            n = self.pending(config, c)
            if n:
                why = self.why.get((config.name, c), "not reached")
                out.append(
                    {"config": config.name, "concurrency": c, "why": why, "turns_missing": n, "turns": self.total}
                )
        return out

    def result(self, c: int) -> dict:
        s = self.levels[c]
        records = {
            cfg.name: [
                r
                for q in self.questions
                for t in range(len(q.turns))
                if (r := self.cache.get(turn_key(cfg.name, fingerprint(cfg, s), q, t))) is not None
            ]
            for cfg in self.configs
        }
        decode = _decoder(self.tokenizers, self.settings, records)
        section = parity(self.configs, self.questions, records, self.settings.temperature, self.pairs, decode)
        missing = self.missing(c)
        return {
            "partial": bool(missing),
            "missing": missing,
            "runs": summarize(self.configs, self.questions, records),
            "parity": section,
            "targets": targets(self.configs, self.questions, records, c, self.control_of, section),
            **self.facts,
            "command": self.command,
            "concurrency": c,
            "temperature": self.settings.temperature,
            "budget": None if self.budget is None else self.budget.summary(),
        }

    def results(self) -> dict[int, dict]:
        return {c: self.result(c) for c in self.levels}

    def write(self) -> None:
        """The reports of every concurrency so far, each file replaced atomically (with ``out``)."""
        if self.out is None:
            return
        out_dir, stem = self.out
        said = []
        for c, result in self.results().items():
            write_report(result, out_dir, stem(c))
            state = f"partial: {len(result['missing'])} missing" if result["partial"] else "complete"
            said.append(f"{stem(c)} ({state})")
        print(f"reports so far in {out_dir}: {', '.join(said)}", flush=True)


def run(args) -> int:
    """``sglang-specvocab bench specbench``: configurations, questions, the run (resumable), the report.
    0 when done, 1 when greedy parity fails at any concurrency (temperature 0: a DYNVOCAB turn differs from its
    control and the target), 2 when a server failed (the others ran; the reports say what is missing).
    Several concurrencies: one result each, written as OUT/NAME-cN.*."""
    before = time.monotonic() - getattr(args, "started", time.monotonic())  # since the command's start
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
    budget = None
    if args.time_budget_s is not None:
        budget = Budget(args.time_budget_s, clock() - before, args.max_new_tokens, clock)
        budget.say(
            f"[budget] {args.time_budget_s:g} s from the command's start; before any measurement a start takes "
            f"{DEFAULT_START_S:g} s ({DEFAULT_URL_START_S:g} s by url), a turn {budget.default_turn_s:.1f} s, a stop "
            f"{DEFAULT_STOP_S:g} s"
        )

    def stem(c: int) -> str:
        return args.name if len(levels) == 1 else f"{args.name}-c{c}"

    with sigterm_as_interrupt():
        bench = LevelRun(
            configs,
            questions,
            settings,
            levels,
            cache_path=args.cache or args.out / "specbench-cache.jsonl",
            log_dir=args.out / "logs",
            command=args.command_line,
            progress=not args.no_progress,
            out=(args.out, stem),
            budget=budget,
        )
        results = bench.run()
    failed = False
    for c, result in results.items():
        paths = write_report(result, args.out, stem(c))
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
    if bench.failures:
        lines = "; ".join(f"{name}: {_first_line(message)}" for name, message in bench.failures.items())
        if failed:
            print(f"error: server(s) failed (the reports are partial): {lines}", file=sys.stderr)
        else:
            raise SpecBenchError(f"server(s) failed (the reports are partial): {lines}")
    return 1 if failed else 0
