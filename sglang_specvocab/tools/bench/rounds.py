"""Decode round time at real model sizes: EAGLE3 against DYNVOCAB, per batch size and draft kind.

Checkpoints (:mod:`sglang_specvocab.tools.testing.shaped`, made once into ``checkpoints``): random weights
with real shapes, a Llama-3-8B-shaped target cut to ``layers`` layers (V = 128256, d = 4096) and its
EAGLE-3 drafts, one with a 32k d2t head and one over the full vocabulary. Acceptance is irrelevant
here (random drafts are rarely accepted); what is timed is a round: the draft steps and the verify
of the whole batch, where the draft head is the part DYNVOCAB changes.

Load formats (``LOAD_FORMATS``): ``random`` writes those weights (5.3 GB at llama3-8b x 4) and the
servers load them; ``dummy`` writes only what SGLang reads (the ``config.json`` files and the target's
tokenizer, 3 MB) and starts every server with SGLang's ``--load-format dummy`` (random weights drawn
in place, no file read). ``dummy`` serves the full-vocabulary draft only (``dummy_refusal``).

Servers (the preset, ``rounds_configs``): per draft kind, EAGLE3 and DYNVOCAB with the same arguments
(chain by default: topk 1, 3 steps, 4 draft tokens), CUDA graphs on up to the largest batch size.

Measurement: for each batch size bs, bs requests of ``prompt_len`` random token ids (different per
request, so no prefix is shared), greedy, ``ignore_eos``, are sent at once and timed from the first
send to the last reply, once with ``lengths[0]`` and once with ``lengths[1]`` new tokens. The batch
decodes in lockstep, so it runs R = max over its requests of ``spec_verify_ct`` rounds. The mean
round time is

    t_round = (T_long - T_short) / (R_long - R_short),

which cancels the prefill, the first token and the client's own time (both runs have the same
prompts). Each pair is run ``repeats`` times; the median is reported with the min-max spread. The
ratio DYNVOCAB / EAGLE3 of ``t_round`` per bs and draft kind is the result (< 1: DYNVOCAB's rounds
are faster). Every timed run is cached (JSON lines), so a run cut short resumes.
"""

from __future__ import annotations

import hashlib
import json
import random
import shlex
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .server import (
    ResultCache,
    Server,
    ServerConfig,
    ServerSettings,
    SpecBenchError,
    check_unique,
    device_name,
    fmt,
    http_json,
    run_concurrently,
    server_settings,
    sigterm_as_interrupt,
    speculative_args,
    versions,
)

KINDS = ("d2t", "full")
NAMES = tuple(f"{alg}-{kind}" for kind in KINDS for alg in ("eagle3", "dynvocab"))
LOAD_FORMATS = ("random", "dummy")  # random: written checkpoints (the default); dummy: SGLang's dummy loader
DUMMY_KINDS = ("full",)  # the draft kinds a dummy load serves soundly (``dummy_refusal``)
# Chosen by ``bench rounds --load-format``: refused in --server-args, where they would bypass the d2t check.
LOAD_FLAGS = ("--load-format", "--speculative-draft-load-format")


def dummy_refusal(names: list[str]) -> str:
    """Why ``--load-format dummy`` cannot serve the d2t draft (facts of the pinned SGLang).

    The dummy loader (``model_loader/loader.py:1479`` ``DummyModelLoader``) builds the model and fills
    its floating-point state with ``initialize_dummy_weights`` (``model_loader/weight_utils.py:1740``);
    it never calls ``model.load_weights``. The EAGLE-3 draft's d2t map is no tensor of the model:
    ``LlamaForCausalLMEagle3`` keeps it as ``hot_token_id``, None from ``__init__``
    (``models/llama_eagle3.py:323``) and set only by ``load_weights`` from the checkpoint's ``d2t``
    (``:350-353``; ``t2d`` is skipped, ``:355``). After a dummy load the map is therefore absent, not
    zeros or garbage: EAGLE3 takes the 32k head's rows as target ids (no ``hot_token_id[topk_index]``
    gather, and the topk-1 chain path only a full head takes, ``speculative/eagle_worker_v2.py:366``,
    ``:757``, ``:791``), so it would time another program than a d2t draft runs; DYNVOCAB reads the
    same ``hot_token_id`` (``integration/worker.py`` ``dynvocab_hot_token_id``), would take the head
    for a full one (``V`` rows) while it has 32k, and index it with target ids past its end. A
    d2t/t2d-only safetensors file is no way out: the dummy loader reads no file, and a non-dummy
    draft load of such a file sets only what it holds (``loader.py:1063`` hands it to ``load_weights``,
    which checks no name is missing): the draft's weights would stay as allocated, not initialised.
    """
    return (
        f"--load-format dummy cannot serve the d2t draft ({', '.join(names)}): SGLang's dummy loader never "
        "calls the draft's load_weights, so its d2t map (hot_token_id) stays unset and the 32k head's rows "
        "would be taken for target ids; use --only "
        f"{','.join(f'{a}-{k}' for k in DUMMY_KINDS for a in ('eagle3', 'dynvocab'))} with --load-format dummy, "
        "or --load-format random for the d2t draft"
    )


@dataclass
class RoundsSettings:
    batch_sizes: tuple[int, ...] = (1, 8, 32, 64)
    lengths: tuple[int, int] = (32, 160)  # new tokens of the short and the long run
    prompt_len: int = 128
    repeats: int = 3
    seed: int = 0
    server: ServerSettings = field(default_factory=ServerSettings)


def rounds_configs(
    root: str | Path,
    settings: RoundsSettings,
    extra_args: list[str] | None = None,
    dynvocab_config: str | None = None,
    names: list[str] | None = None,
    topk: int = 1,
    steps: int = 3,
    draft_tokens: int = 4,
    load_format: str = "random",
) -> list[ServerConfig]:
    """EAGLE3 and DYNVOCAB with each draft of ``root`` (``testing.shaped``), the same arguments but the algorithm.

    ``load_format="dummy"``: every server gets ``--load-format dummy`` and ``--speculative-draft-load-format
    dummy``, and only the full-vocabulary draft is served (all names: the full ones; a d2t name: refused)."""
    unknown = [n for n in names or () if n not in NAMES]
    if unknown:
        raise SpecBenchError(f"unknown rounds config(s) {', '.join(unknown)}; known: {', '.join(NAMES)}")
    if load_format not in LOAD_FORMATS:
        raise SpecBenchError(f"unknown load format {load_format!r}; known: {', '.join(LOAD_FORMATS)}")
    given = [a for a in extra_args or () if a.split("=", 1)[0] in LOAD_FLAGS]
    if given:
        raise SpecBenchError(
            f"--server-args must not set {', '.join(given)}: choose the weights with --load-format "
            f"({', '.join(LOAD_FORMATS)})"
        )
    kinds = KINDS
    if load_format == "dummy":
        refused = [n for n in names or () if n.rsplit("-", 1)[-1] not in DUMMY_KINDS]
        if refused:
            raise SpecBenchError(dummy_refusal(refused))
        kinds = DUMMY_KINDS
    root = Path(root)
    bs = max(settings.batch_sizes)
    common = [
        "--model-path",
        str(root / "target"),
        "--dtype",
        "bfloat16",
        "--cuda-graph-max-bs-decode",
        str(bs),
        "--max-running-requests",
        str(bs),
        "--context-length",
        str(settings.prompt_len + max(settings.lengths) + 64),
        "--mem-fraction-static",
        "0.6",
        *(extra_args or []),
    ]
    draft_load = []
    if load_format == "dummy":
        # The draft runner's LoadConfig takes --speculative-draft-load-format, else --load-format
        # (model_executor/model_runner.py:1538-1549, model_runner_components/load_model_utils.py:223): the
        # draft would be dummy with the first flag alone; the second says so explicitly.
        common += ["--load-format", "dummy"]
        draft_load = ["--speculative-draft-load-format", "dummy"]
    out = []
    for kind in kinds:
        for alg in ("EAGLE3", "DYNVOCAB"):
            name = f"{alg.lower()}-{kind}"
            if names and name not in names:
                continue
            spec = speculative_args(alg, root / f"draft-{kind}", topk, steps, draft_tokens, dynvocab_config)
            out.append(ServerConfig(name, alg, [*common, *spec, *draft_load]))
    return out


def make_dummy_checkpoints(root: str | Path, shape: str, layers: int, seed: int = 0) -> dict[str, int]:
    """What SGLang reads under ``--load-format dummy``, the same files as ``make_shaped_checkpoints`` writes
    but no weights: ``target/`` (``config.json`` and the tokenizer) and ``draft-full/config.json``; the bytes
    per folder. The tokenizer is needed: ``bench rounds`` sends token ids, but a server started without
    ``--skip-tokenizer-init`` loads its tokenizer from the model path (the draft worker never does:
    ``managers/tp_worker.py:326``), and the servers keep the arguments of ``random`` but the load format.
    Removes only the three folders of ``testing.shaped`` first."""
    import torch  # heavy: only to make checkpoints

    from ..testing.shaped import SUBDIRS, meta_models  # heavy: transformers
    from ..testing.tiny import build_tokenizer

    root = Path(root)
    for sub in SUBDIRS:
        shutil.rmtree(root / sub, ignore_errors=True)
    models = meta_models(shape, layers, seed=seed)  # on the meta device: configs only, no memory
    tdir, ddir = root / "target", root / "draft-full"
    tdir.mkdir(parents=True)
    models["target"].config.save_pretrained(tdir)
    build_tokenizer(models["target"].config.vocab_size).save_pretrained(tdir)
    ddir.mkdir(parents=True)
    hf = models["draft-full"].cfg.to_hf_config(torch.bfloat16)
    (ddir / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    sizes = {d.name: sum(p.stat().st_size for p in d.rglob("*") if p.is_file()) for d in (tdir, ddir)}
    facts = {"shape": shape, "layers": layers, "seed": seed, "bytes": sizes, "weights": False}
    (root / "shape.json").write_text(json.dumps(facts))
    return sizes


def prompt_ids(settings: RoundsSettings, bs: int, vocab_size: int, low: int = 260) -> list[list[int]]:
    """bs prompts of ``prompt_len`` random ids in [low, vocab_size) (past the specials and bytes), seeded."""
    rng = random.Random(f"{settings.seed}-{bs}")
    return [[rng.randrange(low, vocab_size) for _ in range(settings.prompt_len)] for _ in range(bs)]


def round_time(short: dict, long: dict) -> float | None:
    """``(T_long - T_short) / (R_long - R_short)`` of two timed runs (``wall_s``, ``rounds``), None when R does not grow."""
    dr = long["rounds"] - short["rounds"]
    return (long["wall_s"] - short["wall_s"]) / dr if dr > 0 else None


def time_batch(url: str, ids: list[list[int]], new_tokens: int, timeout: float) -> dict:
    """Send every prompt at once (greedy, ``ignore_eos``); the batch's wall time and rounds."""
    replies: list[dict] = []
    params = {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}

    def one(p: list[int]) -> None:
        reply = http_json(f"{url}/generate", {"input_ids": p, "sampling_params": params}, timeout=timeout)
        if isinstance(reply, list) and len(reply) == 1:
            reply = reply[0]
        meta = reply.get("meta_info") if isinstance(reply, dict) else None
        if not isinstance(meta, dict) or not isinstance(meta.get("completion_tokens"), int):
            raise SpecBenchError(f"/generate reply has no meta_info.completion_tokens: {str(reply)[:300]}")
        replies.append(meta)

    t0 = time.perf_counter()
    run_concurrently(one, ids, len(ids), "rounds")
    wall = time.perf_counter() - t0
    tokens = [m["completion_tokens"] for m in replies]
    if min(tokens) != new_tokens:
        raise SpecBenchError(f"asked for {new_tokens} new tokens with ignore_eos, got {min(tokens)}-{max(tokens)}")
    verify = [m.get("spec_verify_ct") for m in replies]
    rounds = max(v if isinstance(v, int) else t for v, t in zip(verify, tokens, strict=True))
    return {"wall_s": wall, "rounds": rounds, "tokens": sum(tokens), "verify": sum(v or 0 for v in verify)}


def _fingerprint(config: ServerConfig, settings: RoundsSettings) -> str:
    facts = {
        "args": config.args,
        "env": config.env,
        "launcher": config.launcher,
        "prompt_len": settings.prompt_len,
        "seed": settings.seed,
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def run_rounds(
    configs: list[ServerConfig],
    settings: RoundsSettings,
    vocab_size: int,
    cache_path: Path,
    log_dir: Path,
    command: str,
    progress: bool = True,
    load_format: str = "random",
) -> dict:
    """Every (batch size, length, repeat) not cached, one server at a time; the table."""
    check_unique(configs)
    s = settings
    _check_settings(s)
    cache = ResultCache(cache_path)
    if cache.skipped_lines:
        print(f"cache {cache_path}: ignored {cache.skipped_lines} unreadable line(s)", file=sys.stderr)
    runs = [(bs, n, r) for bs in s.batch_sizes for r in range(s.repeats) for n in s.lengths]
    for config in configs:
        todo = [x for x in runs if cache.get(_key(config, s, *x)) is None]
        if not todo:
            print(f"[{config.name}] all {len(runs)} runs are cached: nothing to run", flush=True)
            continue
        _run_config(config, s, todo, vocab_size, cache, log_dir, progress)
    rows = _rows(configs, s, cache)
    ratios = _ratios(rows, s)
    return {
        "device": device_name(),
        "versions": versions(),
        "command": command,
        "load_format": load_format,
        "batch_sizes": list(s.batch_sizes),
        "lengths": list(s.lengths),
        "prompt_len": s.prompt_len,
        "repeats": s.repeats,
        "configs": [{"name": c.name, "algorithm": c.algorithm, "args": c.args} for c in configs],
        "rows": rows,
        "ratios": ratios,
    }


def _check_settings(s: RoundsSettings) -> None:
    """Two increasing lengths; batch sizes, repeats and the prompt length at least 1."""
    if len(s.lengths) != 2 or not 0 < s.lengths[0] < s.lengths[1]:
        raise SpecBenchError(f"lengths must be two increasing positive token counts, got {list(s.lengths)}")
    if min(s.batch_sizes) < 1 or s.repeats < 1 or s.prompt_len < 1:
        raise SpecBenchError("batch sizes, repeats and the prompt length must be at least 1")


def _key(config: ServerConfig, s: RoundsSettings, bs: int, n: int, r: int) -> str:
    """The cache key of one timed run: the config (by name and fingerprint), batch size, length and repeat."""
    return f"rounds|{config.name}|{_fingerprint(config, s)}|{bs}|{n}|{r}"


def _run_config(
    config: ServerConfig,
    s: RoundsSettings,
    todo: list[tuple[int, int, int]],
    vocab_size: int,
    cache: ResultCache,
    log_dir: Path,
    progress: bool,
) -> None:
    """The runs ``todo`` (batch size, length, repeat) of one config on one server, each appended to the cache."""
    with Server(config, s.server, log_dir) as server:
        for bs in sorted({bs for bs, _, _ in todo}):
            ids = prompt_ids(s, bs, vocab_size)
            for _ in range(s.server.warmup):  # Triton and allocator warm-up at this batch size
                time_batch(server.url, ids, s.lengths[0], s.server.request_timeout)
            for b, n, r in todo:
                if b != bs:
                    continue
                try:
                    got = time_batch(server.url, ids, n, s.server.request_timeout)
                except SpecBenchError as exc:
                    server.check_alive()
                    raise SpecBenchError(f"config {config.name!r}, bs {bs}, {n} tokens: {exc}") from None
                cache.append(
                    {
                        "key": _key(config, s, bs, n, r),
                        "config": config.name,
                        "bs": bs,
                        "new_tokens": n,
                        "repeat": r,
                        **got,
                    }
                )
                if progress:
                    print(
                        f"[{config.name}] bs {bs}, {n} tokens, repeat {r}: {got['wall_s']:.3f} s, "
                        f"{got['rounds']} rounds",
                        flush=True,
                    )


def _rows(configs: list[ServerConfig], s: RoundsSettings, cache: ResultCache) -> list[dict]:
    """Per config and batch size: the round time (median, min, max over the repeats) and the accept length."""
    rows = []
    for config in configs:
        for bs in s.batch_sizes:
            times = []
            for r in range(s.repeats):
                short, long = (cache.get(_key(config, s, bs, n, r)) for n in s.lengths)
                if short and long and (t := round_time(short, long)) is not None:
                    times.append(t)
            last = cache.get(_key(config, s, bs, s.lengths[1], s.repeats - 1))
            rows.append(
                {
                    "config": config.name,
                    "algorithm": config.algorithm,
                    "kind": config.name.rsplit("-", 1)[-1],
                    "bs": bs,
                    "round_ms": statistics.median(times) * 1e3 if times else None,
                    "min_ms": min(times) * 1e3 if times else None,
                    "max_ms": max(times) * 1e3 if times else None,
                    "repeats": len(times),
                    "accept_length": last["tokens"] / last["verify"] if last and last["verify"] else None,
                }
            )
    return rows


def _ratios(rows: list[dict], s: RoundsSettings) -> list[dict]:
    """DYNVOCAB's round time over EAGLE3's, per kind and batch size where both have one."""
    ratios = []
    by = {(r["config"], r["bs"]): r for r in rows}
    for kind in KINDS:
        for bs in s.batch_sizes:
            e, d = by.get((f"eagle3-{kind}", bs)), by.get((f"dynvocab-{kind}", bs))
            if e and d and e["round_ms"] and d["round_ms"]:
                ratios.append(
                    {
                        "kind": kind,
                        "bs": bs,
                        "eagle3_ms": e["round_ms"],
                        "dynvocab_ms": d["round_ms"],
                        "ratio": d["round_ms"] / e["round_ms"],
                    }
                )
    return ratios


def markdown(result: dict) -> str:
    lines = [
        "# Decode round time: DYNVOCAB against EAGLE3",
        "",
        f"- device: {result['device']}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items()),
        f"- command: `{result['command']}`",
        "- weights: "
        + (
            "SGLang's --load-format dummy (no checkpoint read)"
            if result.get("load_format") == "dummy"
            else "random checkpoints with real shapes"
        )
        + "; accept lengths are those of random weights, not of a trained draft",
        (
            f"- bs requests of {result['prompt_len']} random prompt ids sent at once, greedy, ignore_eos; a round "
            f"= (T({result['lengths'][1]} tokens) - T({result['lengths'][0]} tokens)) / (R_long - R_short), R = "
            f"the batch's verify rounds; median of {result['repeats']} repeats (min-max)"
        ),
        "",
        "| draft | bs | EAGLE3 ms/round | DYNVOCAB ms/round | DYNVOCAB / EAGLE3 |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in result["ratios"]:
        lines.append(f"| {r['kind']} | {r['bs']} | {r['eagle3_ms']:.3f} | {r['dynvocab_ms']:.3f} | {r['ratio']:.3f} |")
    lines += ["", "| config | bs | ms/round | min-max | repeats | accept length |", "|---|---:|---:|---|---:|---:|"]
    for r in result["rows"]:
        spread = "-" if r["min_ms"] is None else f"{r['min_ms']:.3f}-{r['max_ms']:.3f}"
        lines.append(
            f"| {r['config']} | {r['bs']} | {fmt(r['round_ms'], '.3f')} | {spread} | {r['repeats']} | "
            f"{fmt(r['accept_length'], '.2f')} |"
        )
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> bool:
    try:
        import matplotlib  # optional: the plot needs matplotlib
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # optional: the plot needs matplotlib

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for name in sorted({r["config"] for r in result["rows"]}):
        pts = [(r["bs"], r["round_ms"]) for r in result["rows"] if r["config"] == name and r["round_ms"]]
        if pts:
            ax1.plot(*zip(*pts, strict=True), marker="o", label=name)
    for kind in KINDS:
        pts = [(r["bs"], r["ratio"]) for r in result["ratios"] if r["kind"] == kind]
        if pts:
            ax2.plot(*zip(*pts, strict=True), marker="o", label=f"{kind} draft")
    ax1.set(xscale="log", xlabel="batch size", ylabel="ms per round", title="decode round time")
    ax2.axhline(1.0, color="grey", lw=0.8)
    ax2.set(xscale="log", xlabel="batch size", ylabel="DYNVOCAB / EAGLE3", title="round time ratio")
    for ax in (ax1, ax2):
        ax.legend(fontsize=8)
    fig.suptitle(f"{result['device']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_report(result: dict, out_dir: Path, stem: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.md"]
    png = out_dir / f"{stem}.png"
    result["plot"] = png.name if plot(result, png) else None
    paths[0].write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    paths[1].write_text(markdown(result), encoding="utf-8")
    return paths + ([png] if result["plot"] else [])


def run(args) -> int:
    """``sglang-specvocab bench rounds``: 0 when every asked ratio was measured, 1 when some could not be."""
    settings = RoundsSettings(
        batch_sizes=tuple(args.batch_sizes),
        lengths=tuple(args.lengths),
        prompt_len=args.prompt_len,
        repeats=args.repeats,
        server=ServerSettings(**server_settings(args)),
    )
    if len(settings.lengths) != 2 or not settings.lengths[0] < settings.lengths[1]:
        raise SpecBenchError(f"--lengths takes two increasing token counts, got {args.lengths}")
    configs = rounds_configs(
        args.checkpoints or args.out / "checkpoints",
        settings,
        shlex.split(args.server_args),
        args.dynvocab_config,
        args.only,
        args.topk,
        args.steps,
        args.draft_tokens,
        args.load_format,
    )
    root = Path(args.checkpoints or args.out / "checkpoints")
    made = root / "shape.json"
    want = {"shape": args.shape, "layers": args.layers}
    have = json.loads(made.read_text()) if made.is_file() else None
    if have is not None and {k: have.get(k) for k in want} != want:
        raise SpecBenchError(
            f"{root} holds {have['shape']} x {have['layers']} layers, not {args.shape} x "
            f"{args.layers}: give another --checkpoints folder"
        )
    # A folder with weights serves dummy too (the same configs); one of configs only (an earlier
    # --load-format dummy) is made again with weights for random.
    if have is None and args.load_format == "dummy":
        print(f"writing {args.shape} configs and tokenizer ({args.layers} layers, no weights) in {root}", flush=True)
        sizes = make_dummy_checkpoints(root, args.shape, args.layers)
        print(f"  {', '.join(f'{k} {v / 2**20:.1f} MiB' for k, v in sizes.items())}", flush=True)
    elif args.load_format == "random" and (have is None or not have.get("weights", True)):
        from ..testing.shaped import make_shaped_checkpoints  # heavy: transformers, safetensors

        print(f"making {args.shape} checkpoints ({args.layers} layers) in {root}", flush=True)
        t0 = time.perf_counter()
        sizes = make_shaped_checkpoints(root, args.shape, args.layers, force=True)
        print(
            f"  {', '.join(f'{k} {v / 2**30:.2f} GiB' for k, v in sizes.items())} in {time.perf_counter() - t0:.0f} s",
            flush=True,
        )
    vocab = json.loads((root / "target" / "config.json").read_text())["vocab_size"]
    with sigterm_as_interrupt():
        result = run_rounds(
            configs,
            settings,
            vocab,
            args.cache or args.out / f"{args.name}-cache.jsonl",
            args.out / "logs",
            args.command_line,
            progress=not args.no_progress,
            load_format=args.load_format,
        )
    paths = write_report(result, args.out, args.name)
    print()
    print(markdown(result), end="")
    for path in paths:
        print(f"wrote {path}")
    kinds = {c.name.rsplit("-", 1)[-1] for c in configs if c.algorithm == "DYNVOCAB"} & {
        c.name.rsplit("-", 1)[-1] for c in configs if c.algorithm == "EAGLE3"
    }
    return 0 if len(result["ratios"]) == len(kinds) * len(settings.batch_sizes) else 1
