#!/usr/bin/env bash
# Build the Python environment this machine can run, in .venv (idempotent: a second run
# with unchanged inputs does nothing).
#   CPU-only machine: the light SGLang environment (CPU torch 2.13.0, triton, the pinned sglang
#                     without its dependencies plus the list that makes its modules import),
#                     and this package with the lab and test extras.
#   NVIDIA GPU:       the full pinned sglang and this package with the same extras.
# The pinned sglang is SGLANG_VERSION in sglang_specvocab/copies/upstream.py.
# Override the detection with SPECVOCAB_SETUP_MODE=cpu|gpu; the venv path with SPECVOCAB_VENV.
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${SPECVOCAB_VENV:-.venv}"
python="${PYTHON:-python3}"
mode="${SPECVOCAB_SETUP_MODE:-}"
if [ -z "$mode" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then mode=gpu; else mode=cpu; fi
fi
case "$mode" in cpu|gpu) ;; *) echo "setup: SPECVOCAB_SETUP_MODE=$mode is invalid: use cpu or gpu" >&2; exit 2 ;; esac

"$python" - <<'PY' || { echo "setup: Python >= 3.11 is required (found $("$python" --version 2>&1))" >&2; exit 2; }
import sys; sys.exit(sys.version_info < (3, 11))
PY
# Read with ast: the package is not installed yet.
sglang_version="$("$python" - <<'PY'
import ast
tree = ast.parse(open("sglang_specvocab/copies/upstream.py").read())
print(next(ast.literal_eval(n.value) for n in tree.body
           if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "SGLANG_VERSION"))
PY
)"

inputs=(scripts/setup.sh scripts/constraints-cpu.txt scripts/requirements-sglang-light.txt scripts/requirements-lint.txt
        pyproject.toml setup.py sglang_specvocab/copies/upstream.py csrc/*)
want="$mode-$(cat "${inputs[@]}" | sha256sum | cut -c1-16)"
stamp="$venv/.specvocab-setup"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$venv/bin/python" -c "import sglang_specvocab" 2>/dev/null; then
  echo "setup: $venv is up to date ($mode)"
  exit 0
fi

echo "setup: building $venv for a $mode machine"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip_install() {
  # This workplace's pip config names local index folders that may be absent: hide those warnings.
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@" 2>&1 \
    | { grep -v "^WARNING: Location '.*' is ignored" || true; }
}
pip_install --upgrade pip
pip_install -r scripts/requirements-lint.txt  # scripts/lint.sh's pinned tools
if [ "$mode" = cpu ]; then
  c=(-c scripts/constraints-cpu.txt)
  pip_install "${c[@]}" torch==2.13.0              # CPU build; a looser pin pulls CUDA wheels
  pip_install "${c[@]}" -r scripts/requirements-sglang-light.txt
  pip_install --no-deps "sglang==$sglang_version"
  pip_install "${c[@]}" "setuptools>=77" wheel
  # No build isolation: the kernels extension (csrc/) must build against this venv's torch.
  pip_install "${c[@]}" --no-build-isolation -e ".[lab,test]"
else
  pip_install "sglang==$sglang_version"
  pip_install "setuptools>=77" wheel ninja
  pip_install --no-build-isolation -e ".[lab,test]"
fi
"$venv/bin/python" -c "
import sglang, sglang_specvocab, torch
from sglang_specvocab.ops import _ext
print('setup: sglang', sglang.__version__, '| torch', torch.__version__, '| kernels:', _ext.describe())"
echo "$want" > "$stamp"
