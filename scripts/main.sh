#!/usr/bin/env bash
# The main job.
#   CPU-only machine: the policy lab on Gemma-3 270M (MicroSpec vs the full-vocabulary
#     baseline, per Spec-Bench-like category), with the lab's default draft and again with the
#     oracle draft (the target itself: the set's cost alone). Extra arguments go to the lab, e.g.
#     --questions ../shared/data/spec_bench/question.jsonl --per-category 3.
#   NVIDIA GPU: Gemma-3 270M converted for SGLang, an EAGLE-3 draft with a full-vocabulary head
#     trained for it (both cached in $SPECVOCAB_MAIN_DIR, default main-results/), then a short
#     Spec-Bench comparison (2 questions per category, concurrency 1, temperature 0) of SGLang
#     without speculation, with EAGLE3 and with DYNVOCAB (MicroSpec); extra arguments go to
#     `sglang-specvocab bench specbench`. Not yet run on a GPU: see README "SGLang integration".
# SPECVOCAB_MAIN=lab|gpu overrides the detection.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
mode="${SPECVOCAB_MAIN:-}"
if [ -z "$mode" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then mode=gpu; else mode=lab; fi
fi
cli=.venv/bin/sglang-specvocab
case "$mode" in
  lab) exec "$cli" lab --config configs/microspec.yaml "$@" ;;
  gpu) ;;
  *) echo "main: SPECVOCAB_MAIN=$mode is invalid: use lab or gpu" >&2; exit 2 ;;
esac

work="${SPECVOCAB_MAIN_DIR:-main-results}"
target="$work/gemma3-270m"
draft="$work/draft-full"
[ -f "$target/config.json" ] || "$cli" convert-gemma3 --out "$target" --chat-template gemma --force
[ -f "$draft/config.json" ] || "$cli" train-eagle3 --target gemma3-270m --head full --device cuda \
  --conversations 1000 --steps 1000 --data "$work/eagle3-data.pt" --out "$draft"
common="--model-path $target --attention-backend triton --mem-fraction-static 0.5"
exec "$cli" bench specbench --out "$work/specbench" --limit-per-category 2 --concurrency 1 --temperature 0 \
  --config "name=baseline,args=\"$common\"" \
  --config "name=eagle3,args=\"$common --speculative-algorithm EAGLE3 --speculative-draft-model-path $draft\"" \
  --config "name=dynvocab-microspec,args=\"$common --speculative-algorithm DYNVOCAB --speculative-draft-model-path $draft --speculative-dynvocab-config configs/microspec.yaml\"" \
  "$@"
