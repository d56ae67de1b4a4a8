"""Spec-Bench against SGLang servers: launch or reach each configuration, time every question, report.

How a question is asked: the client renders the conversation with the served model's chat template
(the tokenizer SGLang itself loads: ``--tokenizer`` or the server's ``/model_info``), tokenizes it
without adding special tokens (the template carries BOS, as in SGLang's own chat path) and POSTs the
ids to ``/generate``. ``/generate`` rather than ``/v1/chat/completions`` because its ``meta_info``
carries everything per request (``completion_tokens``, ``spec_verify_ct``, ``e2e_latency`` and any
extra fields such as DYNVOCAB's ``dynvocab_set_size``/``dynvocab_coverage``), whereas the OpenAI
route keeps only ``usage`` plus a fixed set of spec fields; and sending ids means every
configuration gets exactly the same prompt tokens. MT-Bench's second turn is asked with the
configuration's own first answer in the conversation.

Measured like Spec-Bench: a question's speed is its completion tokens over its time (turns summed;
time = the server's ``e2e_latency``, else the client's wall time); a configuration's speed is the
mean over questions; speedup = mean speed / mean speed of the first configuration, over the
questions both finished; accepted length = completion tokens / verify steps (``spec_verify_ct``),
summed over the category, i.e. the mean over decoding steps, bonus token included (1 for
``algorithm: none``; empty when a speculative server reports no ``spec_verify_ct``). The DYNVOCAB
columns are the mean over requests of each request's value (a per-step list is averaged first).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from ..errors import SpecVocabError
from ..prompts import Question, format_prompt, load_questions

__all__ = [
    "ALGORITHMS", "PROMPT_FORMATS", "TELEMETRY", "BenchSettings", "ResultCache", "Server", "ServerConfig",
    "SpecBenchError", "check_unique", "run_concurrently", "sigterm_as_interrupt", "load_bench_questions", "load_config_file", "make_config", "markdown",
    "parse_config_spec", "plot", "run_bench", "summarize", "write_report",
]

#: Accepted names (any case) of the ``algorithm`` label -> how reports spell them.
ALGORITHMS = {a.lower(): a for a in ("none", "EAGLE", "EAGLE3", "DYNVOCAB", "NGRAM", "STANDALONE")}
#: meta_info fields the DYNVOCAB integration adds; reported when a server sends them.
TELEMETRY = ("dynvocab_set_size", "dynvocab_coverage")
PROMPT_FORMATS = ("auto", "chat", "plain")
_CONFIG_KEYS = ("name", "algorithm", "args", "url", "env", "launcher")
_LOG_TAIL_LINES = 40
_PLAIN = SimpleNamespace(chat_template=None)  # makes format_prompt write its plain Question:/Answer: transcript


class SpecBenchError(SpecVocabError):
    """A benchmark that cannot run: bad configuration, question file, server or response."""


# --- configurations -----------------------------------------------------------------------------


@dataclass
class ServerConfig:
    """One configuration: a server to launch with ``args`` (through ``launcher``) or one at ``url``."""

    name: str
    algorithm: str
    args: list[str] = field(default_factory=list)
    url: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    launcher: list[str] | None = None


def make_config(raw: dict, where: str) -> ServerConfig:
    """A validated configuration from a mapping (a YAML entry or a parsed ``--config``)."""
    if not isinstance(raw, dict):
        raise SpecBenchError(f"{where}: must be a mapping with keys {', '.join(_CONFIG_KEYS)}")
    unknown = sorted(set(raw) - set(_CONFIG_KEYS))
    if unknown:
        raise SpecBenchError(f"{where}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(_CONFIG_KEYS)}")
    name = raw.get("name")
    if not isinstance(name, str) or not name or not all(c.isalnum() or c in "._-+" for c in name):
        raise SpecBenchError(f"{where}: 'name' must be a non-empty string of letters, digits and . _ - +, got {name!r}")
    where = f"{where} (config {name!r})"
    args = _str_list(raw.get("args"), where, "args")
    launcher = _str_list(raw["launcher"], where, "launcher") if raw.get("launcher") is not None else None
    if launcher == []:
        raise SpecBenchError(f"{where}: 'launcher' is empty")
    url = raw.get("url")
    if url is not None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise SpecBenchError(f"{where}: 'url' must start with http:// or https://, got {url!r}")
        if args or launcher:
            raise SpecBenchError(f"{where}: give either 'url' (a running server) or 'args' (to launch one), not both")
        url = url.rstrip("/")
    elif not args:
        raise SpecBenchError(f"{where}: needs 'args' (server arguments to launch with) or 'url' (a running server)")
    env = raw.get("env") or {}
    if isinstance(env, str):
        pairs = shlex.split(env)
        if not all("=" in p and not p.startswith("=") for p in pairs):
            raise SpecBenchError(f"{where}: 'env' must be 'KEY=VALUE KEY2=VALUE2', got {env!r}")
        env = dict(p.split("=", 1) for p in pairs)
    if not isinstance(env, dict) or not all(isinstance(k, str) and k for k in env):
        raise SpecBenchError(f"{where}: 'env' must map variable names to values")
    env = {k: "" if v is None else str(v) for k, v in env.items()}
    from_args = _arg_value(args, "--speculative-algorithm")
    algorithm = raw.get("algorithm")
    if algorithm is None:
        if url is not None:
            raise SpecBenchError(
                f"{where}: a server reached by url needs 'algorithm' ({'|'.join(ALGORITHMS.values())}) for the report"
            )
        algorithm = from_args or "none"
    if not isinstance(algorithm, str) or algorithm.lower() not in ALGORITHMS:
        raise SpecBenchError(f"{where}: 'algorithm' must be one of {', '.join(ALGORITHMS.values())}, got {algorithm!r}")
    return ServerConfig(name, ALGORITHMS[algorithm.lower()], args, url, env, launcher)


def parse_config_spec(spec: str) -> ServerConfig:
    """``name=NAME,algorithm=ALG,args="SERVER ARGS",url=URL,env="K=V ..."`` (commas inside quotes are kept)."""
    lex = shlex.shlex(spec, posix=True)
    lex.whitespace, lex.whitespace_split, lex.commenters = ",", True, ""
    try:
        items = list(lex)
    except ValueError as exc:
        raise SpecBenchError(f"--config {spec!r}: {exc} (check the quotes)") from None
    raw: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SpecBenchError(f"--config {spec!r}: {item!r} is not key=value")
        if key in raw:
            raise SpecBenchError(f"--config {spec!r}: {key!r} given twice")
        raw[key] = value
    return make_config(raw, f"--config {spec!r}")


def load_config_file(path: str | Path) -> list[ServerConfig]:
    """Configurations of a YAML file: a list of mappings, or a mapping whose ``configs`` is that list."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise SpecBenchError(f"cannot read configs file {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise SpecBenchError(f"{path}: not valid YAML: {exc}") from None
    if isinstance(data, dict) and "configs" in data:
        data = data["configs"]
    if not isinstance(data, list) or not data:
        raise SpecBenchError(f"{path}: expected a non-empty list of configs (or a mapping with a 'configs' list)")
    return [make_config(item, f"{path} entry {i}") for i, item in enumerate(data, 1)]


def check_unique(configs: list[ServerConfig]) -> None:
    if not configs:
        raise SpecBenchError("no configurations: give --config and/or --configs")
    seen: set[str] = set()
    for c in configs:
        if c.name in seen:
            raise SpecBenchError(f"config name {c.name!r} is used twice: names key the results and must be unique")
        seen.add(c.name)


def _str_list(value, where: str, key: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError as exc:
            raise SpecBenchError(f"{where}: '{key}': {exc} (check the quotes)") from None
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
        return [str(v) for v in value]
    raise SpecBenchError(f"{where}: '{key}' must be a string or a list of strings, got {value!r}")


def _arg_value(args: list[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


# --- questions ----------------------------------------------------------------------------------


def load_bench_questions(path: str | Path, per_category: int | None = None,
                         categories: list[str] | None = None) -> list[Question]:
    """Spec-Bench questions (MT-Bench's eight categories folded into ``mt_bench``), checked for unique ids."""
    if not Path(path).is_file():
        raise SpecBenchError(f"questions file {path}: no such file")
    questions = load_questions(path, per_category)
    ids: set[str] = set()
    for q in questions:
        if q.qid in ids:
            raise SpecBenchError(f"{path}: question_id {q.qid} appears twice (ids key the results)")
        ids.add(q.qid)
    if categories:
        known = list(dict.fromkeys(q.category for q in questions))
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise SpecBenchError(f"unknown categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
                                 f"{path} has: {', '.join(known)}")
        questions = [q for q in questions if q.category in categories]
    return questions


def _question_hash(q: Question) -> str:
    return hashlib.sha256(json.dumps([q.category, list(q.turns)]).encode()).hexdigest()[:12]


# --- settings and the result cache --------------------------------------------------------------


@dataclass
class BenchSettings:
    temperature: float = 0.0
    max_new_tokens: int = 1024
    concurrency: int = 1
    prompt_format: str = "auto"  # auto: the chat template when the tokenizer has one, else a plain transcript
    tokenizer: str | None = None  # default: the server's /model_info tokenizer_path
    warmup: int = 2  # unrecorded requests per server before timing
    server_timeout: float = 900.0
    request_timeout: float = 1800.0
    host: str = "127.0.0.1"
    launcher: list[str] = field(default_factory=lambda: [sys.executable, "-m", "sglang.launch_server"])
    poll_interval: float = 1.0


def fingerprint(config: ServerConfig, settings: BenchSettings) -> str:
    """What a cached result depends on: a change of any of these re-runs the question."""
    facts = {
        "algorithm": config.algorithm, "args": config.args, "url": config.url, "env": config.env,
        "launcher": config.launcher, "temperature": settings.temperature, "max_new_tokens": settings.max_new_tokens,
        "concurrency": settings.concurrency, "prompt_format": settings.prompt_format, "tokenizer": settings.tokenizer,
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


class ResultCache:
    """Per-turn results, one JSON line each, appended as they finish; keyed by config, settings, question, turn."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.lock = threading.Lock()
        self.records: dict[str, dict] = {}
        self.skipped_lines = 0
        if self.path.is_file():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                    self.records[record["key"]] = record
                except (json.JSONDecodeError, KeyError, TypeError):
                    self.skipped_lines += 1  # e.g. the half-written last line of a killed run

    @staticmethod
    def key(config: str, fp: str, q: Question, turn: int) -> str:
        return f"{config}|{fp}|{q.qid}|{turn}|{_question_hash(q)}"

    def get(self, key: str) -> dict | None:
        return self.records.get(key)

    def append(self, record: dict) -> None:
        with self.lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
            self.records[record["key"]] = record


# --- HTTP ---------------------------------------------------------------------------------------

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # local servers: never via a proxy


def http_json(url: str, payload: dict | None = None, timeout: float = 30.0):
    """GET (no payload) or POST JSON; the decoded reply. Every failure is a SpecBenchError naming the URL."""
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, method="GET" if data is None else "POST",
                                 headers={} if data is None else {"Content-Type": "application/json"})
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            body = resp.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", errors="replace").strip()[:1000]
        raise SpecBenchError(f"{url}: HTTP {exc.code} {exc.reason}" + (f": {detail}" if detail else "")) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise SpecBenchError(f"{url}: no answer ({reason})") from None
    try:
        return json.loads(body) if body.strip() else None
    except json.JSONDecodeError:
        raise SpecBenchError(f"{url}: the reply is not JSON: {body[:200]!r}") from None


def _healthy(url: str) -> bool:
    try:
        http_json(f"{url}/health", timeout=5.0)
        return True
    except SpecBenchError:
        return False


def model_info(url: str) -> dict:
    for route in ("/model_info", "/get_model_info"):  # the second is the deprecated name of the first
        try:
            info = http_json(url + route)
        except SpecBenchError:
            continue
        if isinstance(info, dict):
            return info
    return {}


# --- servers ------------------------------------------------------------------------------------


class Server:
    """A context manager: launches ``config`` (and stops it on exit) or checks the server at its url."""

    def __init__(self, config: ServerConfig, settings: BenchSettings, log_dir: Path):
        self.config, self.settings, self.log_dir = config, settings, Path(log_dir)
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None
        self.url = config.url or ""

    def __enter__(self) -> Server:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        cfg, s = self.config, self.settings
        if cfg.url is not None:
            print(f"[{cfg.name}] using the server at {cfg.url}", flush=True)
            self._wait_healthy(f"no healthy SGLang server at {cfg.url} (GET /health) within {s.server_timeout:g} s")
            return
        args = list(cfg.args)
        host = _arg_value(args, "--host")
        if host is None:
            host = s.host
            args += ["--host", host]
        port = _arg_value(args, "--port")
        if port is None:
            port = str(_free_port(host))
            args += ["--port", port]
        client_host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        self.url = f"http://{client_host}:{port}"
        cmd = list(cfg.launcher or s.launcher) + args
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.log_dir / f"{cfg.name}.log"
        print(f"[{cfg.name}] launching: {shlex.join(cmd)}", flush=True)
        print(f"[{cfg.name}] log: {self.log_path}", flush=True)
        with self.log_path.open("wb") as log:
            try:
                self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             env={**os.environ, **cfg.env}, start_new_session=True)
            except OSError as exc:
                raise SpecBenchError(f"config {cfg.name!r}: cannot run {cmd[0]!r}: {exc.strerror or exc}") from None
        self._wait_healthy(f"server {cfg.name!r} did not become healthy within {s.server_timeout:g} s")

    def _wait_healthy(self, timeout_message: str) -> None:
        deadline = time.monotonic() + self.settings.server_timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise SpecBenchError(
                    f"server {self.config.name!r} exited with code {self.proc.returncode} before it became healthy"
                    + self.log_tail()
                )
            if _healthy(self.url):
                return
            if time.monotonic() >= deadline:
                raise SpecBenchError(timeout_message + self.log_tail())
            time.sleep(self.settings.poll_interval)

    def check_alive(self) -> None:
        """After a failed request: say so if the launched server died."""
        if self.proc is not None and self.proc.poll() is not None:
            raise SpecBenchError(f"server {self.config.name!r} exited with code {self.proc.returncode}" + self.log_tail())

    def log_tail(self) -> str:
        if self.log_path is None or not self.log_path.is_file():
            return ""
        lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-_LOG_TAIL_LINES:]
        return f"; last {len(lines)} lines of {self.log_path}:\n" + "\n".join("  | " + line for line in lines)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        for sig, grace in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)  # its own session: the scheduler and detokenizer children go too
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=grace)
                return
            except subprocess.TimeoutExpired:
                continue


@contextlib.contextmanager
def sigterm_as_interrupt():
    """Inside: SIGTERM (``timeout``, a job runner) raises KeyboardInterrupt, so launched servers are
    stopped by their context managers and the cache stays readable, as on Ctrl-C."""

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host if host not in ("0.0.0.0", "") else "127.0.0.1", 0))
        return s.getsockname()[1]


# --- running ------------------------------------------------------------------------------------


def prompt_ids(tokenizer, prompt_format: str, turns: list[str], answers: list[str]) -> list[int]:
    """Token ids of the conversation so far, ready for the model's next answer."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if prompt_format == "chat" or (prompt_format == "auto" and has_template):
        if not has_template:
            raise SpecBenchError(
                "the tokenizer has no chat template (--prompt-format chat); use --prompt-format plain, or a "
                "checkpoint with a template (scripts/convert_gemma3.py --chat-template gemma)"
            )
        # The template writes BOS itself: encode without adding specials, as SGLang's chat route does.
        return tokenizer(format_prompt(tokenizer, turns, answers), add_special_tokens=False).input_ids
    return tokenizer(format_prompt(_PLAIN, turns, answers)).input_ids  # the tokenizer adds BOS if it does


def _load_tokenizer(path: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise SpecBenchError(f"cannot load the tokenizer from {path!r}: {exc}") from None


def _numbers(value) -> list[float]:
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, (int, float)):
        return [float(value)] if math.isfinite(value) else []
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _numbers(v)]
    return []


def _record(response, key: str, config: ServerConfig, fp: str, q: Question, turn: int, wall: float) -> dict:
    if isinstance(response, list) and len(response) == 1:
        response = response[0]
    if not isinstance(response, dict):
        raise SpecBenchError(f"/generate returned {type(response).__name__}, expected a JSON object")
    meta = response.get("meta_info")
    if not isinstance(meta, dict):
        raise SpecBenchError(f"/generate reply has no meta_info object: {json.dumps(response)[:300]}")
    text = response.get("text")
    if not isinstance(text, str):
        raise SpecBenchError("/generate reply has no 'text' (a server started with --skip-tokenizer-init cannot be used)")
    tokens = meta.get("completion_tokens")
    if not isinstance(tokens, int):
        raise SpecBenchError(f"/generate meta_info has no integer completion_tokens: {json.dumps(meta)[:300]}")
    e2e = meta.get("e2e_latency")
    e2e = float(e2e) if isinstance(e2e, (int, float)) and not isinstance(e2e, bool) and e2e > 0 else None
    verify = meta.get("spec_verify_ct")
    record = {
        "key": key, "config": config.name, "fingerprint": fp, "question_id": q.qid, "category": q.category,
        "turn": turn, "prompt_tokens": meta.get("prompt_tokens"), "completion_tokens": tokens,
        "spec_verify_ct": verify if isinstance(verify, int) else None, "e2e_latency": e2e, "wall_s": wall,
        "time_s": e2e if e2e is not None else wall, "finish_reason": meta.get("finish_reason"), "text": text,
    }
    for name in TELEMETRY:
        values = _numbers(meta.get(name))
        if values:
            record[name] = sum(values) / len(values)  # a per-step list becomes the request's mean
    return record


def _run_config(config: ServerConfig, server: Server, questions: list[Question], settings: BenchSettings,
                cache: ResultCache, fp: str, tokenizers: dict, progress: bool, pending: int) -> None:
    from tqdm import tqdm

    tok_path = settings.tokenizer
    if tok_path is None:
        info = model_info(server.url)
        tok_path = info.get("tokenizer_path") or info.get("model_path")
        if not tok_path:
            raise SpecBenchError(f"server {config.name!r} did not say its tokenizer_path (GET /model_info): "
                                 "pass --tokenizer PATH")
    if tok_path not in tokenizers:
        tokenizers[tok_path] = _load_tokenizer(tok_path)
    tokenizer = tokenizers[tok_path]
    tok_lock = threading.Lock()  # transformers re-configures the Rust tokenizer on each call: one at a time
    sampling = {"temperature": settings.temperature, "max_new_tokens": settings.max_new_tokens}

    def generate(ids: list[int], params: dict):
        try:
            return http_json(f"{server.url}/generate", {"input_ids": ids, "sampling_params": params},
                             timeout=settings.request_timeout)
        except SpecBenchError:
            server.check_alive()
            raise

    first = prompt_ids(tokenizer, settings.prompt_format, [questions[0].turns[0]], [])
    for _ in range(settings.warmup):  # CUDA graphs, JIT and caches: not timed, not recorded
        generate(first, {**sampling, "max_new_tokens": min(32, settings.max_new_tokens)})

    stop = threading.Event()
    bar = tqdm(total=pending, desc=config.name, unit="turn", disable=not progress, dynamic_ncols=True)

    def ask(q: Question) -> None:
        answers: list[str] = []
        for turn in range(len(q.turns)):
            key = ResultCache.key(config.name, fp, q, turn)
            record = cache.get(key)
            if record is None:
                if stop.is_set():
                    return
                with tok_lock:
                    ids = prompt_ids(tokenizer, settings.prompt_format, list(q.turns[: turn + 1]), answers)
                t0 = time.perf_counter()
                response = generate(ids, sampling)
                try:
                    record = _record(response, key, config, fp, q, turn, time.perf_counter() - t0)
                except SpecBenchError as exc:
                    raise SpecBenchError(f"config {config.name!r}, question {q.qid} turn {turn + 1}: {exc}") from None
                cache.append(record)
                bar.update(1)
            answers.append(record["text"])

    todo = [q for q in questions if any(cache.get(ResultCache.key(config.name, fp, q, t)) is None
                                        for t in range(len(q.turns)))]
    try:
        run_concurrently(ask, todo, settings.concurrency, f"specbench-{config.name}")
    finally:
        stop.set()
        bar.close()


def run_concurrently(fn, items, workers: int, name: str) -> None:
    """``fn(item)`` for every item, ``workers`` at a time; the first failure is raised, the rest cancelled."""
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
    try:
        done, _ = wait([pool.submit(fn, x) for x in items], return_when=FIRST_EXCEPTION)
        for f in done:
            if f.exception() is not None:
                raise f.exception()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def run_bench(configs: list[ServerConfig], questions: list[Question], settings: BenchSettings, cache_path: Path,
              log_dir: Path, command: str, progress: bool = True) -> dict:
    """Ask every question of every configuration (skipping cached turns); the result (see ``summarize``)."""
    check_unique(configs)
    if not questions:
        raise SpecBenchError("no questions to ask")
    if settings.prompt_format not in PROMPT_FORMATS:
        raise SpecBenchError(f"prompt format must be one of {', '.join(PROMPT_FORMATS)}, got {settings.prompt_format!r}")
    cache = ResultCache(cache_path)
    if cache.skipped_lines:
        print(f"cache {cache_path}: ignored {cache.skipped_lines} unreadable line(s)", file=sys.stderr)
    tokenizers: dict = {}
    for config in configs:
        fp = fingerprint(config, settings)
        total = sum(len(q.turns) for q in questions)
        pending = sum(cache.get(ResultCache.key(config.name, fp, q, t)) is None
                      for q in questions for t in range(len(q.turns)))
        if pending == 0:
            print(f"[{config.name}] all {total} turns are cached in {cache_path}: nothing to run", flush=True)
            continue
        print(f"[{config.name}] {pending} of {total} turns to run ({total - pending} cached)", flush=True)
        with Server(config, settings, log_dir) as server:
            _run_config(config, server, questions, settings, cache, fp, tokenizers, progress, pending)
    records = {
        c.name: [r for q in questions for t in range(len(q.turns))
                 if (r := cache.get(ResultCache.key(c.name, fingerprint(c, settings), q, t))) is not None]
        for c in configs
    }
    return {
        "runs": summarize(configs, questions, records),
        "device": device_name(),
        "versions": versions(),
        "command": command,
        "concurrency": settings.concurrency,
        "temperature": settings.temperature,
    }


# --- report -------------------------------------------------------------------------------------


def summarize(configs: list[ServerConfig], questions: list[Question], records: dict[str, list[dict]]) -> list[dict]:
    """One row per configuration and category (then ``overall``) over the questions whose turns all finished."""
    turns_of = {q.qid: len(q.turns) for q in questions}
    categories = list(dict.fromkeys(q.category for q in questions))
    per_question: dict[str, dict[str, list[dict]]] = {}
    for c in configs:
        by_q: dict[str, list[dict]] = {}
        for r in records.get(c.name, []):
            by_q.setdefault(r["question_id"], []).append(r)
        per_question[c.name] = {qid: rs for qid, rs in by_q.items() if len(rs) == turns_of.get(qid)}
    category_of = {q.qid: q.category for q in questions}

    def speeds(name: str, category: str) -> dict[str, float]:
        out = {}
        for qid, rs in per_question[name].items():
            if category in ("overall", category_of[qid]):
                seconds = sum(r["time_s"] for r in rs)
                out[qid] = sum(r["completion_tokens"] for r in rs) / seconds if seconds > 0 else 0.0
        return out

    base = configs[0]
    rows = []
    for category in [*categories, "overall"]:
        base_speed = speeds(base.name, category)
        for c in configs:
            speed = speeds(c.name, category)
            if not speed:
                continue
            turns = [r for qid in speed for r in per_question[c.name][qid]]
            tokens = sum(r["completion_tokens"] for r in turns)
            verify = sum(r["spec_verify_ct"] or 0 for r in turns)
            if verify > 0:
                accept = tokens / verify
            elif c.algorithm == "none":
                accept = 1.0  # one token per forward pass
            else:
                accept = None
            common = [qid for qid in speed if qid in base_speed]
            if c is base:
                speedup = 1.0
            elif common and sum(base_speed[q] for q in common) > 0:
                speedup = (sum(speed[q] for q in common) / len(common)) / (
                    sum(base_speed[q] for q in common) / len(common))
            else:
                speedup = None
            row = {"config": c.name, "algorithm": c.algorithm, "category": category,
                   "tokens_per_s": sum(speed.values()) / len(speed), "accept_length": accept, "speedup": speedup,
                   "n": len(speed)}
            for name in TELEMETRY:
                values = [r[name] for r in turns if name in r]
                if values:
                    row[name] = sum(values) / len(values)
            rows.append(row)
    return rows


def device_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
        names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
        if out.returncode == 0 and names:
            return names[0] if len(names) == 1 else f"{len(names)} x {names[0]}"
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return f"cpu ({platform.processor() or platform.machine()})"


def versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for package in ("sglang", "torch", "sglang-specvocab"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = "not installed"
    return out


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def markdown(result: dict) -> str:
    runs = result["runs"]
    telemetry = [name for name in TELEMETRY if any(name in r for r in runs)]
    base = runs[0]["config"] if runs else "-"
    head = [
        "# Spec-Bench on SGLang",
        "",
        f"- device: {result['device']}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items()),
        f"- concurrency {result['concurrency']}, temperature {result['temperature']:g}; speedup over `{base}` "
        "(ratio of mean per-question tokens/s); accept length = completion tokens / verify steps",
        f"- command: `{result['command']}`",
        "",
        "| config | algorithm | category | tokens/s | accept length | speedup | questions |"
        + "".join(f" {n.replace('dynvocab_', 'dynvocab ').replace('_', ' ')} |" for n in telemetry),
        "|---|---|---|---:|---:|---:|---:|" + "---:|" * len(telemetry),
    ]
    body = [
        f"| {r['config']} | {r['algorithm']} | {r['category']} | {r['tokens_per_s']:.2f} "
        f"| {_fmt(r['accept_length'], '.2f')} | {_fmt(r['speedup'], '.3f')} | {r['n']} |"
        + "".join(f" {_fmt(r.get(n), ',.0f' if n.endswith('set_size') else '.3f')} |" for n in telemetry)
        for r in runs
    ]
    return "\n".join(head + body) + "\n"


def plot(result: dict, path: Path) -> bool:
    """Speedup per category, one bar per configuration (the baseline is the line at 1)."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"]
    configs = list(dict.fromkeys(r["config"] for r in runs))
    shown = configs[1:] or configs
    categories = list(dict.fromkeys(r["category"] for r in runs))
    value = {(r["config"], r["category"]): r["speedup"] for r in runs}
    fig, ax = plt.subplots(figsize=(max(6.4, 1.1 * len(categories) * max(1, len(shown)) ** 0.5 + 2), 4.4))
    width = 0.8 / max(1, len(shown))
    for i, name in enumerate(shown):
        xs = [j + (i - (len(shown) - 1) / 2) * width for j in range(len(categories))]
        ys = [value.get((name, c)) or 0.0 for c in categories]
        bars = ax.bar(xs, ys, width, label=name, color=plt.cm.tab10(i % 10))
        ax.bar_label(bars, labels=[f"{y:.2f}" if y else "" for y in ys], fontsize=6, padding=1)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(categories)), categories, rotation=20, ha="right")
    ax.set_ylabel(f"speedup over {configs[0]}" if configs else "speedup")
    ax.set_title(f"Spec-Bench speedup ({result['device']}, concurrency {result['concurrency']}, "
                 f"temperature {result['temperature']:g})", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_report(result: dict, out_dir: Path, stem: str = "specbench") -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.md"]
    paths[0].write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    paths[1].write_text(markdown(result), encoding="utf-8")
    if plot(result, out_dir / f"{stem}.png"):
        paths.append(out_dir / f"{stem}.png")
    return paths
