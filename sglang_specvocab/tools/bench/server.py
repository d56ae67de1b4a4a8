"""Reaching SGLang servers for the benchmarks: the one place that launches, checks and stops them.

- configurations: ``ServerConfig`` from a ``--config`` spec (``name=..,args=".."``), a YAML file or a
  mapping (``make_config``), each either launched with ``args`` or reached at ``url``;
- ``Server``: a context manager that launches a configuration (its own session, log file, /health
  polling) or checks the one at its url, and stops what it launched (SIGTERM, then SIGKILL);
- ``http_json``, ``http_events`` (a streamed reply's events), ``model_info``, ``telemetry`` (DYNVOCAB's
  ``meta_info`` fields), ``run_concurrently``;
- ``ResultCache`` (JSON lines, resumable) and the facts every result records (``device_name``,
  ``versions``).

Every failure is a ``SpecBenchError`` naming the configuration, the URL or the file.
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
from importlib import metadata
from pathlib import Path
from typing import Self

import yaml

from ...errors import SpecVocabError

#: Accepted names (any case) of the ``algorithm`` label -> how reports spell them.
ALGORITHMS = {a.lower(): a for a in ("none", "EAGLE", "EAGLE3", "DYNVOCAB", "NGRAM", "STANDALONE")}
#: meta_info fields the DYNVOCAB integration adds; reported when a server sends them.
TELEMETRY = ("dynvocab_set_size", "dynvocab_coverage")
_CONFIG_KEYS = ("name", "algorithm", "args", "url", "env", "launcher", "control")
_LOG_TAIL_LINES = 40


class SpecBenchError(SpecVocabError):
    """A benchmark that cannot run: bad configuration, question file, server or response."""


class ServerStartError(SpecBenchError):
    """A configuration's server did not start (or did not answer its first request)."""

    def __init__(self, config: str, message: str):
        super().__init__(message)
        self.config = config


@dataclass
class ServerSettings:
    """How servers are launched and reached."""

    warmup: int = 2  # unrecorded requests per server before timing
    server_timeout: float = 900.0
    request_timeout: float = 1800.0
    host: str = "127.0.0.1"
    launcher: list[str] = field(default_factory=lambda: [sys.executable, "-m", "sglang.launch_server"])
    poll_interval: float = 1.0


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
    control: str | None = None  # check-lossless: the EAGLE3 configuration a DYNVOCAB one is compared with


def config_fingerprint(config: ServerConfig, facts: dict) -> str:
    """What a cached result depends on: the server (arguments, url, environment, launcher) and a check's ``facts``."""
    facts = {
        "algorithm": config.algorithm,
        "args": config.args,
        "url": config.url,
        "env": config.env,
        "launcher": config.launcher,
        **facts,
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def speculative_args(
    algorithm: str, draft: str | Path, topk: int, steps: int, draft_tokens: int, dynvocab_config: str | Path | None
) -> list[str]:
    """The server arguments of a speculative configuration (the DYNVOCAB config file for DYNVOCAB alone)."""
    args = [
        "--speculative-algorithm",
        algorithm,
        "--speculative-draft-model-path",
        str(draft),
        "--speculative-eagle-topk",
        str(topk),
        "--speculative-num-steps",
        str(steps),
        "--speculative-num-draft-tokens",
        str(draft_tokens),
    ]
    if algorithm == "DYNVOCAB" and dynvocab_config:
        args += ["--speculative-dynvocab-config", str(dynvocab_config)]
    return args


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
    control = raw.get("control")
    if control is not None and (not isinstance(control, str) or not control):
        raise SpecBenchError(f"{where}: 'control' must name another configuration, got {control!r}")
    return ServerConfig(name, ALGORITHMS[algorithm.lower()], args, url, env, launcher, control)


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


def configs_from_args(args) -> list[ServerConfig]:
    """The configurations of a command's ``--configs`` file (first) and its ``--config`` specs, in order."""
    from_file = load_config_file(args.configs) if args.configs is not None else []
    return from_file + [parse_config_spec(spec) for spec in args.config]


def server_settings(args) -> dict:
    """``ServerSettings`` fields from a command's server options (``--warmup``, timeouts, ``--launcher``, ``--host``)."""
    launcher = shlex.split(args.launcher)
    if not launcher:
        raise SpecBenchError("--launcher is empty")
    return {
        "warmup": args.warmup,
        "server_timeout": args.server_timeout,
        "request_timeout": args.request_timeout,
        "host": args.host,
        "launcher": launcher,
    }


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


# --- HTTP ---------------------------------------------------------------------------------------

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # local servers: never via a proxy


def http_json(url: str, payload: dict | None = None, timeout: float = 30.0):
    """GET (no payload) or POST JSON; the decoded reply. Every failure is a SpecBenchError naming the URL."""
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(
        url,
        data=data,
        method="GET" if data is None else "POST",
        headers={} if data is None else {"Content-Type": "application/json"},
    )
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


def http_events(url: str, payload: dict, timeout: float = 30.0, stop_after: int | None = None):
    """POST JSON and yield the decoded ``data:`` events of a server-sent-event reply, up to ``[DONE]``.

    ``stop_after`` N: close the connection after N events (a client that goes away mid-stream; SGLang
    aborts the request when it sees the disconnect). Failures are SpecBenchErrors naming the URL."""
    req = urllib.request.Request(
        url, data=json.dumps(payload).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        resp = _OPENER.open(req, timeout=timeout)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", errors="replace").strip()[:1000]
        raise SpecBenchError(f"{url}: HTTP {exc.code} {exc.reason}" + (f": {detail}" if detail else "")) from None
    except (urllib.error.URLError, OSError) as exc:
        raise SpecBenchError(f"{url}: no answer ({getattr(exc, 'reason', None) or exc})") from None
    n = 0
    try:
        for raw in resp:
            line = raw.decode("utf-8", errors="replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            try:
                yield json.loads(data)
            except json.JSONDecodeError:
                raise SpecBenchError(f"{url}: a streamed event is not JSON: {data[:200]!r}") from None
            n += 1
            if stop_after is not None and n >= stop_after:
                return
    except OSError as exc:
        raise SpecBenchError(f"{url}: the stream broke off ({exc})") from None
    finally:
        resp.close()


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


def telemetry(meta: dict) -> dict[str, float]:
    """DYNVOCAB's fields of a ``meta_info`` (``TELEMETRY``), each a request's mean: a per-step list is
    averaged, non-finite entries dropped; fields the server did not send are absent."""
    out = {}
    for name in TELEMETRY:
        values = _numbers(meta.get(name))
        if values:
            out[name] = sum(values) / len(values)
    return out


def _numbers(value) -> list[float]:
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, (int, float)):
        return [float(value)] if math.isfinite(value) else []
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _numbers(v)]
    return []


# --- servers ------------------------------------------------------------------------------------


class Server:
    """A context manager: launches ``config`` (and stops it on exit) or checks the server at its url."""

    def __init__(self, config: ServerConfig, settings: ServerSettings, log_dir: Path):
        self.config, self.settings, self.log_dir = config, settings, Path(log_dir)
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None
        self.url = config.url or ""

    def __enter__(self) -> Self:
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
                self.proc = subprocess.Popen(
                    cmd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env={**os.environ, **cfg.env},
                    start_new_session=True,
                )
            except OSError as exc:
                raise ServerStartError(
                    cfg.name, f"config {cfg.name!r}: cannot run {cmd[0]!r}: {exc.strerror or exc}"
                ) from None
        self._wait_healthy(f"server {cfg.name!r} did not become healthy within {s.server_timeout:g} s")

    def _wait_healthy(self, timeout_message: str) -> None:
        deadline = time.monotonic() + self.settings.server_timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise ServerStartError(
                    self.config.name,
                    f"server {self.config.name!r} exited with code {self.proc.returncode} before it became healthy"
                    + self.log_tail(),
                )
            if _healthy(self.url):
                return
            if time.monotonic() >= deadline:
                raise ServerStartError(self.config.name, timeout_message + self.log_tail())
            time.sleep(self.settings.poll_interval)

    def check_alive(self) -> None:
        """After a failed request: say so if the launched server died."""
        if self.proc is not None and self.proc.poll() is not None:
            raise SpecBenchError(
                f"server {self.config.name!r} exited with code {self.proc.returncode}" + self.log_tail()
            )

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


class ResultCache:
    """Results, one JSON line each (with a ``key``), appended as they finish: a run cut short resumes."""

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

    def get(self, key: str) -> dict | None:
        return self.records.get(key)

    def append(self, record: dict) -> None:
        with self.lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
            self.records[record["key"]] = record


# --- facts of a run -----------------------------------------------------------------------------


def device_name() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
        if out.returncode == 0 and names:
            return names[0] if len(names) == 1 else f"{len(names)} x {names[0]}"
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import torch  # heavy, and needed only when nvidia-smi named no GPU

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return f"cpu ({platform.processor() or platform.machine()})"


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for package in ("sglang", "torch", "sglang-specvocab"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = "not installed"
    out["git"] = git_revision()
    return out


def git_revision(root: Path | None = None) -> str:
    """The package's checkout: ``git describe --always --dirty`` where ``root`` (default: the checkout this
    package runs from) has a ``.git``; else ``$SV_GIT`` (what scripts/device/ stages with a checkout that has no
    ``.git``, the same describe); else ``unknown``."""
    root = Path(__file__).resolve().parents[3] if root is None else Path(root)
    if (root / ".git").exists():  # a directory, or a worktree's file: never the git of a directory above it
        try:
            out = subprocess.run(
                ["git", "-C", str(root), "describe", "--always", "--dirty"],
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
            )
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return os.environ.get("SV_GIT") or "unknown"


def fmt(value, spec: str) -> str:
    """``value`` formatted with ``spec``, or ``-`` for None (report tables)."""
    return "-" if value is None else format(value, spec)
