#!/usr/bin/env bash
# The main job. On this project's CPU machines: the policy lab on Gemma-3 270M (MicroSpec vs
# the full-vocabulary baseline, per Spec-Bench-like category). Extra arguments go to the lab,
# e.g. --questions ../shared/data/spec_bench/question.jsonl --per-category 3.
# (The GPU path - SGLang server plus a short Spec-Bench comparison - arrives with the
# integration and measurement issues; until then GPU machines run the lab too.)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m sglang_specvocab lab --config configs/microspec.yaml "$@"
