#!/usr/bin/env bash
# The main job: the committed EAGLE-3 draft of Gemma-3 270M (drafts/), the full head against the best shipped
# config (configs/hybrid.yaml) and MicroSpec (configs/microspec.yaml). Results in $SPECVOCAB_MAIN_DIR
# (default main-results/); extra arguments go to the command it runs.
#   CPU-only machine: the policy lab (the CPU reference decoder) over the lab's own prompts, the first turn of one
#     per category, 20 tokens, with the draft and again with the oracle draft (the target drafting for itself: the
#     draft is weak, and only the oracle shows what a set costs); it ends with a verdict. Under 8 minutes cold on
#     2 cores, setup included (README).
#   NVIDIA GPU: Gemma-3 270M converted for SGLang, then a short Spec-Bench comparison (2 questions per category,
#     concurrency 1, temperature 0) of SGLang without speculation, with EAGLE3 and with DYNVOCAB (both configs).
# SPECVOCAB_MAIN=lab|gpu overrides the detection.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
mode="${SPECVOCAB_MAIN:-}"
if [ -z "$mode" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then mode=gpu; else mode=lab; fi
fi
cli=.venv/bin/sglang-specvocab
work="${SPECVOCAB_MAIN_DIR:-main-results}"
draft=drafts/gemma3-270m-eagle3-full
case "$mode" in
  lab) exec "$cli" lab --draft "eagle3:$draft" --config configs/hybrid.yaml configs/microspec.yaml \
         --per-category 1 --turns 1 --max-new-tokens 20 --out "$work" --name main "$@" ;;
  gpu) ;;
  *) echo "main: SPECVOCAB_MAIN=$mode is invalid: use lab or gpu" >&2; exit 2 ;;
esac

target="$work/gemma3-270m"
[ -f "$target/config.json" ] || "$cli" convert-gemma3 --out "$target" --chat-template gemma --force
common="--model-path $target --attention-backend triton --mem-fraction-static 0.5"
dynvocab="$common --speculative-algorithm DYNVOCAB --speculative-draft-model-path $draft --speculative-dynvocab-config"
exec "$cli" bench specbench --out "$work/specbench" --limit-per-category 2 --concurrency 1 --temperature 0 \
  --config "name=baseline,args=\"$common\"" \
  --config "name=eagle3,args=\"$common --speculative-algorithm EAGLE3 --speculative-draft-model-path $draft\"" \
  --config "name=dynvocab-hybrid,args=\"$dynvocab configs/hybrid.yaml\"" \
  --config "name=dynvocab-microspec,args=\"$dynvocab configs/microspec.yaml\"" \
  "$@"
