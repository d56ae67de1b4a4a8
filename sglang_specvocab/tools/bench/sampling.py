"""Sampling is lossless on servers: with temperature > 0, DYNVOCAB's outputs are distributed as the target's.

For each of the first ``prompts`` prompts, every configuration draws ``samples`` continuations of
``tokens`` tokens through ``/generate`` (``batch`` copies of the prompt per request, so the server
decodes them as one batch; ``ignore_eos`` so every sample has ``tokens`` tokens) at ``temperature``
(and ``top_k`` when given). Speculative sampling is exact when the target verifies, so at every
position j the token of a DYNVOCAB sample has the same distribution as the target's.

Statistic: per (prompt, position), Pearson's chi-square test of homogeneity between the two
configurations' token counts (tokens with fewer than ``MIN_COUNT`` samples in both together are
pooled into one bin, so every expected count is at least about 5; p-value from the chi-square
distribution with bins - 1 degrees of freedom), and the total variation distance between the two
empirical distributions (reported, not tested).

Bound: a test rejects at p < ``alpha`` / m, where m is the number of DYNVOCAB-against-target tests
(every DYNVOCAB configuration, prompt and position). A DYNVOCAB configuration fails (``ours``, exit
1) when some test against the target rejects and, where it has an EAGLE3 control, some test against
the control rejects too; one that differs from the target only, like its control, is ``engine``.
Failing needs a rejection against the target, so by Bonferroni a server set whose DYNVOCAB sampling
is exact fails this check with probability at most ``alpha``. The same threshold labels the other
comparisons (DYNVOCAB against its control, the control against the target).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import Counter
from dataclasses import dataclass

from ..prompts import Prompt
from .routes import too_long
from .server import ResultCache, Server, ServerConfig, ServerSettings, SpecBenchError, http_json, run_concurrently

MIN_COUNT = 10  # pooled samples a token needs for a bin of its own
END = -1  # the token of a position past a sample's end (a server that stopped early)


@dataclass
class SamplingSettings:
    prompts: int = 8
    samples: int = 480  # per prompt and configuration
    tokens: int = 4  # positions compared
    # The tiny random target is nearly flat at temperature 1 (top token 0.2 % of 128k): no token gets the
    # MIN_COUNT samples a bin needs. At 0.3 its first token has 5-22 such tokens holding 58-96 % of the mass.
    temperature: float = 0.3
    top_k: int | None = None
    batch: int = 8  # samples per request: within the tiny servers' CUDA graphs (batch 8)
    concurrency: int = 1  # requests in flight
    alpha: float = 0.01  # bound on the chance that an exact server set fails the check


def chi2_tail(x: float, df: int) -> float:
    """P(X >= x) for X chi-square with ``df`` degrees of freedom: the regularized upper incomplete gamma Q(df/2, x/2)."""
    import torch  # heavy: torch.special.gammaincc (no scipy in the dependencies)

    return float(
        torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), torch.tensor(x / 2.0, dtype=torch.float64))
    )


def homogeneity(a: Counter, b: Counter, min_count: int = MIN_COUNT) -> dict:
    """Chi-square test of homogeneity of two samples' counts: ``{"chi2", "df", "p", "tv"}``."""
    na, nb = sum(a.values()), sum(b.values())
    if na == 0 or nb == 0:
        raise SpecBenchError("homogeneity: both samples must be non-empty")
    tokens = sorted(set(a) | set(b))
    kept = [(a[t], b[t]) for t in tokens if a[t] + b[t] >= min_count]
    ra = sum(a[t] for t in tokens if a[t] + b[t] < min_count)
    rb = sum(b[t] for t in tokens if a[t] + b[t] < min_count)
    if ra + rb:
        if ra + rb >= min_count or not kept:
            kept.append((ra, rb))
        else:  # too few for a bin of their own: into the smallest bin
            i = min(range(len(kept)), key=lambda k: sum(kept[k]))
            kept[i] = (kept[i][0] + ra, kept[i][1] + rb)
    chi2 = 0.0
    for ca, cb in kept:
        for x, n in ((ca, na), (cb, nb)):
            e = n * (ca + cb) / (na + nb)
            chi2 += (x - e) ** 2 / e
    df = len(kept) - 1
    p = 1.0 if df == 0 else chi2_tail(chi2, df)
    tv = 0.5 * sum(abs(a[t] / na - b[t] / nb) for t in tokens)
    return {"chi2": chi2, "df": df, "p": p, "tv": tv}


def histograms(samples: list[list[int]], tokens: int) -> list[Counter]:
    """Per position, the counts of the token there (``END`` past a sample's end)."""
    return [Counter(s[j] if j < len(s) else END for s in samples) for j in range(tokens)]


class SamplingCheck:
    name = "sampling"

    def __init__(self, settings: SamplingSettings, server: ServerSettings, prompts: list[Prompt], fingerprint):
        self.s, self.server_settings, self.prompts = settings, server, prompts[: settings.prompts]
        self.fingerprint = fingerprint
        self.batches = math.ceil(settings.samples / settings.batch)

    def validate(self, configs: list[ServerConfig], pairs: dict[str, str | None]) -> None:
        s = self.s
        if not s.temperature > 0:
            raise SpecBenchError(f"sampling: the temperature must be positive, got {s.temperature}")
        if min(s.samples, s.tokens, s.batch, s.concurrency, s.prompts) < 1 or (s.top_k is not None and s.top_k < 1):
            raise SpecBenchError("sampling: samples, tokens, batch, concurrency, prompts and top_k must be at least 1")
        if not 0 < s.alpha < 1:
            raise SpecBenchError(f"sampling: alpha must lie in (0, 1), got {s.alpha}")
        if len(self.prompts) < s.prompts:
            raise SpecBenchError(f"sampling: {s.prompts} prompts asked, {len(self.prompts)} available")

    def applies(self, config: ServerConfig, pairs: dict[str, str | None]) -> bool:
        return True

    def fp(self, config: ServerConfig) -> str:
        s = self.s
        facts = {"check": "sampling", "tokens": s.tokens, "temperature": s.temperature, "top_k": s.top_k}
        return self.fingerprint(config, {**facts, "batch": s.batch})

    def _key(self, config: ServerConfig, p: Prompt, b: int) -> str:
        return f"sampling|{config.name}|{self.fp(config)}|{p.pid}|{hash_text(p.text)}|{b}"

    def todo(self, config: ServerConfig, cache: ResultCache) -> int:
        return sum(cache.get(self._key(config, p, b)) is None for p in self.prompts for b in range(self.batches))

    def run(self, server: Server, config: ServerConfig, cache: ResultCache, model: str, progress: bool) -> None:
        s = self.s
        todo = [(p, b) for p in self.prompts for b in range(self.batches) if cache.get(self._key(config, p, b)) is None]
        print(f"[{config.name}] sampling: {len(todo)} requests of {s.batch} samples", flush=True)
        params = {"temperature": s.temperature, "max_new_tokens": s.tokens, "ignore_eos": True}
        if s.top_k is not None:
            params["top_k"] = s.top_k
        t0 = time.perf_counter()

        def one(item: tuple[Prompt, int]) -> None:
            p, b = item
            payload = {"text": [p.text] * s.batch, "sampling_params": params}
            try:
                reply = http_json(f"{server.url}/generate", payload, timeout=self.server_settings.request_timeout)
            except SpecBenchError as exc:
                if too_long(exc):
                    cache.append({"key": self._key(config, p, b), "skipped": str(exc)})
                    return
                server.check_alive()
                raise SpecBenchError(f"config {config.name!r}, sampling, prompt {p.pid}: {exc}") from None
            if not isinstance(reply, list) or len(reply) != s.batch:
                raise SpecBenchError(
                    f"config {config.name!r}: /generate with {s.batch} prompts answered {str(reply)[:200]}"
                )
            samples = [r.get("output_ids") if isinstance(r, dict) else None for r in reply]
            if not all(isinstance(x, list) for x in samples):
                raise SpecBenchError(f"config {config.name!r}: a /generate reply has no output_ids: {str(reply)[:200]}")
            cache.append({"key": self._key(config, p, b), "config": config.name, "prompt": p.pid, "samples": samples})

        run_concurrently(one, todo, s.concurrency, f"sampling-{config.name}")
        print(f"[{config.name}] sampling: done in {time.perf_counter() - t0:.1f} s", flush=True)

    def _samples(self, config: ServerConfig, p: Prompt, cache: ResultCache) -> list[list[int]] | str | None:
        """The prompt's samples, ``"skipped"`` (longer than the context), or None when some are missing."""
        out = []
        for b in range(self.batches):
            r = cache.get(self._key(config, p, b))
            if r is None:
                return None
            if "skipped" in r:
                return "skipped"
            out += r["samples"]
        return out[: self.s.samples]

    def report(self, configs: list[ServerConfig], pairs: dict[str, str | None], cache: ResultCache) -> dict:
        s, ref = self.s, configs[0]
        by_name = {c.name: c for c in configs}
        dyn = [c for c in configs if c.algorithm == "DYNVOCAB"]
        compared = []  # (config, against, kind): kind 'control' or 'target'
        for d in dyn:
            compared.append((d.name, ref.name, "target"))
            if pairs.get(d.name):
                compared.append((d.name, pairs[d.name], "control"))
        for ctl in sorted({c for c in pairs.values() if c}):
            compared.append((ctl, ref.name, "target"))
        m = len(dyn) * len(self.prompts) * s.tokens  # the DYNVOCAB-against-target tests: only they can fail it
        threshold = s.alpha / m if m else s.alpha
        hist = {}
        skipped: dict[str, int] = {}
        missing: dict[str, int] = {}
        for c in {x for a, b, _ in compared for x in (a, b)}:
            for p in self.prompts:
                got = self._samples(by_name[c], p, cache)
                if got == "skipped":
                    skipped[c] = skipped.get(c, 0) + 1
                elif got is None:
                    missing[c] = missing.get(c, 0) + 1
                else:
                    hist[c, p.pid] = histograms(got, s.tokens)
        rows = []
        for a, b, kind in compared:
            row = {
                "config": a,
                "against": b,
                "kind": kind,
                "tests": 0,
                "informative": 0,  # tests with at least two bins: a distribution so flat that every token is
                # rare gives one bin, and nothing to compare
                "rejected": 0,
                "min_p": None,
                "max_tv": None,
                "worst": None,
            }
            for p in self.prompts:
                if (a, p.pid) not in hist or (b, p.pid) not in hist:
                    continue
                for j in range(s.tokens):
                    t = homogeneity(hist[a, p.pid][j], hist[b, p.pid][j])
                    row["tests"] += 1
                    row["informative"] += t["df"] > 0
                    row["rejected"] += t["p"] < threshold
                    if row["min_p"] is None or t["p"] < row["min_p"]:
                        row["min_p"] = t["p"]
                        row["worst"] = {"prompt": p.pid, "position": j, **t}
                    row["max_tv"] = max(row["max_tv"] or 0.0, t["tv"])
            rows.append(row)
        verdicts = []
        for d in dyn:
            mine = {r["kind"]: r for r in rows if r["config"] == d.name}
            vs_target = mine["target"]["rejected"] > 0
            vs_control = mine["control"]["rejected"] > 0 if "control" in mine else None
            incomplete = missing.get(d.name, 0) > 0 or any(r["tests"] == 0 for r in mine.values())
            if vs_target and vs_control is not False:
                verdict = "ours"
            elif incomplete:
                verdict = "incomplete"
            elif mine["target"]["informative"] == 0:
                verdict = "inconclusive"  # flat distributions: lower the temperature or draw more samples
            else:
                verdict = "engine" if vs_target else "equal"
            verdicts.append({"config": d.name, "control": pairs.get(d.name), "verdict": verdict})
        passed = bool(verdicts) and all(v["verdict"] in ("equal", "engine") for v in verdicts)
        return {
            "prompts": len(self.prompts),
            "samples": s.samples,
            "tokens": s.tokens,
            "temperature": s.temperature,
            "top_k": s.top_k,
            "batch": s.batch,
            "alpha": s.alpha,
            "tests_that_can_fail": m,
            "threshold": threshold,
            "rows": rows,
            "verdicts": verdicts,
            "skipped_prompts": skipped,
            "missing_prompts": missing,
            "passed": passed,
        }

    @staticmethod
    def markdown(section: dict) -> list[str]:
        s = section
        top_k = f", top_k {s['top_k']}" if s["top_k"] else ""
        lines = [
            "## Sampling",
            "",
            (
                f"{s['prompts']} prompts x {s['samples']} samples of {s['tokens']} tokens per configuration, "
                f"temperature {s['temperature']:g}{top_k}, {s['batch']} samples per /generate request. Per prompt and "
                "position, a chi-square test of homogeneity of the token counts; a test rejects at "
                f"p < alpha / m = {s['alpha']:g} / {s['tests_that_can_fail']} = {s['threshold']:.3g} (Bonferroni over "
                "the m DYNVOCAB-against-target tests; failing needs one, so an exact server set fails with probability at "
                "most alpha). A DYNVOCAB configuration is `ours` (failed) when it differs from the target and from its "
                "control, `engine` when it differs from the target like its control. "
                "TV: total variation distance between the two empirical distributions. Informative: tests with at "
                "least two bins (a flat distribution leaves one); a configuration without any is `inconclusive`. "
                "Position 0 comes from the prefill; the later ones from speculative rounds."
            ),
            "",
            f"**{'passed: no DYNVOCAB distribution differs from both the target and its control' if s['passed'] else 'FAILED'}**",
            "",
            "| config | against | tests | informative | rejected | min p | max TV | worst (prompt, position, TV) |",
            "|---|---|---:|---:|---:|---:|---:|---|",
        ]
        for r in s["rows"]:
            w = r["worst"]
            worst = f"{w['prompt']}, {w['position']}, {w['tv']:.3f}" if w else "-"
            min_p = "-" if r["min_p"] is None else f"{r['min_p']:.3g}"
            max_tv = "-" if r["max_tv"] is None else f"{r['max_tv']:.3f}"
            lines.append(
                f"| {r['config']} | {r['against']} ({r['kind']}) | {r['tests']} | {r['informative']} | {r['rejected']} | "
                f"{min_p} | "
                f"{max_tv} | {worst} |"
            )
        lines += ["", "| DYNVOCAB config | control | verdict |", "|---|---|---|"]
        lines += [f"| {v['config']} | {v['control'] or '-'} | {v['verdict']} |" for v in s["verdicts"]]
        if s["skipped_prompts"] or s["missing_prompts"]:
            lines += [
                "",
                (
                    f"Skipped prompts (longer than the context): {s['skipped_prompts'] or 'none'}; "
                    f"prompts with missing samples: {s['missing_prompts'] or 'none'}."
                ),
            ]
        return lines


def hash_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]
