#!/usr/bin/env bash
# Runs ON the GPU machine, in the repository root, after every chunk of the stage has been
# carried there (see scripts/device/README.md). Joins and verifies the staged wheels, installs
# them into the device's Python without touching its torch/triton/CUDA packages, builds this
# package's kernels against the device's torch 2.11, and prints versions.
#   bash scripts/device/install.sh [STAGE]      (STAGE defaults to .stage)
# Idempotent: verified wheels are not joined again, installed versions are not installed again,
# the kernels are not rebuilt while csrc/, setup.py and torch are unchanged. State lives in the
# git-ignored STAGE folder, which stays on the machine between calls while it is held.
# Writes STAGE/env.sh: source it in later commands (SGLang's environment switches).
set -euo pipefail
cd "$(dirname "$0")/../.."
stage="${1:-.stage}"
py="${PYTHON:-python3}"
t0=$(date +%s)
say() { echo "install: $* [$(( $(date +%s) - t0 )) s]"; }

"$py" scripts/device/stage.py assemble --stage "$stage" --dest "$stage/wheels"
say "wheels verified"

if "$py" scripts/device/stage.py installed --stage "$stage" >/dev/null; then
  say "staged wheels already installed"
else
  # --no-deps: sglang 0.5.23 pins torch 2.14 and sglang-kernel 0.4.10; the device keeps torch 2.11
  # and gets the trimmed sglang-kernel 0.4.5 (device-staging.md). pip's dependency warnings are expected.
  "$py" -m pip install --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir \
    --find-links "$stage/wheels" "$stage"/wheels/*.whl
  "$py" scripts/device/stage.py installed --stage "$stage"
  say "staged wheels installed"
fi

want="$(cat setup.py csrc/* | sha256sum | cut -c1-16)-$("$py" -c 'import torch; print(torch.__version__)')"
if [ -f "$stage/kernels.stamp" ] && [ "$(cat "$stage/kernels.stamp")" = "$want" ] \
   && "$py" -c "from sglang_specvocab.ops import _ext; assert _ext.available()" 2>/dev/null; then
  say "kernels up to date"
else
  # No build isolation: the extension must build against the device's torch.
  "$py" -m pip install --disable-pip-version-check --no-index --no-deps --no-build-isolation -e .
  echo "$want" > "$stage/kernels.stamp"
  say "kernels built"
fi

cat > "$stage/env.sh" <<ENV
export SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1
export SGLANG_IS_FLASHINFER_AVAILABLE=false
ENV
# shellcheck disable=SC1091
. "$stage/env.sh"
"$py" -c "
import torch, triton, transformers, sglang, sgl_kernel, sglang_specvocab
from sglang_specvocab.ops import _ext
k = ('CPU + CUDA' if _ext.has_cuda_kernels() else 'CPU only') if _ext.available() else 'none: ' + _ext.reason()
print('install: torch', torch.__version__, '| cuda', torch.cuda.is_available(), '| triton', triton.__version__,
      '| transformers', transformers.__version__, '| sglang', sglang.__version__)
print('install: sgl_kernel rmsnorm op:', torch.ops.sgl_kernel.rmsnorm, '| specvocab kernels:', k)"
say "done; run '. $stage/env.sh' before sglang"
