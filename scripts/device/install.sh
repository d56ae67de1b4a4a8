#!/usr/bin/env bash
# Runs ON the GPU machine, from the working copy WORK/src that run.sh keeps under /tmp (never from
# the checkout: its ignored files, a built extension included, are gone at the next call).
#   bash scripts/device/install.sh STAGE WORK      (run.sh install: STAGE=/tmp/sv/stage, WORK=/tmp/sv)
# 1. joins and verifies the staged wheels into WORK/wheels and installs them into the device's
#    Python with --no-deps, so its torch/triton/CUDA packages stay as they are;
# 2. completes the staged FlashInfer headers (SGLang JIT-compiles speculative sampling against them)
#    and installs the stand-ins for two SGLang modules whose native packages are not staged
#    (standins/specvocab_device_standins.py plus a .pth that imports it in every process);
# 3. installs this package editable from WORK/src and builds its kernels against the device's torch;
# 4. writes WORK/env.sh (SGLang's switches: stage.py env) and checks that everything imports.
# Idempotent: installed wheel versions, and kernels whose csrc/, setup.py and torch are unchanged,
# are not redone. Everything it writes lives under WORK or in site-packages, both kept while the
# machine is held.
set -euo pipefail
cd "$(dirname "$0")/../.."
stage="${1:?usage: install.sh STAGE WORK}"
work="${2:?usage: install.sh STAGE WORK}"
py="${PYTHON:-python3}"
t0=$(date +%s)
say() { echo "install: $* [$(($(date +%s) - t0)) s]"; }

"$py" scripts/device/stage.py assemble --stage "$stage" --dest "$work/wheels"
say "wheels verified"
if "$py" scripts/device/stage.py installed --stage "$stage" >/dev/null; then
  say "staged wheels already installed"
else
  # --no-deps: sglang 0.5.23 pins torch 2.14 and sglang-kernel 0.4.10; the device keeps torch 2.11
  # and gets the trimmed sglang-kernel 0.4.5 (device-staging.md). pip's dependency warnings are expected.
  "$py" -m pip install --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir \
    --find-links "$work/wheels" "$work"/wheels/*.whl
  "$py" scripts/device/stage.py installed --stage "$stage"
  say "staged wheels installed"
fi

site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
"$py" scripts/device/stage.py flashinfer-headers --site "$site" # for SGLang's JIT sampling kernel
cp scripts/device/standins/specvocab_device_standins.py "$site/"
echo "import specvocab_device_standins" >"$site/specvocab_device_standins.pth"
say "stand-ins in $site"

want="$(cat setup.py csrc/* | sha256sum | cut -c1-16)-$("$py" -c 'import torch; print(torch.__version__)')"
if [ -f "$work/kernels.stamp" ] && [ "$(cat "$work/kernels.stamp")" = "$want" ] &&
  "$py" -c "from sglang_specvocab.ops import _ext; assert _ext.available()" 2>/dev/null; then
  say "kernels up to date"
else
  # No build isolation: the extension must build against the device's torch.
  "$py" -m pip install --disable-pip-version-check --no-index --no-deps --no-build-isolation -e .
  echo "$want" >"$work/kernels.stamp"
  say "package installed from $PWD, kernels built"
fi

"$py" scripts/device/stage.py env >"$work/env.sh"
# shellcheck disable=SC1091
. "$work/env.sh"
"$py" - <<'PY'
import importlib.metadata as md

import sgl_kernel, sglang, torch, transformers, triton  # noqa: F401
from sglang.kernels.ops.gemm.cutedsl_dual_gemm import can_use_dual_gemm
from sglang.srt.layers.attention.flashmla_backend import FlashMLABackend  # noqa: F401
from sglang_specvocab.ops import _ext

k = ("CPU + CUDA" if _ext.has_cuda_kernels() else "CPU only") if _ext.available() else "none: " + _ext.reason()
plugins = sorted(e.name for e in md.entry_points(group="sglang.srt.plugins"))
print("install: torch", torch.__version__, "| cuda", torch.cuda.is_available(), "| triton", triton.__version__,
      "| transformers", transformers.__version__, "| sglang", sglang.__version__)
print("install: sgl_kernel rmsnorm op:", torch.ops.sgl_kernel.rmsnorm, "| specvocab kernels:", k,
      "| sglang plug-ins:", plugins, "| dual GEMM:", can_use_dual_gemm())
assert "dynvocab" in plugins, "the DYNVOCAB plug-in's entry point is not installed"
PY
say "done; '. $work/env.sh' before sglang"
