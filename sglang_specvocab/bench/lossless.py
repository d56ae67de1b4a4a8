"""Greedy losslessness against SGLang servers: the same prompts through every configuration, every
route and every concurrency, each output compared with the first configuration's (the reference,
normally the target alone).

A request is greedy (``temperature 0``) with a fixed token budget. Routes:

- ``chat``: ``/v1/chat/completions`` with the prompt as one user message;
- ``completions``: ``/v1/completions`` with the prompt as text;
- ``generate``: SGLang's ``/generate`` with the prompt as text; its ``meta_info`` gives the verify
  steps (accepted length) and DYNVOCAB's telemetry, and its ``output_ids`` the tokens.

``concurrency`` N keeps N requests in flight, so the server batches them (SGLang decodes the running
requests together): ``1`` and ``8`` are batch 1 and batch 8 (the defaults). Outputs are compared as
text (and as token ids where the route returns them); a mismatch records where the two first differ.
Results are cached per (configuration, settings, route, concurrency, prompt) in a JSON-lines file,
so a run cut short resumes where it stopped.

The verdict: every DYNVOCAB configuration equals the reference on every prompt, route and
concurrency. Other configurations (e.g. stock EAGLE3) are reported as controls: where a control
also differs from the reference, the difference is the engine's numerics (a batch-dependent kernel
path), not the dynamic vocabulary, and the reference's own batch-1 vs batch-8 agreement says how
batch-invariant the target alone is.
"""

from __future__ import annotations

import hashlib
import json
import math
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..prompts import Prompt, round_robin_prompts, spec_bench_file
from .server import (
    TELEMETRY,
    ResultCache,
    Server,
    ServerConfig,
    ServerSettings,
    SpecBenchError,
    check_unique,
    configs_from_args,
    device_name,
    fmt,
    http_json,
    run_concurrently,
    server_settings,
    sigterm_as_interrupt,
    telemetry,
    versions,
)

__all__ = [
    "ROUTES",
    "LosslessSettings",
    "check_tiny_names",
    "compare",
    "markdown",
    "request",
    "run_lossless",
    "tiny_configs",
    "write_report",
]

ROUTES = ("chat", "completions", "generate")


@dataclass
class LosslessSettings:
    max_new_tokens: int = 64
    concurrencies: tuple[int, ...] = (1, 8)
    routes: tuple[str, ...] = ROUTES
    server: ServerSettings = field(default_factory=ServerSettings)


# --- requests -----------------------------------------------------------------------------------


def _served_model(url: str) -> str:
    """The model name the OpenAI routes answer to (``/v1/models``), ``default`` if the server names none."""
    try:
        models = http_json(f"{url}/v1/models")
        data = models.get("data") if isinstance(models, dict) else None
        if data and isinstance(data[0], dict) and data[0].get("id"):
            return str(data[0]["id"])
    except SpecBenchError:
        pass
    return "default"


def request(url: str, route: str, prompt: str, max_new_tokens: int, model: str, timeout: float) -> dict:
    """One greedy request: ``{"text", "ids" (or None), "completion_tokens", "spec_verify_ct", telemetry...}``."""
    if route == "chat":
        reply = http_json(
            f"{url}/v1/chat/completions",
            {
                "model": model,
                "messages": [{"role": "user", "content": prompt}],
                "temperature": 0,
                "max_tokens": max_new_tokens,
            },
            timeout=timeout,
        )
        choice = _first_choice(reply, route)
        text = (choice.get("message") or {}).get("content")
    elif route == "completions":
        reply = http_json(
            f"{url}/v1/completions",
            {"model": model, "prompt": prompt, "temperature": 0, "max_tokens": max_new_tokens},
            timeout=timeout,
        )
        choice = _first_choice(reply, route)
        text = choice.get("text")
    elif route == "generate":
        reply = http_json(
            f"{url}/generate",
            {"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens}},
            timeout=timeout,
        )
        if isinstance(reply, list) and len(reply) == 1:
            reply = reply[0]
        if not isinstance(reply, dict) or not isinstance(reply.get("meta_info"), dict):
            raise SpecBenchError(f"/generate reply has no meta_info: {json.dumps(reply)[:300]}")
        meta = reply["meta_info"]
        ids = reply.get("output_ids")
        out = {
            "text": reply.get("text"),
            "ids": ids if isinstance(ids, list) else None,
            "completion_tokens": meta.get("completion_tokens"),
            "spec_verify_ct": meta.get("spec_verify_ct"),
            "finish_reason": _finish(meta.get("finish_reason")),
        }
        out.update(telemetry(meta))  # as Spec-Bench's records: a per-step list becomes its mean
        if not isinstance(out["text"], str):
            raise SpecBenchError(
                "/generate reply has no 'text' (a server started with --skip-tokenizer-init cannot be used)"
            )
        return out
    else:
        raise SpecBenchError(f"unknown route {route!r}; routes: {', '.join(ROUTES)}")
    if not isinstance(text, str):
        raise SpecBenchError(f"{route}: the reply has no text: {json.dumps(reply)[:300]}")
    usage = reply.get("usage") if isinstance(reply, dict) else None
    return {
        "text": text,
        "ids": None,
        "completion_tokens": usage.get("completion_tokens") if isinstance(usage, dict) else None,
        "spec_verify_ct": None,
        "finish_reason": _finish(choice.get("finish_reason")),
    }


def _first_choice(reply, route: str) -> dict:
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if not choices or not isinstance(choices[0], dict):
        raise SpecBenchError(f"{route}: the reply has no choices: {json.dumps(reply)[:300]}")
    return choices[0]


def _finish(value):
    return value.get("type") if isinstance(value, dict) else value


# --- running ------------------------------------------------------------------------------------


def _fingerprint(config: ServerConfig, settings: LosslessSettings) -> str:
    facts = {
        "algorithm": config.algorithm,
        "args": config.args,
        "url": config.url,
        "env": config.env,
        "launcher": config.launcher,
        "max_new_tokens": settings.max_new_tokens,
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def _key(config: str, fp: str, route: str, concurrency: int, p: Prompt) -> str:
    digest = hashlib.sha256(p.text.encode()).hexdigest()[:12]
    return f"{config}|{fp}|{route}|{concurrency}|{p.pid}|{digest}"


def run_lossless(
    configs: list[ServerConfig],
    prompts: list[Prompt],
    settings: LosslessSettings,
    cache_path: Path,
    log_dir: Path,
    command: str,
    progress: bool = True,
) -> dict:
    """Every prompt through every configuration, route and concurrency (cached ones skipped); the comparison."""
    from tqdm import tqdm  # the lab extra (progress bars)

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
    cache = ResultCache(cache_path)
    if cache.skipped_lines:
        print(f"cache {cache_path}: ignored {cache.skipped_lines} unreadable line(s)", file=sys.stderr)
    cases = [(route, c) for route in settings.routes for c in settings.concurrencies]
    for config in configs:
        fp = _fingerprint(config, settings)
        todo = [
            (route, c, p)
            for route, c in cases
            for p in prompts
            if cache.get(_key(config.name, fp, route, c, p)) is None
        ]
        total = len(cases) * len(prompts)
        if not todo:
            print(f"[{config.name}] all {total} requests are cached in {cache_path}: nothing to run", flush=True)
            continue
        print(f"[{config.name}] {len(todo)} of {total} requests to run", flush=True)
        with Server(config, settings.server, log_dir) as server:
            model = _served_model(server.url)
            timeout = settings.server.request_timeout
            for _ in range(settings.server.warmup):  # CUDA graphs and caches; not recorded
                _ask(server, "generate", prompts[0].text, min(16, settings.max_new_tokens), model, timeout)
            bar = tqdm(total=len(todo), desc=config.name, unit="req", disable=not progress, dynamic_ncols=True)
            try:
                for route, c in cases:
                    batch = [p for r, cc, p in todo if (r, cc) == (route, c)]
                    _run_case(server, config, fp, route, c, batch, settings, model, cache, bar)
            finally:
                bar.close()
    records = {
        c.name: {
            (route, cc, p.pid): cache.get(_key(c.name, _fingerprint(c, settings), route, cc, p))
            for route, cc in cases
            for p in prompts
        }
        for c in configs
    }
    return {
        "device": device_name(),
        "versions": versions(),
        "command": command,
        "max_new_tokens": settings.max_new_tokens,
        "routes": list(settings.routes),
        "concurrencies": list(settings.concurrencies),
        "prompts": len(prompts),
        "configs": [{"name": c.name, "algorithm": c.algorithm, "args": c.args, "url": c.url} for c in configs],
        **compare(configs, prompts, cases, records),
    }


def _ask(server: Server, route: str, prompt: str, max_new_tokens: int, model: str, timeout: float) -> dict:
    try:
        return request(server.url, route, prompt, max_new_tokens, model, timeout)
    except SpecBenchError:
        server.check_alive()
        raise


def _run_case(server, config, fp, route, concurrency, batch, settings, model, cache, bar) -> None:
    def one(p: Prompt) -> None:
        t0 = time.perf_counter()
        try:
            out = _ask(server, route, p.text, settings.max_new_tokens, model, settings.server.request_timeout)
        except SpecBenchError as exc:
            raise SpecBenchError(
                f"config {config.name!r}, {route}, concurrency {concurrency}, prompt {p.pid}: {exc}"
            ) from None
        cache.append(
            {
                "key": _key(config.name, fp, route, concurrency, p),
                "config": config.name,
                "route": route,
                "concurrency": concurrency,
                "prompt": p.pid,
                "wall_s": time.perf_counter() - t0,
                **out,
            }
        )
        bar.update(1)

    run_concurrently(one, batch, concurrency, f"lossless-{config.name}")


# --- comparison ---------------------------------------------------------------------------------


def _first_difference(a, b) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def compare(
    configs: list[ServerConfig], prompts: list[Prompt], cases: list[tuple[str, int]], records: dict[str, dict]
) -> dict:
    """``{"rows", "reference_batch_invariance", "lossless"}``: each configuration against the first, per case."""
    ref = configs[0]
    rows = []
    for c in configs[1:]:
        for route, cc in cases:
            row = {
                "config": c.name,
                "algorithm": c.algorithm,
                "route": route,
                "concurrency": cc,
                "compared": 0,
                "equal": 0,
                "missing": 0,
                "mismatches": [],
            }
            tokens = verify = 0
            telemetry: dict[str, list[float]] = {name: [] for name in TELEMETRY}
            for p in prompts:
                got, want = records[c.name].get((route, cc, p.pid)), records[ref.name].get((route, cc, p.pid))
                if got is None or want is None:
                    row["missing"] += 1
                    continue
                row["compared"] += 1
                same_ids = got.get("ids") is None or want.get("ids") is None or got["ids"] == want["ids"]
                if got["text"] == want["text"] and same_ids:
                    row["equal"] += 1
                else:
                    at = _first_difference(got["text"], want["text"])
                    row["mismatches"].append(
                        {
                            "prompt": p.pid,
                            "category": p.category,
                            "char": at,
                            "token": None
                            if got.get("ids") is None or want.get("ids") is None
                            else _first_difference(got["ids"], want["ids"]),
                            "reference": want["text"][max(0, at - 20) : at + 40],
                            "got": got["text"][max(0, at - 20) : at + 40],
                        }
                    )
                if isinstance(got.get("completion_tokens"), int) and isinstance(got.get("spec_verify_ct"), int):
                    tokens += got["completion_tokens"]
                    verify += got["spec_verify_ct"]
                for name in TELEMETRY:
                    if isinstance(got.get(name), float) and math.isfinite(got[name]):
                        telemetry[name].append(got[name])
            row["accept_length"] = tokens / verify if verify > 0 else None
            for name, values in telemetry.items():
                row[name] = sum(values) / len(values) if values else None
            rows.append(row)
    # the reference against itself across concurrencies: how batch-invariant the target alone is
    invariance = []
    base = min(cc for _, cc in cases)
    for route, cc in cases:
        if cc == base:
            continue
        pairs = [
            (records[ref.name].get((route, base, p.pid)), records[ref.name].get((route, cc, p.pid))) for p in prompts
        ]
        pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
        invariance.append(
            {
                "route": route,
                "concurrency": cc,
                "against": base,
                "compared": len(pairs),
                "equal": sum(a["text"] == b["text"] for a, b in pairs),
            }
        )
    dyn = [r for r in rows if r["algorithm"] == "DYNVOCAB"]
    lossless = bool(dyn) and all(r["equal"] == r["compared"] and r["missing"] == 0 for r in dyn)
    return {"reference": ref.name, "rows": rows, "reference_batch_invariance": invariance, "lossless": lossless}


# --- the tiny-checkpoint preset -----------------------------------------------------------------

#: (name, algorithm, draft subfolder, topk, steps, draft tokens); the first is the reference.
TINY_SET = (
    ("target", "none", None, 0, 0, 0),
    ("eagle3-d2t", "EAGLE3", "draft-d2t", 1, 3, 4),
    ("dynvocab-d2t", "DYNVOCAB", "draft-d2t", 1, 3, 4),
    ("dynvocab-d2t-tree", "DYNVOCAB", "draft-d2t", 4, 3, 8),
    ("eagle3-full", "EAGLE3", "draft-full", 1, 3, 4),
    ("dynvocab-full", "DYNVOCAB", "draft-full", 1, 3, 4),
    ("dynvocab-full-tree", "DYNVOCAB", "draft-full", 4, 3, 8),
)


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
) -> list[ServerConfig]:
    """The server set on the tiny checkpoints (``sglang-specvocab tiny-checkpoints``): no speculation,
    EAGLE3 and DYNVOCAB with both drafts, chains (topk 1) and trees (topk 4); CUDA graphs stay on."""
    check_tiny_names(names)
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
        "bfloat16",
        "--cuda-graph-max-bs-decode",
        "8",
        "--mem-fraction-static",
        "0.5",
        *(extra_args or []),
    ]
    out = []
    for name, algorithm, draft, topk, steps, nd in TINY_SET:
        if names and name not in names and name != "target":
            continue
        args = list(common)
        if algorithm != "none":
            args += [
                "--speculative-algorithm",
                algorithm,
                "--speculative-draft-model-path",
                str(root / draft),
                "--speculative-eagle-topk",
                str(topk),
                "--speculative-num-steps",
                str(steps),
                "--speculative-num-draft-tokens",
                str(nd),
            ]
        if algorithm == "DYNVOCAB" and dynvocab_config:
            args += ["--speculative-dynvocab-config", str(dynvocab_config)]
        out.append(ServerConfig(name, algorithm, args))
    return out


# --- report -------------------------------------------------------------------------------------


def markdown(result: dict) -> str:
    lines = [
        "# Greedy losslessness on SGLang",
        "",
        f"- device: {result['device']}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items()),
        f"- command: `{result['command']}`",
        (
            f"- {result['prompts']} Spec-Bench prompts (first turns), greedy, {result['max_new_tokens']} new tokens, "
            f"routes {', '.join(result['routes'])}, concurrency {', '.join(map(str, result['concurrencies']))}"
        ),
        f"- reference: `{result['reference']}`",
        f"- **verdict: {'every DYNVOCAB output equals the reference' if result['lossless'] else 'NOT lossless'}**",
        "",
        (
            "| config | algorithm | route | concurrency | equal / compared | missing | accept length | set size "
            "| coverage |"
        ),
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['config']} | {r['algorithm']} | {r['route']} | {r['concurrency']} | "
            f"{r['equal']} / {r['compared']} | {r['missing']} | {fmt(r['accept_length'], '.2f')} | "
            f"{fmt(r['dynvocab_set_size'], '.0f')} | {fmt(r['dynvocab_coverage'], '.3f')} |"
        )
    if result["reference_batch_invariance"]:
        lines += [
            "",
            "The reference against itself (batch invariance of the target alone):",
            "",
            "| route | concurrency | against | equal / compared |",
            "|---|---:|---:|---:|",
        ]
        for r in result["reference_batch_invariance"]:
            lines.append(f"| {r['route']} | {r['concurrency']} | {r['against']} | {r['equal']} / {r['compared']} |")
    shown = [(r, m) for r in result["rows"] for m in r["mismatches"]][:20]
    if shown:
        lines += ["", "First mismatches (text around the first differing character):", ""]
        for r, m in shown:
            lines.append(
                f"- `{r['config']}` {r['route']} c{r['concurrency']} prompt {m['prompt']} ({m['category']}), "
                f"char {m['char']}"
                + (f", token {m['token']}" if m["token"] is not None else "")
                + f": reference {m['reference']!r} / got {m['got']!r}"
            )
    return "\n".join(lines) + "\n"


def write_report(result: dict, out_dir: Path, stem: str = "lossless") -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.md"]
    paths[0].write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    paths[1].write_text(markdown(result), encoding="utf-8")
    return paths


# --- the command ----------------------------------------------------------------------------------


def run(args) -> int:
    """``sglang-specvocab check-lossless``: 0 when every DYNVOCAB output equals the reference, 1 when not."""
    if args.tiny is None and (args.only or args.server_args or args.dynvocab_config):
        raise SpecBenchError("--only, --server-args and --dynvocab-config go with --tiny")
    if args.tiny is None and not args.config and args.configs is None:
        raise SpecBenchError("give --tiny DIR, or --config/--configs (the first configuration is the reference)")
    configs = []
    if args.tiny is not None:
        check_tiny_names(args.only)  # before minutes of making checkpoints
        if not (args.tiny / "target" / "config.json").is_file():
            from ..testing.tiny import make_tiny_checkpoints  # heavy: transformers, only when they are missing

            print(f"making the tiny checkpoints in {args.tiny}", flush=True)
            make_tiny_checkpoints(args.tiny)
        configs += tiny_configs(args.tiny, shlex.split(args.server_args), args.dynvocab_config, args.only)
    configs += configs_from_args(args)
    prompts = round_robin_prompts(spec_bench_file(args.questions), args.prompts)
    settings = LosslessSettings(
        max_new_tokens=args.max_new_tokens,
        concurrencies=tuple(args.concurrency),
        routes=tuple(args.routes),
        server=ServerSettings(**server_settings(args)),
    )
    print(
        f"{len(prompts)} prompts x {len(settings.routes)} routes x concurrency "
        f"{','.join(map(str, settings.concurrencies))} x {len(configs)} configurations (reference: "
        f"{configs[0].name if configs else '-'})",
        flush=True,
    )
    with sigterm_as_interrupt():
        cache = args.cache or args.out / f"{args.name}-cache.jsonl"
        result = run_lossless(
            configs,
            prompts,
            settings,
            cache_path=cache,
            log_dir=args.out / "logs",
            command=args.command_line,
            progress=not args.no_progress,
        )
    paths = write_report(result, args.out, args.name)
    print()
    print(markdown(result), end="")
    for path in paths:
        print(f"wrote {path}")
    return 0 if result["lossless"] else 1
