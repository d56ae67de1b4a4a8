"""``sglang-specvocab bench fit``: the head's cost-model constants (``headcost.HeadCosts``) from kernel measurements.

Input: the JSON of ``bench kernels`` (``bench_kernels/1``), or its Markdown (the headline table only: indexed
per-request times at the headline W and d, and the dense static head), which is all a result committed before the
JSON was kept gives. Fitted, each a roofline ``t0 + max(bytes / bandwidth, flops / throughput)`` in relative error:

- ``indexed``: the per-request head kernel, per shape the fastest backend measured (what ``auto`` would run); its
  throughput at most the dense GEMM's (the per-request shapes rarely bind it, so the data alone leave it open);
- ``dense``: the dense GEMMs (``dense_static``, ``dense_full``);
- ``copy``: the measured device-to-device copy bandwidth, with the launch gap as its start;
- ``launch_us``: the measured gap between kernels in a CUDA graph (``bench kernels`` measures it), else 2 us
  (an assumption, said so in the provenance);
- ``topk``: the fused top-k (``compact_topk``, the ``topk`` cases of backend cuda), bandwidth only, when at least 3
  were timed; else the model prices it as one copy pass (said so in the provenance);
- ``modes``: the plans timed on this device (the ``head`` records; the per-request plan where the indexed kernel was
  timed; stock, EAGLE3's own, always), the only ones ``auto`` may choose;
- ``margin``: the worst relative error of the indexed and dense fits: how much faster than stock another plan must
  be predicted before ``auto`` takes it.

The bytes and flops of a case are ``headcost.indexed_work`` / ``headcost.dense_work``, the same the cost model
predicts with, so the fit and the prediction cannot drift apart.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from ... import headcost
from ...errors import SpecVocabError

ELEM = {"bf16": 2, "fp16": 2, "fp32": 4}
ASSUMED_LAUNCH_US = 2.0


def _num(cell: str) -> float | None:
    m = re.match(r"\s*([0-9.]+)", cell)
    return float(m.group(1)) if m else None


def records_from_markdown(text: str) -> dict:
    """The parts of a ``bench kernels`` Markdown the fit needs, as a result dict (device, dtype, copy, records)."""
    title = re.search(r"^# Head-op kernels on (.+?)(?: \(CPU.*)?$", text, re.MULTILINE)
    head = re.search(r"^## Headline: W [0-9, ]+, d (\d+)", text, re.MULTILINE)
    copy = re.search(r"measured copy: ([0-9.]+) TB/s", text)
    dtype = re.search(r"^- dtype (\w+)", text, re.MULTILINE)
    if not (title and head and copy and dtype):
        raise SpecVocabError("bench fit: not a bench kernels Markdown (title, headline, copy or dtype line missing)")
    d = int(head.group(1))
    lines = [ln for ln in text[head.end() :].splitlines() if ln.startswith("|")]
    cols = [c.strip() for c in lines[0].strip("|").split("|")]
    records = []
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        if len(cells) != len(cols):
            break
        row = dict(zip(cols, cells, strict=True))
        W, rows, batch = int(row["W"]), int(row["rows"]), int(row["batch"])
        for name, cell in row.items():
            t = _num(cell)
            if t is None or "WRONG" in cell:
                continue
            base = {"W": W, "d": d, "rows": rows, "batch": batch, "M": rows * batch, "status": "ok", "median_us": t}
            if name.startswith("indexed "):
                records.append({"op": "indexed", "backend": name.split()[1], **base})
            elif name.startswith("dense "):
                H = int(name.split()[1])
                records.append({"op": "dense_static", "backend": "torch", **base, "W": H, "vocab": H})
    return {
        "device": {"type": "cuda", "name": title.group(1).strip()},
        "config": {"dtype": dtype.group(1)},
        "bandwidth": {"copy_Bps": float(copy.group(1)) * 1e12},
        "records": records,
        "command": None,
    }


def load_result(path: Path) -> dict:
    if not path.is_file():
        raise SpecVocabError(f"bench fit: {path} is not a file (give a bench kernels JSON or Markdown)")
    text = path.read_text()
    if path.suffix == ".md":
        return records_from_markdown(text)
    return json.loads(text)


def _dedupe(points: dict) -> list[tuple[float, float, float]]:
    return [v for _, v in sorted(points.items())]


def fit(result: dict, source: str, match: tuple[str, ...] | None = None, note: str | None = None) -> headcost.HeadCosts:
    """The constants of ``result`` (a ``bench kernels`` result dict); ``source`` names it in the provenance."""
    e = ELEM[result["config"].get("dtype", "bf16")]
    ok = [r for r in result["records"] if r.get("status") == "ok" and not str(r.get("check", "")).startswith("FAILED")]
    indexed: dict[tuple, tuple] = {}
    for r in ok:
        if r["op"] != "indexed":
            continue
        key = (r["W"], r["d"], r["rows"], r["batch"])
        N = r["rows"] * r["batch"]
        b, f = headcost.indexed_work(r["batch"] * r["W"], N, r["W"], r["d"], e)
        if key not in indexed or r["median_us"] < indexed[key][2]:
            indexed[key] = (b, f, r["median_us"])  # the fastest backend of the shape
    dense = {}
    for r in ok:
        if r["op"] in ("dense_static", "dense_full"):
            N = r["rows"] * r["batch"]
            dense[(r["op"], r["W"], r["d"], N)] = (*headcost.dense_work(r["W"], N, r["d"], e), r["median_us"])
    if len(indexed) < 3 or len(dense) < 3:
        raise SpecVocabError(
            f"bench fit: {source} has {len(indexed)} indexed and {len(dense)} dense measurements; at least 3 of each"
        )
    topk = {}
    for r in ok:
        if r["op"] == "topk" and r.get("backend") == "cuda" and r["W"] <= headcost.FUSED_TOPK_MAX_WIDTH:
            N = r["rows"] * r["batch"]
            topk[(r["W"], N)] = (N * r["W"] * 4.0, 0.0, r["median_us"])
    modes = {"stock"} | ({"per-request"} if indexed else set())
    modes |= {r["mode"] for r in ok if r["op"] == "head" and r.get("mode") in headcost.MODES}
    den_line, den_err = headcost.fit_roofline(_dedupe(dense))
    # our kernel's tensor-core throughput never passes cuBLAS's (and small batches never bind it: unconstrained)
    ind_line, ind_err = headcost.fit_roofline(_dedupe(indexed), max_flops_per_us=den_line.flops_per_us)
    launch = result.get("launch", {}).get("median_us")
    copy_bw = result["bandwidth"]["copy_Bps"] / 1e6  # bytes per microsecond
    name = result["device"].get("name") or "unknown"
    git = _git()
    prov = {
        "source": source,
        "command": result.get("command"),
        "fit_by": "sglang-specvocab bench fit" + (f" (git {git})" if git else ""),
        "dtype": result["config"].get("dtype", "bf16"),
        "indexed": f"{len(indexed)} shapes (fastest backend per shape), worst relative error {ind_err:.2f}; "
        "throughput at most the dense fit's",
        "dense": f"{len(dense)} shapes, worst relative error {den_err:.2f}",
        "copy": f"measured device-to-device copy, {copy_bw / 1e6:.3f} TB/s",
        "launch": "measured (a one-element kernel in a CUDA graph)"
        if launch
        else f"assumed {ASSUMED_LAUNCH_US} us (the source measured no launch gap)",
    }
    topk_line = None
    if len(topk) >= 3:
        topk_line, topk_err = headcost.fit_roofline(_dedupe(topk), flops=False)
        prov["topk"] = f"{len(topk)} compact_topk shapes, worst relative error {topk_err:.2f}"
    else:
        prov["topk"] = "not measured: priced as one copy pass"
    prov["modes"] = "the plans timed on this device (head records; per-request where the indexed kernel was timed)"
    prov["margin"] = "the worst relative error of the indexed and dense fits"
    if note:
        prov["note"] = note
    launch_us = float(launch) if launch else ASSUMED_LAUNCH_US
    return headcost.HeadCosts(
        device=name,
        match=match if match is not None else (_model_key(name),),
        indexed=ind_line,
        dense=den_line,
        copy=headcost.Roofline(t0_us=launch_us, bytes_per_us=copy_bw),
        launch_us=launch_us,
        provenance=prov,
        topk=topk_line,
        modes=tuple(m for m in headcost.MODES if m in modes),
        margin=round(max(ind_err, den_err), 4),
    )


def _model_key(name: str) -> str:
    """The part of a device name that identifies the model: 'NVIDIA H100 80GB HBM3' -> 'H100'."""
    for word in re.sub(r"^NVIDIA\s+", "", name, flags=re.IGNORECASE).upper().split():
        if re.search(r"\d", word):
            return word
    return name.upper()


def _git() -> str | None:
    """The revision that made the fit: ``$SV_GIT`` where a lease set it (its checkout has no .git), else git's."""
    if os.environ.get("SV_GIT"):
        return os.environ["SV_GIT"]
    root = Path(__file__).resolve().parents[3]
    try:
        cmd = ["git", "-C", str(root), "rev-parse", "--short", "HEAD"]
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        return out.stdout.strip() or None
    except OSError:
        return None


def model_errors(costs: headcost.HeadCosts, result: dict) -> list[dict]:
    """Predicted against measured for every ``head`` record of a result (the cost model's error on this device)."""
    out = []
    sizes = headcost.shipped_union_sizes()
    for r in result["records"]:
        if r.get("op") != "head" or r.get("status") != "ok":
            continue
        s = headcost.Shape(r["batch"], r["rows"], r["W"], r["d"], r["H"], r["vocab"], r["C"], mapped=r["kind"] == "d2t")
        pred = headcost.predict(s, costs, sizes).get(r["mode"])
        if pred is not None:
            out.append(
                {
                    **{k: r[k] for k in ("mode", "kind", "W", "d", "vocab", "rows", "batch")},
                    "measured_us": r["median_us"],
                    "predicted_us": pred,
                }
            )
    return out


def run(args) -> int:
    """``bench fit RESULT --out FILE``: write the constants (JSON), print them; 2 on an unreadable input."""
    result = load_result(args.result)
    match = tuple(m.upper() for m in args.match) if args.match else None
    costs = fit(result, str(args.result), match, getattr(args, "note", None))
    text = json.dumps(costs.to_json(), indent=1) + "\n"
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text, end="")
    return 0
