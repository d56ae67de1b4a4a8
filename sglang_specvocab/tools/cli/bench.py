"""The benchmarks' subcommands, under ``bench``: kernels, plans, fit, host, specbench, rounds; each parser
beside its runner."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

from ...config import KERNELS
from ..bench.kernels_report import OPS  # torch-free, so --help imports no torch
from ._args import (
    NON_NEGATIVE,
    NON_NEGATIVE_FLOAT,
    POSITIVE,
    RAW,
    at_least,
    choices_csv,
    csv_list,
    distinct_positive_csv,
    int_csv,
    positive_float,
)

KERNELS_DOC = """\
Time the head ops of sglang_specvocab.ops against torch and the dense heads, and write
JSON + Markdown (+ a plot) of the results. Exit status 1 if an output check failed.

Ops (--ops):
  indexed              ops.indexed_logits (gather through the table's ids), per backend
  packed               ops.packed_logits (rows pre-packed per request [R, W, d]), per backend
  index_select_matmul  torch: weight.index_select(ids) per request, then bmm (the baseline)
  dense_static         torch: hidden @ weight[:dense_width].T (EAGLE-3's static 32k head)
  dense_full           torch: hidden @ weight[:V].T for each --full-vocabs V
  window_round         ops.window_verify, one verify round of the window (its entries: draft tokens +
                       top-K ids; telemetry; the window update), per backend

Sweep: W (--widths) x d (--dims) x rows per request (--rows) x batch (--batches);
M = batch * rows hidden rows, each request has its own sorted set of W distinct random ids
from [0, --index-vocab). The weight is allocated once per d (--index-vocab and every full
vocabulary are row prefixes of it) and filled with random values, never zeros.

Timing on a GPU: inputs made, a warm-up (--warmup calls, eager), then a CUDA graph holding
several calls (enough for about 50 us) replayed --iters times, each replay between CUDA
events; a sample is replay time / calls per graph (so launch gaps inside a captured loop are
in, host launch cost is out). Median, p10, p90 of the samples. Where one call's data is
smaller than 3x the L2 cache, the calls in a graph rotate over several input sets (other
ids / hidden rows; other weight slices for the dense head) so the numbers are of HBM, not L2
(--hot turns this off). --device cpu: the same code path timed with time.perf_counter per
call, no graphs (results marked CPU).

Bandwidth: bytes = the rows that must be read once: batch * W * d * bytes(dtype) for the
indexed/packed/index_select ops, W * d * bytes for the dense heads (W = head width). GB/s =
bytes / median time; ideal = bytes / peak, reported against the datasheet peak (--peak-bw,
default by device name) and against a measured device-to-device copy (bytes read + written).
frac_ideal = ideal time / median time (1.0 = at the bandwidth limit).

Draft head step (ops head, stock, gemma4_mtp): per (d, V, draft kind, W, rows, batch) our head and
its top-k in each plan, with the plan auto picks recorded; `stock` is EAGLE3's own step in SGLang
(GEMM, fp32 logits, softmax + top-k or, for rows 1, its Triton split argmax; the d2t map).
Where auto picks stock the server runs EAGLE3's code path, so the reports take auto's time there
from EAGLE3's step.

Targets (the lease issue's; JSON "targets", Markdown "## Targets", each with its worst case):
  1. head step at batch 1, d 4096, W 3072 >= 8x faster than EAGLE3's d2t-32k step (every V, rows, kind)
  2. that head step <= 1.5 x (bandwidth ideal + 2.5 us) (ideal: the head rows it must read / peak)
  3. rows 10 <= 1.3 x rows 1 (head step, same d, V, kind, W, batch)
  4. auto never slower than EAGLE3's step of its own kind, at any batch
  5. window round (entries, telemetry, update) <= 5 us at batch 64
A case whose output check failed meets nothing.

Presets: --tiny (CPU, seconds), --quick (the headline shapes), --lease (one GPU lease's call: first
the head step at d 4096 W 3072 batch 1, then Gemma-3 270M's shape (d 640, V 262144) and d 4096
(V 128256) at W 1024/2048/3072, batch 1/8/12/16/32, both kinds, rows 1 (rows 10 at W 3072 batch 1),
per-request and auto's plan, EAGLE3's step; then the window round at batch 64; then the quick sweep while
--time-budget-s lasts; 129-131 cases before the quick sweep, estimated 28-39 s on an H100),
else the full sweep.

A configuration that does not fit memory, or a backend that is unavailable or raises
NotImplementedError, is recorded as skipped with the reason; other errors are recorded too.
Results are saved every few seconds and at every change of d, each file written whole (a temporary
file, then a rename), each save with the targets on what was measured so far ("partial": true and
the cases not run counted until the sweep ends); --time-budget-s starts no case past a deadline
(the rest are recorded as not run); SIGTERM stops the sweep and saves (exit 143).
Provenance: the git revision from --git, else $SV_GIT, else git itself.
"""


def _add_bench_kernels(sub) -> None:
    p = sub.add_parser(
        "kernels",
        help="time the head ops against torch and the dense heads (GPU; --tiny on a CPU)",
        description=KERNELS_DOC,
        formatter_class=RAW,
    )
    preset = p.add_mutually_exclusive_group()
    preset.add_argument("--quick", action="store_true", help="headline shapes only (W 2048/3072, d 4096): a first look")
    preset.add_argument("--tiny", action="store_true", help="tiny shapes that run in seconds on a CPU (tests)")
    preset.add_argument(
        "--lease",
        action="store_true",
        help="one GPU lease's call: the targets' head steps first (d 4096 W 3072 batch 1, then Gemma-3 270M's shape "
        "and d 4096 at W 1024-3072, batch 1-32), the window round at batch 64, then the quick sweep while "
        "--time-budget-s lasts",
    )
    p.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda if available)")
    p.add_argument(
        "--git",
        default=None,
        metavar="REV",
        help="the checkout's revision for the results (default: $SV_GIT, else git rev-parse HEAD)",
    )
    p.add_argument(
        "--ops",
        type=choices_csv(OPS),
        default=list(OPS),
        help=f"comma list of {', '.join(OPS)} (default: all)",
    )
    p.add_argument(
        "--backends",
        type=choices_csv(KERNELS),
        default=None,
        help="comma list of our backends to time (default: cuda,triton on a GPU; cuda,triton,torch on the CPU)",
    )
    p.add_argument(
        "--dtype", choices=("bf16", "fp16", "fp32"), default="bf16", help="weight/hidden dtype (default: bf16)"
    )
    p.add_argument("--iters", type=POSITIVE, default=200, help="timed samples per case, at most (default: 200)")
    p.add_argument("--warmup", type=NON_NEGATIVE, default=10, help="eager warm-up calls per case (default: 10)")
    p.add_argument(
        "--max-ms",
        type=positive_float,
        default=200.0,
        help="stop sampling a case after about this much timed time, keeping at least 10 samples (default: 200)",
    )
    p.add_argument(
        "--peak-bw", type=positive_float, default=None, help="peak memory bandwidth in B/s (default: by device name)"
    )
    p.add_argument(
        "--out", type=Path, default=None, help="JSON path (default: benchmarks/kernels-<device>.json); .md/.png beside"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hot", action="store_true", help="no input rotation: repeated calls may hit the L2 cache")
    p.add_argument("--no-graph", action="store_true", help="GPU: time eager calls between events, no CUDA graphs")
    p.add_argument(
        "--max-mem-gb", type=NON_NEGATIVE_FLOAT, default=None, help="skip a case whose own tensors would exceed this"
    )
    p.add_argument(
        "--time-budget-s",
        type=NON_NEGATIVE_FLOAT,
        default=None,
        help="start no case after this many seconds; the rest are recorded as skipped (fits a device lease)",
    )
    p.add_argument("--threads", type=POSITIVE, default=None, help="torch CPU threads (default: torch's own)")
    p.add_argument(
        "--fit",
        action="store_true",
        help="fit the head's cost model to this run and write it beside the JSON (OUT.costs.json)",
    )
    p.add_argument(
        "--head-kernel",
        choices=("cuda", "triton", "torch"),
        default=None,
        help="the head ops' kernel backend (default: what head.kernel auto resolves to here)",
    )
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    _add_kernels_shapes(p)
    p.set_defaults(run=_run_bench_kernels)


def _add_kernels_shapes(p) -> None:
    g = p.add_argument_group("shapes (override the preset's)")
    g.add_argument("--widths", type=int_csv, help="W: candidate set sizes")
    g.add_argument("--dims", type=int_csv, help="d: hidden sizes")
    g.add_argument("--rows", type=int_csv, help="hidden rows per request (tree width)")
    g.add_argument("--batches", type=int_csv, help="requests per call")
    g.add_argument("--full-vocabs", type=int_csv, help="V of the full heads")
    g.add_argument("--index-vocab", type=POSITIVE, help="ids are drawn from [0, this) (default 128256)")
    g.add_argument("--dense-width", type=POSITIVE, help="rows of the static dense head (default 32768)")
    g.add_argument("--window-batches", type=int_csv, help="batches of the window round")
    g.add_argument("--capacity", type=POSITIVE, help="window capacity (default 3072)")
    g.add_argument("--draft-tokens", type=POSITIVE, help="draft-tree tokens per verify block (default 4)")
    g.add_argument("--topk-ids", type=POSITIVE, help="verified top-K ids per verify block (default 15 = 3 x 5)")
    g.add_argument("--target-widths", type=int_csv, help="W of the headline table and targets (default 2048,3072)")
    g.add_argument("--target-d", type=POSITIVE, help="d of the headline table, targets and plot (default 4096)")
    g.add_argument("--target-window-batch", type=POSITIVE, help="batch of the window target (default 64)")
    g.add_argument("--copy-mb", type=POSITIVE, help="MiB copied to measure bandwidth (default 2048; tiny 8)")
    g.add_argument("--head-dims", type=int_csv, help="d of the head ops (default 640,4096,5120; quick 4096)")
    g.add_argument("--head-batches", type=int_csv, help="batches of the head ops (default 1,8,32,64,128)")
    g.add_argument("--head-widths", type=int_csv, help="set capacities W of the head ops (default 3072)")
    g.add_argument("--target-head-width", type=POSITIVE, help="W of the head-step targets (default 3072; tiny 48)")
    g.add_argument("--target-rows", type=POSITIVE, help="rows per request the rows target compares with rows 1 (10)")
    g.add_argument(
        "--head-kinds", type=choices_csv(("d2t", "full")), help="draft kinds of the head ops (default d2t,full)"
    )


def _add_bench_plans(sub) -> None:
    p = sub.add_parser(
        "plans",
        help="time the CUDA logits kernel under every launch plan (tunes the launcher's rule; --tiny on a CPU)",
        description="Time indexed_logits under the launcher's own plan, every forced plan and Triton; check that "
        "every plan gives bitwise the same logits (exit 1 if not).",
    )
    preset = p.add_mutually_exclusive_group()
    preset.add_argument("--quick", action="store_true", help="W 3072, bs 1/8/64, rows 1/10")
    preset.add_argument("--tiny", action="store_true", help="tiny shapes on the C++ CPU kernels (tests)")
    p.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda if available)")
    p.add_argument("--iters", type=POSITIVE, default=100, help="timed samples per case, at most (default: 100)")
    p.add_argument("--warmup", type=NON_NEGATIVE, default=5)
    p.add_argument("--max-ms", type=positive_float, default=300.0, help="time per case and plan (default: 300)")
    p.add_argument("--no-triton", action="store_true", help="leave out the Triton backend")
    p.add_argument("--out", type=Path, default=None, help="JSON path (the Markdown goes beside it)")
    p.set_defaults(run=_run_bench_plans)


def _add_bench_fit(sub) -> None:
    p = sub.add_parser(
        "fit",
        help="fit the head's cost model (head.batch: auto) to a bench kernels result",
        description="Fit the constants of the head's cost model (sglang_specvocab/headcost.py) to a bench kernels "
        "result (its JSON, or the Markdown's headline table) and write them as JSON; ship a device's file as "
        "configs/data/head-costs-<device>.json for auto to use it there.",
    )
    p.add_argument("result", type=Path, help="bench kernels JSON (or Markdown)")
    p.add_argument("--out", type=Path, default=None, help="where to write the constants (default: print only)")
    p.add_argument(
        "--match",
        type=lambda s: [x for x in s.split(",") if x],
        default=None,
        help="comma list of device-name substrings the constants serve (default: the model in the device name)",
    )
    p.add_argument(
        "--note", default=None, help="a sentence for the provenance (e.g. how the source relates to the code)"
    )
    p.set_defaults(run=_run_bench_fit)


def _run_bench_fit(args) -> int:
    from ..bench.fit import run  # numpy only, but keeps the CLI's import light

    return run(args)


def _run_bench_plans(args) -> int:
    from ..bench.plans import run  # heavy: torch

    return run(args)


def _run_bench_kernels(args) -> int:
    from ..bench.kernels import KernelBench, run  # heavy: torch, triton

    return run(KernelBench.from_args(args))


HOST = """\
Time the host work DYNVOCAB adds to SGLang's decode round and prefill, against EAGLE3, on a CPU:
the real worker methods of both algorithms (the draft loop, SGLang's verify plus DYNVOCAB's
event hook, the decode draft extend; the prefill with its policy event) over a toy draft model
and recorded target outputs (sglang_specvocab/tools/bench/harness.py), one torch thread, tiny
shapes (host work, not arithmetic). Writes JSON + Markdown with the device, versions and command.

Noise: the two stacks run interleaved --reps times; each rep's median over --rounds calls; the
reported time is the minimum of the rep medians, with their spread. Ops per call (aten ops
dispatched, views excluded) are counted exactly. Also the prefill top-K alone (the target's LM
head over prompt positions, --topk-chunks rows at a time): ms per 1k tokens per chunk size.

Gate (--check exits 1 when a case misses it): what a GPU host with CUDA graphs pays per decode round
beyond EAGLE3, counted exactly: at most --max-added-launches kernel launches (aten ops outside the
replayed graphs: the verify hook, the extend's top-k after its replay) and no host sync. Information:
the time outside the ops (wall less the time inside them) and wall time, against --target-us.
"""


def _add_bench_host(sub) -> None:
    p = sub.add_parser(
        "host",
        help="host time per decode round and prefill, DYNVOCAB against EAGLE3 (CPU)",
        description=HOST,
        formatter_class=RAW,
    )
    p.add_argument("--quick", action="store_true", help="bs 1,8; 5 reps of 20 rounds; small top-K (CI)")
    p.add_argument("--batches", type=int_csv, default=None, help="batch sizes (default 1,8,32)")
    p.add_argument("--topks", type=int_csv, default=None, help="draft top-k values (default 1,4)")
    p.add_argument("--steps", type=POSITIVE, default=3, help="draft steps (default: %(default)s)")
    p.add_argument(
        "--draft-tokens", type=POSITIVE, default=8, help="draft tokens of a tree, topk > 1 (default: %(default)s)"
    )
    p.add_argument(
        "--prompt-len", type=POSITIVE, default=64, help="tokens per prompt of a prefill (default: %(default)s)"
    )
    p.add_argument("--reps", type=POSITIVE, default=None, help="interleaved repetitions (default 9)")
    p.add_argument("--rounds", type=POSITIVE, default=None, help="calls per rep (default 40)")
    p.add_argument("--prefill-reps", type=POSITIVE, default=None, help="repetitions of the prefills (default 5)")
    p.add_argument(
        "--topk-chunks", type=int_csv, default=None, help="prefill top-K chunk sizes (default 256,1024,4096)"
    )
    p.add_argument(
        "--topk-tokens", type=POSITIVE, default=None, help="prompt tokens of the top-K timing (default 2048)"
    )
    p.add_argument("--topk-d", type=POSITIVE, default=512, help="the target's hidden size there (default: %(default)s)")
    p.add_argument("--topk-vocab", type=POSITIVE, default=16384, help="its vocabulary (default: %(default)s)")
    p.add_argument("--target-us", type=NON_NEGATIVE_FLOAT, default=50.0, help="us added per round (default: 50)")
    p.add_argument(
        "--max-added-launches",
        type=NON_NEGATIVE,
        default=2,
        help="kernel launches DYNVOCAB may add per decode round, eager phases (default: %(default)s)",
    )
    p.add_argument("--check", action="store_true", help="exit status 1 when a case misses the launches/syncs gate")
    p.add_argument("--port", type=POSITIVE, default=29631, help="local port of the one-process gloo group")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default: benchmarks/host-cpu.json); .md beside")
    p.set_defaults(run=_run_bench_host)


def _run_bench_host(args) -> int:
    from ..bench.host import run  # heavy: SGLang's worker modules

    return run(args)


SPECBENCH = """\
Run Spec-Bench (480 questions: MT-Bench's two-turn conversations, translation, summarization,
QA, GSM8K math, RAG) against one SGLang server per configuration, one configuration after the
other. A configuration either launches a server (python -m sglang.launch_server ARGS, waiting for
/health; --host/--port are added unless ARGS has them; its log goes to OUT/logs/NAME.log) or
reaches a running one by URL. The first configuration is the baseline of the speedups.

--config (repeatable; keys name, algorithm, args, url, env, launcher; quote values with commas):
  --config 'name=ar,args="--model-path M --attention-backend triton"'
  --config 'name=eagle3,args="--model-path M --speculative-algorithm EAGLE3 --speculative-draft-model-path D"'
  --config name=dynvocab,algorithm=DYNVOCAB,url=http://127.0.0.1:30000
--configs FILE.yaml: a list (or 'configs:' list) of mappings with the same keys, e.g.
  - name: ar
    args: --model-path M --attention-backend triton
  - name: dynvocab
    algorithm: DYNVOCAB          # a label: none|EAGLE|EAGLE3|DYNVOCAB|NGRAM|STANDALONE
    args: [--model-path, M, --speculative-algorithm, EAGLE3, --speculative-draft-model-path, D]
    env: {SGLANG_DYNVOCAB: "1"}
Configurations of --configs come first, then those of --config. 'algorithm' defaults to the
--speculative-algorithm in args (else none); a url configuration must state it.

Prompts: the conversation is rendered with the served model's chat template (tokenizer from
--tokenizer or the server's /model_info), tokenized client-side (the template carries BOS) and
sent as input_ids to /generate, whose meta_info has completion_tokens, spec_verify_ct,
e2e_latency and the DYNVOCAB telemetry (dynvocab_set_size, dynvocab_coverage). MT-Bench's second
turn includes the configuration's own first answer. --prompt-format plain sends a
"Question: ...\\nAnswer:" transcript instead (for base models without a template).

Measured as Spec-Bench does: per question, tokens/s = completion tokens / time (turns summed; time
is the server's e2e_latency); a configuration's tokens/s is the mean over questions; speedup is the
ratio of mean per-question tokens/s to the first configuration's (over the questions both
finished); accept length = completion tokens / verify steps. MT-Bench's eight categories are
reported together as mt_bench.

Resumable: every finished turn is appended to the cache (default OUT/specbench-cache.jsonl), keyed
by configuration, settings, question and turn; a rerun skips cached turns and starts no server for
a configuration that is complete. Writes OUT/NAME.json, OUT/NAME.md and OUT/NAME.png.

Results as they happen: the reports are rewritten from the cache after each concurrency and each server
(and on SIGTERM or Ctrl-C, then exit status 130), each file replaced atomically, so a run cut off,
even by SIGKILL, leaves valid reports of what finished. A report with something missing says
"partial": true and lists each missing (config, concurrency) with why: not reached, interrupted,
time budget, server failed: ... (its Markdown's first line: PARTIAL and what is missing); a complete
one says "partial": false. A configuration whose server does not start, dies or answers wrongly is
recorded so and the next still runs; exit status 2 at the end (1 if greedy parity also failed).

Targets (the reports' targets, ## Targets): each DYNVOCAB configuration's output tokens/s over its EAGLE3
control's (Spec-Bench's mean per-question speed, over the questions both finished; at least 1.15x at
concurrency 1, 1.0x at 8; the worst category named) and greedy parity against the control (every output
equal; the worst case is the turn whose outputs part earliest: its first differing token, index, ids and
text; the logit gap there is not measured). met: true, false, or null when not measured. The reports
also record the device and versions (the checkout: git describe, or $SV_GIT where there is no .git).

--time-budget-s S (seconds from the command's start): concurrency 1 (the first given) on every server
comes first. A server is started only if the time left covers its start, its first concurrency and its
stop; a later concurrency of a running server is asked only if the time left after it and this server's
stop still covers the start, first concurrency and stop of every server still to run; no new turn is
asked once the time left is below a stop. Estimates: the slowest start, time per turn (a concurrency's
wall time / its turns; at a concurrency not yet timed, the slowest at any) and stop measured so far;
before any, a start 120 s (10 s by url), a turn 2 s + max-new-tokens / 25 tokens/s, a stop 20 s. Each
decision is printed on one line ([budget] ...) and kept in the reports; what it leaves out is missing
for "time budget" (exit status 0). Without it, every server and concurrency is asked.

Greedy parity (temperature 0): each configuration's answers are compared as text, turn by turn, with
the first configuration's and, for a DYNVOCAB configuration, with its EAGLE3 control's (same target,
draft and tree arguments, or control=NAME); a turn after a differing turn is not comparable. Exit
status 1 when a DYNVOCAB turn differs from both its control and the target (without a control: from
the target); OUT/NAME.json lists every differing turn. At temperature > 0 nothing is compared.

Several concurrencies (--concurrency 1,8): each configuration's server is started once and asked at
every concurrency in turn, in the order given, before the next configuration's starts. Each
concurrency has its own result, OUT/NAME-cN.json/.md/.png (speed table and greedy parity), the same
as a run at that concurrency alone would write; a turn cached at one concurrency is never used for
another. Exit status 1 when greedy parity fails at any of them.

Questions: --questions, else the Spec-Bench file beside a source checkout (../shared/data/spec_bench/question.jsonl).
"""


def launcher_default() -> str:
    return f"{shlex.quote(sys.executable)} -m sglang.launch_server"


def add_server_args(p, *, warmup: int, request_timeout: float) -> None:
    """How the benchmarks launch and reach servers (bench specbench, check-lossless)."""
    p.add_argument(
        "--warmup",
        type=NON_NEGATIVE,
        default=warmup,
        metavar="N",
        help=f"unrecorded requests per server before timing (default: {warmup})",
    )
    p.add_argument(
        "--server-timeout",
        type=positive_float,
        default=900.0,
        metavar="S",
        help="seconds a server may take to become healthy (default: 900)",
    )
    p.add_argument(
        "--request-timeout",
        type=positive_float,
        default=request_timeout,
        metavar="S",
        help=f"seconds one request may take (default: {request_timeout:g})",
    )
    p.add_argument(
        "--launcher",
        default=launcher_default(),
        metavar="CMD",
        help="command that starts a server, before its args (default: this Python -m sglang.launch_server)",
    )
    p.add_argument("--host", default="127.0.0.1", help="host for launched servers (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _add_bench_specbench(sub) -> None:
    p = sub.add_parser(
        "specbench",
        help="Spec-Bench on SGLang servers: speed, accepted length, speedup per category",
        description=SPECBENCH,
        formatter_class=RAW,
    )
    p.add_argument("--config", action="append", default=[], metavar="SPEC", help="a configuration (repeatable)")
    p.add_argument("--configs", type=Path, metavar="YAML", help="a file of configurations")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="results, cache and server logs go here")
    p.add_argument("--questions", type=Path, default=None, metavar="JSONL", help="Spec-Bench question file")
    p.add_argument(
        "--limit-per-category",
        type=POSITIVE,
        metavar="N",
        help="first N questions of each category (mt_bench: its eight subcategories in turn)",
    )
    p.add_argument(
        "--categories", type=csv_list, metavar="CAT,CAT", help="only these categories (e.g. mt_bench,translation)"
    )
    p.add_argument(
        "--concurrency",
        type=distinct_positive_csv,
        default=[1],
        metavar="N[,N]",
        help="questions in flight at once (default: 1); several, e.g. 1,8: each server starts once and is asked "
        "at each in turn, one result per concurrency (OUT/NAME-cN.*)",
    )
    p.add_argument(
        "--temperature",
        type=at_least(0.0, float),
        default=0.0,
        metavar="T",
        help="sampling temperature (default: 0, greedy)",
    )
    p.add_argument(
        "--max-new-tokens", type=POSITIVE, default=1024, metavar="N", help="per turn (default: 1024, as Spec-Bench)"
    )
    p.add_argument(
        "--prompt-format",
        choices=("auto", "chat", "plain"),
        default="auto",
        help="chat: the tokenizer's chat template; plain: a Question:/Answer: transcript; "
        "auto: chat when the tokenizer has a template (default)",
    )
    p.add_argument("--tokenizer", metavar="PATH", help="tokenizer for prompts (default: the server's tokenizer_path)")
    p.add_argument(
        "--cache", type=Path, metavar="JSONL", help="per-turn result cache (default: OUT/specbench-cache.jsonl)"
    )
    p.add_argument("--name", default="specbench", help="file name stem of the results (default: %(default)s)")
    p.add_argument(
        "--time-budget-s",
        type=NON_NEGATIVE_FLOAT,
        default=None,
        metavar="S",
        help="seconds from the command's start: concurrency 1 on every server first, a server started and a later "
        "concurrency asked only where the time left allows (see the description); default: no budget",
    )
    add_server_args(p, warmup=2, request_timeout=1800.0)
    p.set_defaults(run=_run_bench_specbench, on_interrupt="finished turns are cached, rerun the same command to resume")


def _run_bench_specbench(args) -> int:
    args.started = time.monotonic()  # --time-budget-s counts from here
    from ..bench.specbench import run  # heavy: transformers (the prompt tokenizer)

    return run(args)


ROUNDS = """\
Decode round time at real model sizes, EAGLE3 against DYNVOCAB (a GPU command).

Makes random-weight checkpoints with real shapes once (--shape llama3-8b: a Llama-3-8B-shaped
target, V 128256, d 4096, cut to --layers layers, 3.85 GB with 4, and its EAGLE-3 drafts with a 32k
d2t head and over the full vocabulary, 0.86 and 0.59 GB), then launches EAGLE3 and DYNVOCAB with each
draft (same arguments, CUDA graphs on up to the largest batch size) and times, per batch size bs,
bs random prompts sent at once (greedy, ignore_eos) with the short and the long --lengths:

    ms per round = (T_long - T_short) / (R_long - R_short),   R = the batch's verify rounds

(the prefill and the client's time cancel). --load-format dummy writes no weights (only the configs
and the 3 MB tokenizer) and starts the servers with SGLang's --load-format dummy: the full-vocabulary
draft only (a dummy load leaves a d2t draft without its d2t map). Random weights of either kind make
about 1 token per round (drafts are rarely accepted), so the result is the cost of a round, not a
speed-up: a trained draft decodes its accept length per round time. Median of --repeats.
Writes OUT/NAME.json, .md, .png with the ratio DYNVOCAB / EAGLE3 per bs and draft kind, the device,
versions and command. Every timed run is cached (OUT/NAME-cache.jsonl): rerun the same command to resume. --only splits the
servers over several calls (e.g. eagle3-d2t,dynvocab-d2t then eagle3-full,dynvocab-full). Exit
status 0: every ratio measured; 1: some could not be.
"""


def _add_bench_rounds(sub) -> None:
    p = sub.add_parser(
        "rounds",
        help="decode round time of EAGLE3 and DYNVOCAB servers at real model sizes (GPU)",
        description=ROUNDS,
        formatter_class=RAW,
    )
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="results, cache and server logs go here")
    p.add_argument("--checkpoints", type=Path, metavar="DIR", help="where the checkpoints are made (OUT/checkpoints)")
    p.add_argument("--shape", choices=("llama3-8b", "tiny"), default="llama3-8b", help="widths (tiny: tests)")
    p.add_argument(
        "--load-format",
        choices=("random", "dummy"),
        default="random",
        help="random: write random-weight checkpoints and load them (default); dummy: write only the configs and "
        "tokenizer, start the servers with SGLang's --load-format dummy (full-vocabulary draft only)",
    )
    p.add_argument("--layers", type=at_least(4), default=4, metavar="N", help="target layers, >= 4 (default: 4)")
    p.add_argument("--batch-sizes", type=int_csv, default=[1, 8, 32, 64], metavar="N,N", help="(default: 1,8,32,64)")
    p.add_argument(
        "--lengths", type=int_csv, default=[32, 160], metavar="SHORT,LONG", help="new tokens (default: 32,160)"
    )
    p.add_argument("--prompt-len", type=POSITIVE, default=128, metavar="N", help="prompt tokens (default: 128)")
    p.add_argument("--repeats", type=POSITIVE, default=3, metavar="N", help="timed pairs per case (default: 3)")
    p.add_argument(
        "--only", type=csv_list, metavar="NAME,NAME", help="eagle3-d2t, dynvocab-d2t, eagle3-full, dynvocab-full"
    )
    p.add_argument("--topk", type=POSITIVE, default=1, help="--speculative-eagle-topk (default: 1)")
    p.add_argument("--steps", type=POSITIVE, default=3, help="--speculative-num-steps (default: 3)")
    p.add_argument("--draft-tokens", type=POSITIVE, default=4, help="--speculative-num-draft-tokens (default: 4)")
    p.add_argument("--dynvocab-config", metavar="YAML", help="--speculative-dynvocab-config (default: microspec)")
    p.add_argument("--server-args", default="", metavar="ARGS", help="extra server arguments for all")
    p.add_argument("--cache", type=Path, metavar="JSONL", help="result cache (default: OUT/NAME-cache.jsonl)")
    p.add_argument("--name", default="rounds", help="file name stem of the results (default: %(default)s)")
    add_server_args(p, warmup=1, request_timeout=600.0)
    p.set_defaults(run=_run_bench_rounds, on_interrupt="timed runs are cached, rerun the same command to resume")


def _run_bench_rounds(args) -> int:
    from ..bench.rounds import run  # heavy: the checkpoints need torch and transformers

    return run(args)


def add(sub) -> None:
    bench = sub.add_parser(
        "bench",
        help=(
            "benchmarks: kernels (the head ops and batch modes), plans (the logits kernel's launch plans), fit (the "
            "head's cost model), host (the loop's host cost), specbench (Spec-Bench on servers), rounds (decode "
            "round time on servers)"
        ),
        description="Benchmarks; each writes JSON + Markdown with the device, versions and command.",
    )
    bench_sub = bench.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for add_one in (
        _add_bench_kernels,
        _add_bench_plans,
        _add_bench_host,
        _add_bench_fit,
        _add_bench_specbench,
        _add_bench_rounds,
    ):
        add_one(bench_sub)
