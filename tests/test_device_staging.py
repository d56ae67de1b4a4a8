"""scripts/device: stage.py (chunks, manifest, trims) on small fake files, the stand-ins, run.sh's sequencing."""

from __future__ import annotations

import csv
import importlib.util
import json
import random
import subprocess
import sys
import zipfile
from fnmatch import fnmatch
from importlib import metadata
from pathlib import Path

import pytest

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


SIZES = {"big-1.0-py3-none-any.whl": 250, "a-1.0-py3-none-any.whl": 60, "b-2.0-py3-none-any.whl": 45,
         "c-0.1-py3-none-any.whl": 100, "empty-0.1-py3-none-any.whl": 0}


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
    sizes = {f"f{i}": rng.choice([0, rng.randint(1, limit), rng.randint(limit, 4 * limit)])
             for i in range(rng.randint(1, 25))}
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
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from sglang_child import STUBS
exec(STUBS)
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
        [sys.executable, "-c", SANDBOX, str(standins), str(ROOT / "tests")],
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
