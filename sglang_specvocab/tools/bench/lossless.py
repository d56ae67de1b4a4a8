"""Losslessness of DYNVOCAB on SGLang servers: each configuration is launched once and runs the chosen
checks, every DYNVOCAB result is compared with the target alone (the first configuration, the
reference) and with its EAGLE3 control (the same server arguments with ``EAGLE3`` instead of
``DYNVOCAB``: same target, draft, topk, steps and draft tokens).

Checks (``--checks``):

- ``greedy`` (here): the same prompts, greedy, through every route (``routes``) and concurrency (``1``
  and ``8`` keep 1 or 8 requests in flight, so the server decodes batches of 1 and 8); outputs compared
  as text (and as token ids where the route returns them);
- ``sampling`` (``sampling.py``): temperature > 0, many samples per prompt, per-position token
  histograms compared with a chi-square test at a stated false-alarm bound;
- ``load`` (``loadtest.py``): 1,000 mixed concurrent requests (aborts included) against each DYNVOCAB
  server and its control: no crash, greedy outputs equal, telemetry on every finished request.

Why the control: where the engine itself is not batch-invariant (bf16 kernels choose other paths at
other batch sizes), stock EAGLE3 differs from the target alone at the same places, and so does
DYNVOCAB. A DYNVOCAB output equal to the target is lossless; one that differs from the target but
equals its control is the engine's numerics; one that differs from both is ours, and only ours fails
the check (exit 1). A DYNVOCAB configuration without a control is compared with the target alone,
and every difference counts as ours.

A prompt longer than the served context is skipped and counted (SGLang refuses it with HTTP 400),
never fatal. A check that fails on a configuration (a request fails, the server dies) is recorded,
reported and fails the run (exit 1); the other configurations and checks still run. Results are cached per check, configuration, settings and request in a JSON-lines
file, so a run cut short resumes where it stopped and starts no server whose work is cached.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..prompts import Prompt, round_robin_prompts, spec_bench_file
from .loadtest import LoadCheck, LoadSettings
from .routes import ROUTES, PromptTooLong, ask, same_output, served_model, where_differs
from .sampling import SamplingCheck, SamplingSettings
from .server import (
    TELEMETRY,
    ResultCache,
    Server,
    ServerConfig,
    ServerSettings,
    ServerStartError,
    SpecBenchError,
    check_unique,
    config_fingerprint,
    configs_from_args,
    device_name,
    fmt,
    run_concurrently,
    server_settings,
    sigterm_as_interrupt,
    speculative_args,
    versions,
)

__all__ = [
    "CHECKS",
    "FP32_UNSERVED",
    "ROUTES",
    "GreedyCheck",
    "LosslessSettings",
    "check_tiny_names",
    "controls",
    "markdown",
    "run_lossless",
    "tiny_configs",
    "write_report",
]

CHECKS = ("greedy", "sampling", "load")


@dataclass
class LosslessSettings:
    prompts: int | None = None  # greedy: the first N prompts (None: all)
    max_new_tokens: int = 64
    concurrencies: tuple[int, ...] = (1, 8)
    routes: tuple[str, ...] = ROUTES
    checks: tuple[str, ...] = ("greedy",)
    server: ServerSettings = field(default_factory=ServerSettings)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    load: LoadSettings = field(default_factory=LoadSettings)


# --- which configuration controls which --------------------------------------------------------

#: Flags that may differ between a DYNVOCAB configuration and its EAGLE3 control.
_OURS = ("--speculative-algorithm", "--speculative-dynvocab-config")


def _control_key(args: list[str]) -> tuple[str, ...]:
    """The server arguments without the algorithm and DYNVOCAB's config (both ``--flag v`` and ``--flag=v``)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in _OURS:
            skip = True
        elif not a.startswith(tuple(f + "=" for f in _OURS)):
            out.append(a)
    return tuple(out)


def controls(configs: list[ServerConfig]) -> dict[str, str | None]:
    """Each DYNVOCAB configuration -> its EAGLE3 control's name (or None): the one it names
    (``control``), else the EAGLE3 configuration whose arguments equal its own but for the algorithm
    and the DYNVOCAB config. Two candidates, or a named control that is not an EAGLE3 configuration
    here, are refused."""
    by_name = {c.name: c for c in configs}
    eagle3 = [c for c in configs if c.algorithm == "EAGLE3"]
    out: dict[str, str | None] = {}
    for c in configs:
        if c.algorithm != "DYNVOCAB":
            continue
        if c.control is not None:
            ctl = by_name.get(c.control)
            if ctl is None or ctl.algorithm != "EAGLE3":
                names = ", ".join(e.name for e in eagle3) or "none"
                raise SpecBenchError(
                    f"config {c.name!r}: control {c.control!r} is not an EAGLE3 configuration of this run "
                    f"(EAGLE3 configurations: {names})"
                )
            out[c.name] = ctl.name
            continue
        same = [e.name for e in eagle3 if c.args and _control_key(e.args) == _control_key(c.args)]
        if len(same) > 1:
            raise SpecBenchError(
                f"config {c.name!r}: several EAGLE3 configurations have its arguments ({', '.join(same)}); "
                "name one with control=NAME"
            )
        out[c.name] = same[0] if same else None
    return out


# --- the greedy check ---------------------------------------------------------------------------


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class GreedyCheck:
    """Every prompt through every route and concurrency, greedy; compared with the reference and the control."""

    name = "greedy"

    def __init__(self, settings: LosslessSettings, prompts: list[Prompt]):
        self.settings, self.prompts = settings, prompts[: settings.prompts]
        self.cases = [(route, c) for route in settings.routes for c in settings.concurrencies]
        # Staggered lengths (the full length, then 7/8, 6/8, 5/8 of it, in turn): requests in flight
        # together end at different steps, so the batch shrinks one request at a time and the servers
        # replay several of their captured CUDA-graph batch sizes. Every server gets the same per prompt.
        n = settings.max_new_tokens
        self.lengths = {p.pid: max(1, n - (i % 4) * n // 8) for i, p in enumerate(self.prompts)}

    def applies(self, config: ServerConfig, pairs: dict[str, str | None]) -> bool:
        return True

    def fp(self, config: ServerConfig) -> str:
        return config_fingerprint(
            config, {"check": "greedy", "max_new_tokens": self.settings.max_new_tokens, "lengths": "staggered"}
        )

    def _key(self, config: ServerConfig, route: str, concurrency: int, p: Prompt) -> str:
        return f"greedy|{config.name}|{self.fp(config)}|{route}|{concurrency}|{p.pid}|{_digest(p.text)}"

    def todo(self, config: ServerConfig, cache: ResultCache) -> int:
        return sum(cache.get(self._key(config, r, c, p)) is None for r, c in self.cases for p in self.prompts)

    def run(self, server: Server, config: ServerConfig, cache: ResultCache, model: str, progress: bool) -> None:
        from tqdm import tqdm  # the lab extra (progress bars)

        todo = [(r, c, p) for r, c in self.cases for p in self.prompts if cache.get(self._key(config, r, c, p)) is None]
        print(f"[{config.name}] greedy: {len(todo)} of {len(self.cases) * len(self.prompts)} requests", flush=True)
        bar = tqdm(total=len(todo), desc=f"{config.name} greedy", unit="req", disable=not progress, dynamic_ncols=True)
        timeout = self.settings.server.request_timeout
        try:
            for route, c in self.cases:
                batch = [p for r, cc, p in todo if (r, cc) == (route, c)]

                def one(p: Prompt, route=route, c=c) -> None:
                    t0 = time.perf_counter()
                    try:
                        out = ask(
                            server.url,
                            route,
                            p.text,
                            max_new_tokens=self.lengths[p.pid],
                            model=model,
                            timeout=timeout,
                        )
                    except PromptTooLong as exc:
                        out = {"skipped": str(exc)}
                    except SpecBenchError as exc:
                        server.check_alive()
                        raise SpecBenchError(
                            f"config {config.name!r}, {route}, concurrency {c}, prompt {p.pid}: {exc}"
                        ) from None
                    record = {"config": config.name, "route": route, "concurrency": c, "prompt": p.pid, **out}
                    cache.append({"key": self._key(config, route, c, p), "wall_s": time.perf_counter() - t0, **record})
                    bar.update(1)

                run_concurrently(one, batch, c, f"greedy-{config.name}")
        finally:
            bar.close()

    def report(self, configs: list[ServerConfig], pairs: dict[str, str | None], cache: ResultCache) -> dict:
        ref = configs[0]
        by_name = {c.name: c for c in configs}

        def rec(name: str, route: str, c: int, p: Prompt) -> dict | None:
            return cache.get(self._key(by_name[name], route, c, p))

        rows = []
        for c in configs[1:]:
            ctl = pairs.get(c.name) if c.algorithm == "DYNVOCAB" else None
            for route, cc in self.cases:
                row = {
                    "config": c.name,
                    "algorithm": c.algorithm,
                    "control": ctl,
                    "route": route,
                    "concurrency": cc,
                    "compared": 0,
                    "equal": 0,  # equal to the target (lossless, whatever the control did)
                    "engine": 0,  # differs from the target, equals the control (DYNVOCAB) / the control itself
                    "ours": 0,  # DYNVOCAB only: differs from the target and from its control (or has none)
                    "skipped": 0,
                    "missing": 0,
                    "mismatches": [],
                }
                tokens = verify = 0
                tel: dict[str, list[float]] = {name: [] for name in TELEMETRY}
                for p in self.prompts:
                    got, want = rec(c.name, route, cc, p), rec(ref.name, route, cc, p)
                    base = rec(ctl, route, cc, p) if ctl else None
                    if got is not None and "skipped" in got:
                        row["skipped"] += 1
                        continue
                    if (
                        got is None
                        or want is None
                        or "skipped" in want
                        or (ctl and (base is None or "skipped" in base))
                    ):
                        row["missing"] += 1
                        continue
                    row["compared"] += 1
                    vs_target = same_output(got, want)
                    vs_control = bool(ctl) and same_output(got, base)
                    if c.algorithm == "DYNVOCAB" and not vs_target and not vs_control:
                        row["ours"] += 1
                        row["mismatches"].append(
                            {"prompt": p.pid, "category": p.category, "kind": "ours", "against": "target"}
                            | where_differs(got, want)
                        )
                    elif not vs_target:
                        row["engine"] += 1
                        row["mismatches"].append(
                            {"prompt": p.pid, "category": p.category, "kind": "engine", "against": "target"}
                            | where_differs(got, want)
                        )
                    else:
                        row["equal"] += 1
                    if isinstance(got.get("completion_tokens"), int) and isinstance(got.get("spec_verify_ct"), int):
                        tokens += got["completion_tokens"]
                        verify += got["spec_verify_ct"]
                    for name in TELEMETRY:
                        if isinstance(got.get(name), float) and math.isfinite(got[name]):
                            tel[name].append(got[name])
                row["accept_length"] = tokens / verify if verify > 0 else None
                for name, values in tel.items():
                    row[name] = sum(values) / len(values) if values else None
                rows.append(row)
        # the reference against itself across concurrencies: how batch-invariant the target alone is
        invariance = []
        base_c = min(cc for _, cc in self.cases)
        for route, cc in self.cases:
            if cc == base_c:
                continue
            pairs_ = [(rec(ref.name, route, base_c, p), rec(ref.name, route, cc, p)) for p in self.prompts]
            pairs_ = [(a, b) for a, b in pairs_ if a is not None and b is not None and "skipped" not in a | b]
            invariance.append(
                {
                    "route": route,
                    "concurrency": cc,
                    "against": base_c,
                    "compared": len(pairs_),
                    "equal": sum(same_output(a, b) for a, b in pairs_),
                }
            )
        dyn = [r for r in rows if r["algorithm"] == "DYNVOCAB"]
        passed = bool(dyn) and all(r["ours"] == 0 and r["missing"] == 0 and r["compared"] > 0 for r in dyn)
        return {
            "max_new_tokens": self.settings.max_new_tokens,
            "routes": list(self.settings.routes),
            "concurrencies": list(self.settings.concurrencies),
            "prompts": len(self.prompts),
            "rows": rows,
            "reference_batch_invariance": invariance,
            "passed": passed,
        }

    @staticmethod
    def markdown(section: dict) -> list[str]:
        s = section
        lines = [
            "## Greedy parity",
            "",
            (
                f"{s['prompts']} Spec-Bench prompts (first turns), greedy, {s['max_new_tokens']} new tokens, routes "
                f"{', '.join(s['routes'])}, concurrency {', '.join(map(str, s['concurrencies']))}. `equal`: equal to "
                "the target; `engine`: differs from the target and equals the EAGLE3 control (the engine's numerics; "
                "for an EAGLE3 row: differs from the target); `ours`: a DYNVOCAB output that differs from the "
                "target and from its control (or has no control); `skipped`: prompt longer than the served context."
            ),
            "",
            f"**{'passed: no DYNVOCAB output differs from both the target and its control' if s['passed'] else 'FAILED'}**",
            "",
            (
                "| config | algorithm | control | route | concurrency | equal | engine | ours | skipped | missing "
                "| accept length | set size | coverage |"
            ),
            "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in s["rows"]:
            lines.append(
                f"| {r['config']} | {r['algorithm']} | {r['control'] or '-'} | {r['route']} | {r['concurrency']} | "
                f"{r['equal']} | {r['engine']} | {r['ours']} | {r['skipped']} | {r['missing']} | "
                f"{fmt(r['accept_length'], '.2f')} | {fmt(r['dynvocab_set_size'], '.0f')} | "
                f"{fmt(r['dynvocab_coverage'], '.3f')} |"
            )
        if s["reference_batch_invariance"]:
            lines += [
                "",
                "The reference against itself (batch invariance of the target alone):",
                "",
                "| route | concurrency | against | equal / compared |",
                "|---|---:|---:|---:|",
            ]
            for r in s["reference_batch_invariance"]:
                lines.append(f"| {r['route']} | {r['concurrency']} | {r['against']} | {r['equal']} / {r['compared']} |")
        shown = [(r, m) for r in s["rows"] for m in r["mismatches"] if m["kind"] == "ours"][:20]
        shown += [(r, m) for r in s["rows"] for m in r["mismatches"] if m["kind"] == "engine"][: 20 - len(shown)]
        if shown:
            lines += ["", "First differences (text around the first differing character):", ""]
            for r, m in shown:
                lines.append(
                    f"- {m['kind']}: `{r['config']}` {r['route']} c{r['concurrency']} prompt {m['prompt']} "
                    f"({m['category']}) against the {m['against']}, char {m['char']}"
                    + (f", token {m['token']}" if m["token"] is not None else "")
                    + f": expected {m['expected']!r} / got {m['got']!r}"
                )
        return lines


# --- running ------------------------------------------------------------------------------------


def _checks(settings: LosslessSettings, prompts: list[Prompt]) -> list:
    unknown = [c for c in settings.checks if c not in CHECKS]
    if unknown or not settings.checks:
        raise SpecBenchError(f"unknown check(s) {', '.join(unknown) or '(none)'}; checks: {', '.join(CHECKS)}")
    made = {
        "greedy": lambda: GreedyCheck(settings, prompts),
        "sampling": lambda: SamplingCheck(settings.sampling, settings.server, prompts, config_fingerprint),
        "load": lambda: LoadCheck(settings.load, settings.server, prompts, config_fingerprint),
    }
    return [made[c]() for c in CHECKS if c in settings.checks]


def _warm_up(server: Server, config: ServerConfig, model: str, prompts: list[Prompt], settings: LosslessSettings):
    """CUDA graphs and caches, not recorded; a failure here is a server that did not start."""
    for _ in range(settings.server.warmup):
        try:
            ask(
                server.url,
                "generate",
                prompts[0].text,
                max_new_tokens=min(16, settings.max_new_tokens),
                model=model,
                timeout=settings.server.request_timeout,
            )
        except PromptTooLong:
            pass
        except SpecBenchError as exc:
            try:
                server.check_alive()
            except SpecBenchError as dead:
                raise ServerStartError(config.name, str(dead)) from None
            raise ServerStartError(config.name, f"config {config.name!r}: its first request failed: {exc}") from None


def run_lossless(
    configs: list[ServerConfig],
    prompts: list[Prompt],
    settings: LosslessSettings,
    cache_path: Path,
    log_dir: Path,
    command: str,
    progress: bool = True,
) -> dict:
    """Each configuration launched once for the checks that still have work (cached work is skipped); the report."""
    check_unique(configs)
    if len(configs) < 2:
        raise SpecBenchError("give at least two configurations: the reference (first) and one to compare with it")
    if not prompts:
        raise SpecBenchError("no prompts")
    bad = [r for r in settings.routes if r not in ROUTES]
    if bad:
        raise SpecBenchError(f"unknown route(s) {', '.join(bad)}; routes: {', '.join(ROUTES)}")
    if not settings.concurrencies or min(settings.concurrencies) < 1:
        raise SpecBenchError(f"concurrencies must be at least 1, got {settings.concurrencies}")
    pairs = controls(configs)
    checks = _checks(settings, prompts)
    for check in checks:
        if hasattr(check, "validate"):
            check.validate(configs, pairs)  # before any server starts
    cache = ResultCache(cache_path)
    if cache.skipped_lines:
        print(f"cache {cache_path}: ignored {cache.skipped_lines} unreadable line(s)", file=sys.stderr)

    def failed_key(check, config: ServerConfig) -> str:
        return f"failed|{check.name}|{config.name}|{check.fp(config)}"

    for config in configs:
        work = [(c, c.todo(config, cache)) for c in checks if c.applies(config, pairs)]
        work = [(c, n) for c, n in work if n and cache.get(failed_key(c, config)) is None]
        if not work:
            print(f"[{config.name}] everything is cached in {cache_path}: nothing to run", flush=True)
            continue
        with contextlib.ExitStack() as stack:
            try:
                server = stack.enter_context(Server(config, settings.server, log_dir))
                model = served_model(server.url)
                _warm_up(server, config, model, prompts, settings)
            except ServerStartError as exc:
                if config.algorithm != "DYNVOCAB" or config.url is not None:
                    raise  # the engine cannot serve it, or nothing answers at its url: nothing to compare with
                # ours: recorded against each of its checks (exit 1, not retried), the other servers still run
                print(f"[{config.name}] did not start: {exc}", file=sys.stderr, flush=True)
                for check, _ in work:
                    cache.append(
                        {
                            "key": failed_key(check, config),
                            "check": check.name,
                            "config": config.name,
                            "error": f"the server did not start: {exc}"[:4000],
                        }
                    )
                continue
            for check, _ in work:
                try:
                    check.run(server, config, cache, model, progress)
                except SpecBenchError as exc:
                    # recorded, reported and not retried on resume; the other configurations still run
                    print(f"[{config.name}] {check.name} could not finish: {exc}", file=sys.stderr, flush=True)
                    cache.append(
                        {
                            "key": failed_key(check, config),
                            "check": check.name,
                            "config": config.name,
                            "error": str(exc)[:4000],
                        }
                    )
                    if server.proc is not None and server.proc.poll() is not None:
                        break  # the server died: its other checks cannot run either
    failures = [cache.get(failed_key(c, config)) for config in configs for c in checks if c.applies(config, pairs)]
    result = {
        "device": device_name(),
        "versions": versions(),
        "command": command,
        "checks": [c.name for c in checks],
        "prompts": len(prompts),
        "configs": [
            {"name": c.name, "algorithm": c.algorithm, "args": c.args, "url": c.url, "control": pairs.get(c.name)}
            for c in configs
        ],
        "reference": configs[0].name,
    }
    for check in checks:
        result[check.name] = check.report(configs, pairs, cache)
    result["failures"] = [{k: f[k] for k in ("check", "config", "error")} for f in failures if f]
    result["lossless"] = all(result[c.name]["passed"] for c in checks) and not result["failures"]
    return result


# --- the tiny-checkpoint preset -----------------------------------------------------------------

#: (name, algorithm, draft subfolder, topk, steps, draft tokens); the first is the reference. Every
#: DYNVOCAB configuration has its EAGLE3 control (the same draft and tree).
TINY_SET = (
    ("target", "none", None, 0, 0, 0),
    ("eagle3-d2t", "EAGLE3", "draft-d2t", 1, 3, 4),
    ("dynvocab-d2t", "DYNVOCAB", "draft-d2t", 1, 3, 4),
    ("eagle3-d2t-tree", "EAGLE3", "draft-d2t", 4, 3, 8),
    ("dynvocab-d2t-tree", "DYNVOCAB", "draft-d2t", 4, 3, 8),
    ("eagle3-full", "EAGLE3", "draft-full", 1, 3, 4),
    ("dynvocab-full", "DYNVOCAB", "draft-full", 1, 3, 4),
    ("eagle3-full-tree", "EAGLE3", "draft-full", 4, 3, 8),
    ("dynvocab-full-tree", "DYNVOCAB", "draft-full", 4, 3, 8),
)
TINY_DTYPES = ("float32", "bfloat16")
#: In --tiny DIR, the marker that float32 was tried and not served (its reason inside): auto uses bf16.
FP32_UNSERVED = "float32.unserved"


def check_tiny_names(names: list[str] | None) -> None:
    known = [t[0] for t in TINY_SET]
    unknown = [n for n in names or () if n not in known]
    if unknown:
        raise SpecBenchError(f"unknown tiny config(s) {', '.join(unknown)}; known: {', '.join(known)}")


def tiny_configs(
    root: str | Path,
    extra_args: list[str] | None = None,
    dynvocab_config: str | None = None,
    names: list[str] | None = None,
    dtype: str = "float32",
) -> list[ServerConfig]:
    """The server set on the tiny checkpoints (``sglang-specvocab tiny-checkpoints``): no speculation,
    EAGLE3 and DYNVOCAB with both drafts, chains (topk 1) and trees (topk 4); CUDA graphs stay on.
    ``names`` keeps those configurations, the reference and the controls of the DYNVOCAB ones kept."""
    check_tiny_names(names)
    if dtype not in TINY_DTYPES:
        raise SpecBenchError(f"tiny dtype {dtype!r} is not one of {', '.join(TINY_DTYPES)}")
    root = Path(root)
    missing = [d for d in ("target", "draft-d2t", "draft-full") if not (root / d / "config.json").is_file()]
    if missing:
        raise SpecBenchError(
            f"{root}: no tiny checkpoint in {', '.join(missing)}; make them with "
            f"sglang-specvocab tiny-checkpoints --out {root}"
        )
    common = [
        "--model-path",
        str(root / "target"),
        "--dtype",
        dtype,
        "--cuda-graph-max-bs-decode",
        "8",
        "--mem-fraction-static",
        "0.5",
        *(extra_args or []),
    ]
    keep = None
    if names:
        keep = {"target", *names}
        keep |= {n.replace("dynvocab-", "eagle3-") for n in names if n.startswith("dynvocab-")}
    out = []
    for name, algorithm, draft, topk, steps, nd in TINY_SET:
        if keep is not None and name not in keep:
            continue
        args = list(common)
        if algorithm != "none":
            args += speculative_args(algorithm, root / draft, topk, steps, nd, dynvocab_config)
        out.append(ServerConfig(name, algorithm, args))
    return out


# --- report -------------------------------------------------------------------------------------


def markdown(result: dict) -> str:
    pairs = [(c["name"], c["control"]) for c in result["configs"] if c["algorithm"] == "DYNVOCAB"]
    lines = [
        "# Losslessness of DYNVOCAB on SGLang",
        "",
        f"- device: {result['device']}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items()),
        f"- command: `{result['command']}`",
        f"- checks: {', '.join(result['checks'])}; reference: `{result['reference']}`",
        "- controls: " + (", ".join(f"`{d}` against `{c or 'the target only'}`" for d, c in pairs) or "none"),
        *(
            [
                f"- tiny checkpoints: {result['tiny']['dtype']}"
                + (
                    f" (float32 was not served: {result['tiny']['float32_unserved']})"
                    if result["tiny"]["float32_unserved"]
                    else ""
                )
            ]
            if result.get("tiny")
            else []
        ),
        f"- **verdict: {'lossless' if result['lossless'] else 'NOT lossless'}**",
    ]
    if result["failures"]:
        lines += ["", "## Checks that could not finish (not retried on resume: rerun with another --out)", ""]
        lines += [f"- {f['check']} on `{f['config']}`: {f['error'][:1500]}" for f in result["failures"]]
    for name, render in (
        ("greedy", GreedyCheck.markdown),
        ("sampling", SamplingCheck.markdown),
        ("load", LoadCheck.markdown),
    ):
        if name in result:
            lines += ["", *render(result[name])]
    return "\n".join(lines) + "\n"


def write_report(result: dict, out_dir: Path, stem: str = "lossless") -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.md"]
    paths[0].write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    paths[1].write_text(markdown(result), encoding="utf-8")
    return paths


# --- the command ----------------------------------------------------------------------------------


def _first_line(message: str) -> str:
    """A server error's first line, without the colon that introduces its log's tail."""
    return (message.splitlines() or [""])[0].rstrip(":")


def _tiny(args, dtype: str) -> list[ServerConfig]:
    """The tiny server set in ``dtype``, its checkpoints in ``--tiny DIR/dtype`` (made there if missing)."""
    root = args.tiny / dtype
    if not (root / "target" / "config.json").is_file():
        import torch  # heavy, and needed only to make the checkpoints

        from ..testing.tiny import make_tiny_checkpoints  # heavy: transformers

        print(f"making the tiny checkpoints ({dtype}) in {root}", flush=True)
        make_tiny_checkpoints(root, dtype=getattr(torch, dtype), force=True)
    return tiny_configs(root, shlex.split(args.server_args), args.dynvocab_config, args.only, dtype)


def run(args) -> int:
    """``sglang-specvocab check-lossless``: 0 when no DYNVOCAB result differs from its control, 1 when one does.

    ``--tiny`` with ``--dtype auto`` (the default) serves float32, where the target is batch-invariant;
    should a float32 server not start (SGLang's fused CUDA kernels may not take float32), it records why
    in ``DIR/float32.unserved`` and serves bfloat16, where the EAGLE3 controls tell the engine's numerics
    from ours; the report says which."""
    if args.tiny is None and (args.only or args.server_args or args.dynvocab_config or args.dtype):
        raise SpecBenchError("--only, --server-args, --dynvocab-config and --dtype go with --tiny")
    if args.tiny is None and not args.config and args.configs is None:
        raise SpecBenchError("give --tiny DIR, or --config/--configs (the first configuration is the reference)")
    dtypes = [None]
    if args.tiny is not None:
        check_tiny_names(args.only)  # before minutes of making checkpoints
        want = args.dtype or "auto"
        unserved = args.tiny / FP32_UNSERVED
        dtypes = [want] if want != "auto" else ["bfloat16"] if unserved.is_file() else ["float32", "bfloat16"]
    settings = LosslessSettings(
        prompts=args.prompts,
        max_new_tokens=args.max_new_tokens,
        concurrencies=tuple(args.concurrency),
        routes=tuple(args.routes),
        checks=tuple(args.checks),
        server=ServerSettings(**server_settings(args)),
        sampling=SamplingSettings(
            prompts=args.sampling_prompts,
            samples=args.samples,
            tokens=args.sample_tokens,
            temperature=args.sampling_temperature,
            top_k=args.sampling_top_k,
            alpha=args.alpha,
        ),
        load=LoadSettings(
            requests=args.load_requests,
            concurrency=args.load_concurrency or args.load_requests,
            max_prompt=args.load_max_prompt,
            seed=args.load_seed,
        ),
    )
    n = max(args.prompts, args.sampling_prompts if "sampling" in settings.checks else 0)
    prompts = round_robin_prompts(spec_bench_file(args.questions), n)
    cache = args.cache or args.out / f"{args.name}-cache.jsonl"
    for dtype in dtypes:
        configs = (_tiny(args, dtype) if dtype else []) + configs_from_args(args)
        print(
            f"checks {', '.join(settings.checks)} on {len(configs)} configurations (reference: "
            f"{configs[0].name if configs else '-'}{f', {dtype}' if dtype else ''}); greedy: {args.prompts} prompts "
            f"x {len(settings.routes)} routes x concurrency {','.join(map(str, settings.concurrencies))}",
            flush=True,
        )
        try:
            with sigterm_as_interrupt():
                result = run_lossless(
                    configs,
                    prompts,
                    settings,
                    cache_path=cache,
                    log_dir=args.out / "logs",
                    command=args.command_line,
                    progress=not args.no_progress,
                )
            break
        except ServerStartError as exc:
            if dtype != "float32" or len(dtypes) < 2:
                raise
            (args.tiny / FP32_UNSERVED).write_text(str(exc) + "\n", encoding="utf-8")
            print(f"float32 is not served ({_first_line(str(exc))}): serving bfloat16", file=sys.stderr, flush=True)
    if args.tiny is not None:
        note = None
        if dtype == "bfloat16" and (args.tiny / FP32_UNSERVED).is_file():
            note = _first_line((args.tiny / FP32_UNSERVED).read_text(encoding="utf-8"))
        result["tiny"] = {"dtype": dtype, "float32_unserved": note}
    paths = write_report(result, args.out, args.name)
    print()
    print(markdown(result), end="")
    for path in paths:
        print(f"wrote {path}")
    return 0 if result["lossless"] else 1
