#!/usr/bin/env bash
# The lint and format gate (CI runs it before the tests): ruff check, ruff format --check, and
# clang-format on csrc/, with the versions pinned in scripts/requirements-lint.txt (setup.sh installs them).
#   scripts/lint.sh          check; exit 1 if anything would change
#   scripts/lint.sh --fix    rewrite the files instead (ruff's safe fixes, both formatters)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${SPECVOCAB_VENV:-.venv}/bin"
fix=0
case "${1:-}" in
  "") ;;
  --fix) fix=1 ;;
  *) echo "lint: unknown argument '$1': use no argument (check) or --fix" >&2; exit 2 ;;
esac
for tool in ruff clang-format; do
  want=$(sed -n "s/^$tool==//p" scripts/requirements-lint.txt)
  got=$("$bin/$tool" --version 2>/dev/null | grep -o '[0-9][0-9.]*' | head -1 || true)
  if [ "$got" != "$want" ]; then
    echo "lint: $bin/$tool is '${got:-missing}', the gate needs $want (run scripts/setup.sh)" >&2
    exit 1
  fi
done
mapfile -t csrc < <(git ls-files 'csrc/*.cpp' 'csrc/*.cu' 'csrc/*.h')
status=0
if [ "$fix" = 1 ]; then
  "$bin/ruff" check --fix . || status=1
  "$bin/ruff" format .
  "$bin/clang-format" -i "${csrc[@]}"
else
  "$bin/ruff" check . || status=1
  "$bin/ruff" format --check . || status=1
  "$bin/clang-format" --dry-run --Werror "${csrc[@]}" || status=1
fi
[ "$status" = 0 ] && echo "lint: clean (ruff $("$bin/ruff" --version | cut -d' ' -f2), clang-format on ${#csrc[@]} files)"
exit "$status"
