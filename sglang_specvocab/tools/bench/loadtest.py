"""DYNVOCAB under load: many concurrent mixed requests against each DYNVOCAB server and its EAGLE3 control.

The plan (:func:`load_plan`, the same for every server, a function of ``seed``): ``requests`` requests,
all in flight at once by default (``concurrency``), each with

- a route: chat, completions or generate (see ``routes.py``);
- a prompt of 1 to ``max_prompt`` characters, log-uniform, cut from the Spec-Bench prompts (the tiny
  checkpoints' byte-level tokenizer makes one token per byte, so 1 to about 4k tokens there; the
  report gives the prompt tokens the servers counted);
- greedy, or sampled at ``temperature`` (a ``sampled`` share); 8-64 new tokens;
- streamed (a ``streamed`` share), or not;
- aborted (``aborts`` share): half by a client that leaves a stream after 1-3 events (SGLang aborts a
  request whose client disconnected), half by ``POST /abort_request`` for a running ``/generate``
  0.05-0.5 s after it was sent (it may have finished by then: then it counts as finished).

Verdict per DYNVOCAB configuration: the server is alive at the end (its process runs, ``/health``
answers); no request failed other than by its planned abort (a prompt longer than the context is
skipped and counted); every greedy request that finished on both servers has the same output as on
the control; every finished non-streamed ``/generate`` request carries DYNVOCAB's telemetry
(SGLang gives neither the OpenAI routes nor streams the request-level fields). A run is one unit:
a configuration whose run was cut short runs all its requests again.
"""

from __future__ import annotations

import math
import random
import threading
import time
import uuid
from dataclasses import dataclass

from ..prompts import Prompt
from .routes import ROUTES, PromptTooLong, ask, same_output, where_differs
from .server import (
    TELEMETRY,
    ResultCache,
    Server,
    ServerConfig,
    ServerSettings,
    SpecBenchError,
    http_json,
    run_concurrently,
)


@dataclass
class LoadSettings:
    requests: int = 1000
    concurrency: int | None = None  # requests in flight (None: all of them)
    min_prompt: int = 1
    max_prompt: int = 4096  # characters
    min_new_tokens: int = 8
    max_new_tokens: int = 64
    sampled: float = 0.3
    streamed: float = 0.3
    aborts: float = 0.1
    temperature: float = 0.8
    seed: int = 0


def load_plan(s: LoadSettings, texts: list[str]) -> list[dict]:
    """The requests, as data: ``i``, ``route``, ``prompt``, ``temperature``, ``max_new_tokens``,
    ``stream``, ``abort`` (None, ``disconnect`` or ``abort_request``) and ``after`` (events, or seconds)."""
    material = " ".join(t.strip() for t in texts if t.strip())
    if not material:
        raise SpecBenchError("load: no prompt text to cut prompts from")
    while len(material) < 2 * s.max_prompt:
        material = f"{material} {material}"
    rng = random.Random(s.seed)
    plan = []
    for i in range(s.requests):
        length = round(math.exp(rng.uniform(math.log(s.min_prompt), math.log(s.max_prompt))))
        start = rng.randrange(len(material) - length)
        u = rng.random()
        abort = "disconnect" if u < s.aborts / 2 else "abort_request" if u < s.aborts else None
        route = rng.choice(ROUTES)
        stream = rng.random() < s.streamed
        sampled = rng.random() < s.sampled
        new_tokens = rng.randint(s.min_new_tokens, s.max_new_tokens)
        after = rng.randint(1, 3) if abort == "disconnect" else round(rng.uniform(0.05, 0.5), 3)
        if abort == "disconnect":
            stream = True
        elif abort == "abort_request":  # by rid: /generate, and not streamed (a stream is the other kind)
            route, stream = "generate", False
        plan.append(
            {
                "i": i,
                "route": route,
                "prompt": material[start : start + length],
                "temperature": s.temperature if sampled else 0.0,
                "max_new_tokens": new_tokens,
                "stream": stream,
                "abort": abort,
                "after": after if abort else None,
            }
        )
    return plan


class LoadCheck:
    name = "load"

    def __init__(self, settings: LoadSettings, server: ServerSettings, prompts: list[Prompt], fingerprint):
        self.s, self.server_settings = settings, server
        self.texts = [p.text for p in prompts]
        self.fingerprint = fingerprint
        self._plan: list[dict] | None = None

    @property
    def plan(self) -> list[dict]:
        if self._plan is None:
            self._plan = load_plan(self.s, self.texts)
        return self._plan

    def validate(self, configs: list[ServerConfig], pairs: dict[str, str | None]) -> None:
        s = self.s
        if s.requests < 1 or (s.concurrency is not None and s.concurrency < 1):
            raise SpecBenchError("load: requests and concurrency must be at least 1")
        if not 1 <= s.min_prompt <= s.max_prompt or not 1 <= s.min_new_tokens <= s.max_new_tokens:
            raise SpecBenchError("load: prompt lengths and new tokens must be ranges of positive integers")
        if not s.temperature > 0:
            raise SpecBenchError(f"load: the sampled requests' temperature must be positive, got {s.temperature}")
        dyn = [c.name for c in configs if c.algorithm == "DYNVOCAB"]
        if not dyn:
            raise SpecBenchError("load: no DYNVOCAB configuration to check")
        alone = [d for d in dyn if not pairs.get(d)]
        if alone:
            raise SpecBenchError(
                f"load: DYNVOCAB configuration(s) {', '.join(alone)} have no EAGLE3 control (its greedy outputs "
                "under load are compared with the control's); add one, or name it with control=NAME"
            )
        self.plan  # noqa: B018 (made now: a bad prompt source is refused before any server starts)

    def applies(self, config: ServerConfig, pairs: dict[str, str | None]) -> bool:
        return config.algorithm == "DYNVOCAB" or config.name in pairs.values()

    def fp(self, config: ServerConfig) -> str:
        return self.fingerprint(config, {"check": "load", **vars(self.s)})

    def _key(self, config: ServerConfig, i: int | str) -> str:
        return f"load|{config.name}|{self.fp(config)}|{i}"

    def todo(self, config: ServerConfig, cache: ResultCache) -> int:
        return 0 if cache.get(self._key(config, "summary")) else len(self.plan)

    def run(self, server: Server, config: ServerConfig, cache: ResultCache, model: str, progress: bool) -> None:
        plan = self.plan
        workers = self.s.concurrency or len(plan)
        timeout = self.server_settings.request_timeout
        print(f"[{config.name}] load: {len(plan)} requests, {workers} in flight", flush=True)
        tag = uuid.uuid4().hex[:8]
        done = [0]
        lock = threading.Lock()

        def one(r: dict) -> None:
            rid = f"svload-{tag}-{r['i']}" if r["abort"] == "abort_request" else None
            timer, sent = None, threading.Event()
            if rid is not None:
                timer = threading.Timer(r["after"], _abort, (server.url, rid, sent))
                timer.daemon = True
                timer.start()
            t0 = time.perf_counter()
            try:
                out = ask(
                    server.url,
                    r["route"],
                    r["prompt"],
                    max_new_tokens=r["max_new_tokens"],
                    model=model,
                    timeout=timeout,
                    temperature=r["temperature"],
                    stream=r["stream"],
                    stop_after=r["after"] if r["abort"] == "disconnect" else None,
                    rid=rid,
                )
                if rid is not None and out.get("finish_reason") == "abort":
                    out["aborted"] = "abort_request"
            except PromptTooLong as exc:
                out = {"skipped": str(exc)[:300]}
            except SpecBenchError as exc:
                # SGLang may answer a non-streamed request it aborted with an HTTP error
                out = (
                    {"aborted": "abort_request", "reply": str(exc)[:300]}
                    if sent.is_set()
                    else {"error": str(exc)[:500]}
                )
            finally:
                if timer is not None:
                    timer.cancel()
            cache.append({"key": self._key(config, r["i"]), "i": r["i"], "wall_s": time.perf_counter() - t0, **out})
            with lock:
                done[0] += 1
                if progress and done[0] % 100 == 0:
                    print(f"[{config.name}] load: {done[0]} of {len(plan)}", flush=True)

        t0 = time.perf_counter()
        run_concurrently(one, plan, workers, f"load-{config.name}")
        wall = time.perf_counter() - t0
        alive = (server.proc is None or server.proc.poll() is None) and _healthy(server.url)
        cache.append({"key": self._key(config, "summary"), "alive": alive, "wall_s": wall, "run": tag})
        print(f"[{config.name}] load: {wall:.1f} s, server {'alive' if alive else 'DEAD'}", flush=True)

    def _summary(self, config: ServerConfig, cache: ResultCache) -> dict:
        recs = [cache.get(self._key(config, r["i"])) for r in self.plan]
        summary = cache.get(self._key(config, "summary")) or {}
        finished = [x for x in recs if x is not None and _finished(x)]
        prompt_tokens = [x["prompt_tokens"] for x in finished if isinstance(x.get("prompt_tokens"), int)]
        errors = [(r["i"], x["error"]) for r, x in zip(self.plan, recs, strict=True) if x and "error" in x]
        return {
            "config": config.name,
            "ran": bool(summary),
            "alive": summary.get("alive"),
            "wall_s": summary.get("wall_s"),
            "requests": len(self.plan),
            "finished": len(finished),
            "aborted_disconnect": sum(1 for x in recs if x and x.get("aborted") == "disconnect"),
            "aborted_abort_request": sum(1 for x in recs if x and x.get("aborted") == "abort_request"),
            "skipped": sum(1 for x in recs if x and "skipped" in x),
            "errors": len(errors),
            "first_errors": [{"request": i, "error": e} for i, e in errors[:5]],
            "missing": sum(1 for x in recs if x is None),
            "prompt_tokens": [min(prompt_tokens), max(prompt_tokens)] if prompt_tokens else None,
        }

    def report(self, configs: list[ServerConfig], pairs: dict[str, str | None], cache: ResultCache) -> dict:
        by_name = {c.name: c for c in configs}
        rows = []
        for c in configs:
            if c.algorithm != "DYNVOCAB" or not pairs.get(c.name):
                continue
            ctl = by_name[pairs[c.name]]
            mine, theirs = self._summary(c, cache), self._summary(ctl, cache)
            compared = equal = 0
            differences = []
            tel_expected = tel_present = 0
            for r in self.plan:
                got, want = cache.get(self._key(c, r["i"])), cache.get(self._key(ctl, r["i"]))
                if got is not None and _finished(got) and r["route"] == "generate" and not r["stream"]:
                    tel_expected += 1
                    tel_present += all(name in got for name in TELEMETRY)
                if r["temperature"] != 0 or not (got and want and _finished(got) and _finished(want)):
                    continue
                compared += 1
                if same_output(got, want):
                    equal += 1
                elif len(differences) < 10:
                    differences.append(
                        {"request": r["i"], "route": r["route"], "stream": r["stream"]} | where_differs(got, want)
                    )
            passed = (
                mine["ran"]
                and bool(mine["alive"])
                and mine["errors"] == 0
                and mine["missing"] == 0
                and compared > 0
                and equal == compared
                and tel_present == tel_expected
            )
            rows.append(
                {
                    "config": c.name,
                    "control": ctl.name,
                    "dynvocab": mine,
                    "eagle3": theirs,
                    "greedy_compared": compared,
                    "greedy_equal": equal,
                    "differences": differences,
                    "telemetry_expected": tel_expected,
                    "telemetry_present": tel_present,
                    "passed": passed,
                }
            )
        plan = self.plan
        return {
            "requests": len(plan),
            "concurrency": self.s.concurrency or len(plan),
            "mix": {
                "routes": {route: sum(r["route"] == route for r in plan) for route in ROUTES},
                "greedy": sum(r["temperature"] == 0 for r in plan),
                "sampled": sum(r["temperature"] > 0 for r in plan),
                "streamed": sum(r["stream"] for r in plan),
                "disconnect": sum(r["abort"] == "disconnect" for r in plan),
                "abort_request": sum(r["abort"] == "abort_request" for r in plan),
                "prompt_chars": [min(len(r["prompt"]) for r in plan), max(len(r["prompt"]) for r in plan)],
            },
            "temperature": self.s.temperature,
            "seed": self.s.seed,
            "rows": rows,
            "passed": bool(rows) and all(r["passed"] for r in rows),
        }

    @staticmethod
    def markdown(section: dict) -> list[str]:
        s, mix = section, section["mix"]
        lines = [
            "## Under load",
            "",
            (
                f"{s['requests']} requests, {s['concurrency']} in flight: routes "
                + ", ".join(f"{k} {v}" for k, v in mix["routes"].items())
                + f"; {mix['greedy']} greedy, {mix['sampled']} sampled (temperature {s['temperature']:g}); "
                f"{mix['streamed']} streamed; aborts: {mix['disconnect']} by disconnecting mid-stream, "
                f"{mix['abort_request']} by /abort_request; prompts of {mix['prompt_chars'][0]}-"
                f"{mix['prompt_chars'][1]} characters (seed {s['seed']})."
            ),
            "",
            f"**{'passed' if s['passed'] else 'FAILED'}**",
            "",
            (
                "| config | control | alive | finished | aborted (disconnect / abort_request) | skipped | errors | "
                "greedy equal / compared | telemetry | prompt tokens | wall s | control: alive, errors |"
            ),
            "|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|---|",
        ]
        for r in s["rows"]:
            d, e = r["dynvocab"], r["eagle3"]
            pt = f"{d['prompt_tokens'][0]}-{d['prompt_tokens'][1]}" if d["prompt_tokens"] else "-"
            wall = "-" if d["wall_s"] is None else f"{d['wall_s']:.0f}"
            lines.append(
                f"| {r['config']} | {r['control']} | {d['alive']} | {d['finished']} | {d['aborted_disconnect']} / "
                f"{d['aborted_abort_request']} | {d['skipped']} | {d['errors']} | {r['greedy_equal']} / "
                f"{r['greedy_compared']} | {r['telemetry_present']} / {r['telemetry_expected']} | {pt} | {wall} | "
                f"{e['alive']}, {e['errors']} |"
            )
        for r in s["rows"]:
            for err in r["dynvocab"]["first_errors"]:
                lines.append(f"- `{r['config']}` request {err['request']}: {err['error']}")
            for m in r["differences"]:
                lines.append(
                    f"- `{r['config']}` request {m['request']} ({m['route']}{', streamed' if m['stream'] else ''}) "
                    f"differs from `{r['control']}` at char {m['char']}: expected {m['expected']!r} / got {m['got']!r}"
                )
        return lines


def _finished(record: dict) -> bool:
    return not ({"error", "skipped", "aborted"} & record.keys()) and record.get("finish_reason") != "abort"


def _abort(url: str, rid: str, sent: threading.Event) -> None:
    sent.set()
    try:
        http_json(f"{url}/abort_request", {"rid": rid}, timeout=30.0)
    except SpecBenchError:
        pass  # finished already, or the server is going: the request's own reply says which


def _healthy(url: str) -> bool:
    try:
        http_json(f"{url}/health", timeout=10.0)
        return True
    except SpecBenchError:
        return False
