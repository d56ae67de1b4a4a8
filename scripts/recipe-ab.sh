#!/usr/bin/env bash
# The EAGLE-3 training recipe's pieces, each switched on alone and then all together, at equal tokens on a CPU: one
# draft per arm trained by train-eagle3 with the same data, target states (cached once, shared), validation
# prompts, seed and steps, then report-eagle3 compares each arm's validation accept length with the baseline's.
#   ./scripts/recipe-ab.sh [OUT]   (default OUT: benchmarks/recipe-ab; the drafts go to $RECIPE_AB_WORK)
# The arms (train-eagle3's options, docs/measurement.md "The training recipe"):
#   base         the recipe lease T ran: every draft step's KL alike, cosine to lr/10, no norm before fc
#   step-weight  --step-weight 0.8: step k's KL weighs 0.8^k
#   lr-floor     --lr-floor 0: the cosine ends at zero
#   fc-norm      --fc-norm: an RMSNorm per captured layer before fc (SGLang's fc_norm: true)
#   recipe       all three
# The target's regenerated answers (--source generated), the published recipes' first piece, are not an arm here:
# answering the conversations on this CPU costs more than the hour the A/B has. RECIPE_AB_STEPS (default 300)
# sets the steps of every arm.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${SPECVOCAB_VENV:-.venv}/bin/python"
OUT="${1:-benchmarks/recipe-ab}"
WORK="${RECIPE_AB_WORK:-${SGLANG_SPECVOCAB_CACHE:-$HOME/.cache/sglang_specvocab}/recipe-ab}"
STEPS="${RECIPE_AB_STEPS:-300}"
COMMON=(
    --target smollm2-135m --head d2t --draft-vocab 4096 --freq data
    --source sharegpt --conversations 400 --skip 1000 --seq-len 384
    --val 32 --val-new-tokens 64 --val-every 100
    --steps "$STEPS" --batch-size 4 --lr 2e-3 --warmup 15 --init random --ttt-steps 4 --seed 0
    --device cpu --log-every 50
)
NAMES=(base step-weight lr-floor fc-norm recipe)
FLAGS=("" "--step-weight 0.8" "--lr-floor 0" "--fc-norm" "--step-weight 0.8 --lr-floor 0 --fc-norm")
drafts=()
for i in "${!NAMES[@]}"; do
    name="${NAMES[$i]}"
    echo "== arm $((i + 1))/${#NAMES[@]}: $name ${FLAGS[$i]}"
    # shellcheck disable=SC2086  # the arm's flags are words
    "$PY" -m sglang_specvocab train-eagle3 "${COMMON[@]}" ${FLAGS[$i]} --out "$WORK/$name"
    drafts+=("$WORK/$name")
done
"$PY" -m sglang_specvocab report-eagle3 "${drafts[@]}" --out "$OUT"
