#!/usr/bin/env bash
# CI: what a `pip install` user gets. Builds the wheel in an isolated build (no torch there, so no compiled
# kernels in it), installs it into a clean venv (the local CPU torch 2.13.0, then the wheel and its declared
# dependencies), and checks there:
#   - `sglang-specvocab check-config` accepts every config shipped in the wheel;
#   - the kernels compile on first use (CPU kernels: this torch has no CUDA), equal the torch reference,
#     and a second process loads them from the cache instead of compiling again;
#   - the SGLang plug-in entry point loads and registers DYNVOCAB. SGLang's light environment (2.8 GB) is
#     not installed twice: a .pth file appends the checkout's .venv site-packages *after* the clean venv's,
#     so sglang and its dependencies come from there while this package and its own dependencies are the
#     clean venv's (the test checks which copy of sglang_specvocab answered).
# Exit 1 if a check fails. The work folder is removed at the end; set SPECVOCAB_KEEP=1 to keep it.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python="${PYTHON:-python3}"
dev_venv=$(cd "${SPECVOCAB_VENV:-.venv}" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/specvocab-wheel.XXXXXX")
[ -n "${SPECVOCAB_KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
start=$SECONDS
say() { echo "check_wheel [$((SECONDS - start))s]: $*"; }
quiet_pip() {
  # This workplace's pip config names local index folders that may be absent: hide those warnings.
  "$@" --quiet --disable-pip-version-check 2>&1 | { grep -v "^WARNING: Location '.*' is ignored" || true; }
  return "${PIPESTATUS[0]}"
}

say "building the wheel (isolated build: no torch, so no compiled kernels)"
quiet_pip "$python" -m pip wheel --no-deps --wheel-dir "$work/dist" "$root"
wheel=$(ls "$work"/dist/sglang_specvocab-*.whl)
# The listing goes to a file: `unzip | grep -q` fails under pipefail once grep stops reading (SIGPIPE).
unzip -l "$wheel" >"$work/wheel-files.txt"
grep -q "sglang_specvocab/csrc/binding.cpp" "$work/wheel-files.txt" || { echo "check_wheel: csrc/ is not in $wheel" >&2; exit 1; }
if grep -q "sglang_specvocab/_C" "$work/wheel-files.txt"; then echo "check_wheel: $wheel carries a binary" >&2; exit 1; fi

say "installing $(basename "$wheel") into a clean venv"
cd "$work"  # away from the checkout, whose sglang_specvocab/ would shadow the installed one
"$python" -m venv "$work/venv"
vpy="$work/venv/bin/python"
quiet_pip "$vpy" -m pip install -c "$root/scripts/constraints-cpu.txt" torch==2.13.0
quiet_pip "$vpy" -m pip install -c "$root/scripts/constraints-cpu.txt" "$wheel"

say "check-config on every shipped config"
# The console script on the first one, then the same command in one process for all (a process per config
# costs torch's import each time).
first=$("$vpy" -c "from importlib import resources; print(resources.files('sglang_specvocab.configs') / 'microspec.yaml')")
"$work/venv/bin/sglang-specvocab" check-config "$first" > /dev/null || { echo "check_wheel: check-config $first failed" >&2; exit 1; }
"$vpy" - <<'PY' || exit 1
import contextlib, io, sys
from importlib import resources

from sglang_specvocab.tools.cli import main

configs = sorted(p for p in resources.files("sglang_specvocab.configs").iterdir() if p.name.endswith(".yaml"))
for cfg in configs:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["check-config", str(cfg)])
    if rc != 0:
        sys.exit(f"check_wheel: check-config {cfg} failed (exit {rc})")
if len(configs) < 5:
    sys.exit(f"check_wheel: only {len(configs)} configs found in the wheel")
print(f"check_wheel: check-config passes on the {len(configs)} shipped configs")
PY
say "kernels: compiled on first use, then loaded from the cache"
export SGLANG_SPECVOCAB_CACHE="$work/cache"
probe='
import logging, sys
logging.basicConfig(level=logging.INFO, format="%(message)s")
import torch
from sglang_specvocab.ops import _ext
from sglang_specvocab.ops.indexed_logits import reference_indexed_logits
assert _ext.load(), _ext.reason()
g = torch.Generator().manual_seed(0)
hidden, weight = torch.randn(6, 24, generator=g), torch.randn(50, 24, generator=g)
ids = torch.randint(0, 50, (4, 10), generator=g, dtype=torch.int32)
cnt = torch.tensor([10, 1, 7, 4], dtype=torch.int32)
row_to_slot = torch.tensor([3, 3, 0, 1, 2, 2], dtype=torch.int32)
got = torch.ops.specvocab.indexed_logits(hidden, weight, ids, cnt, row_to_slot)
torch.testing.assert_close(got, reference_indexed_logits(hidden, weight, ids, cnt, row_to_slot))
print("kernels ok, CUDA kernels:", _ext.has_cuda_kernels())
'
"$vpy" -c "$probe" > "$work/first.log" 2>&1 || { cat "$work/first.log" >&2; exit 1; }
grep -q "compiling CPU kernels" "$work/first.log" || { cat "$work/first.log" >&2; echo "check_wheel: the first use did not say it compiles" >&2; exit 1; }
"$vpy" -c "$probe" > "$work/second.log" 2>&1 || { cat "$work/second.log" >&2; exit 1; }
if grep -q "compiling" "$work/second.log"; then cat "$work/second.log" >&2; echo "check_wheel: compiled again" >&2; exit 1; fi
grep -q "loading the kernels compiled on first use" "$work/second.log" || { cat "$work/second.log" >&2; exit 1; }
say "$(tail -1 "$work/second.log")"

say "the SGLang plug-in entry point (sglang from $dev_venv, appended after the clean venv's packages)"
site=$("$vpy" -c "import sysconfig; print(sysconfig.get_path('purelib'))")
dev_site=$("$dev_venv/bin/python" -c "import sysconfig; print(sysconfig.get_path('purelib'))")
echo "$dev_site" > "$site/zz_sglang_from_checkout.pth"
"$vpy" - "$site" <<'PY' || exit 1
import sys
from importlib.metadata import distribution, entry_points

site = sys.argv[1]
from sglang_specvocab.tools.testing.standins import install

install(("torchvision",))  # SGLang imports torchvision, which has no CPU build here
(ep,) = [e for e in entry_points(group="sglang.srt.plugins") if e.name == "dynvocab"]
assert ep.dist.name == "sglang-specvocab" and distribution("sglang-specvocab").version == ep.dist.version
register = ep.load()
import sglang_specvocab
from sglang_specvocab.integration.plugin import register as expected

assert register is expected and sglang_specvocab.__file__.startswith(site), sglang_specvocab.__file__
register()
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

algo = SpeculativeAlgorithm.from_string("DYNVOCAB")
print(f"check_wheel: entry point {ep.value} registered {type(algo).__name__} (sglang_specvocab {ep.dist.version})")
PY
say "done"
