#!/usr/bin/env bash
# Set up (if needed) and run every test, the slow ones (Gemma-3 270M) included.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
exec .venv/bin/python -m pytest -q "$@"
