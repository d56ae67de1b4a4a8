"""The EAGLE-3 draft trainer's subcommands: train-eagle3, report-eagle3; each parser beside its runner."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..models import GEMMA3_270M
from ._args import (
    NON_NEGATIVE,
    POSITIVE,
    RAW,
    positive_float,
    share,
)

TRAIN_EAGLE3 = """\
Train an EAGLE-3 draft for a target model, saved as SGLang's LlamaForCausalLMEagle3 loads it.

Data: ShareGPT conversations after the first --skip (never the Spec-Bench evaluation prompts),
either as text (--source sharegpt: whole conversations as Question/Answer turns, teacher-forced)
or as the target's own greedy answers to their first user turns (--source generated). The token
ids are cached (--data), and so are the target's states on them (--states: the features SGLang
captures, its final hidden states and top-8 ids, in resumable chunks): the target runs once per
data set, not per step, and a larger data set of the same source reuses the chunks it shares.

Objective: EAGLE-3's training-time test. The draft is unrolled --ttt-steps times over each
sequence, feeding its own hidden state back as SGLang's draft loop does, with the attention
each draft step has in SGLang (the draft-extend keys of the prefix plus the chain's earlier
steps); every step is scored by KL(target || draft) against the target's next-token
distribution, over the draft's vocabulary (--head d2t) or over --loss-vocab frequent tokens plus
the target's top-8 (--head full). Validation: the exact greedy agreement of a chain of
--ttt-steps draft tokens with the target on --val held-out prompts answered by the target
(the first --val conversations), every --val-every steps: the estimated accept length.

Heads: --head full keeps the target's vocabulary and LM head (config draft_vocab_size: null:
SGLang binds the target's head; not saved); --head d2t trains a head over the --draft-vocab
most frequent tokens (the shipped ShareGPT frequency table for gemma3-270m, otherwise counted
over the training responses), initialised from the target's head rows, saved with d2t/t2d.

On a GPU lease (scripts/device/README.md, Lease T): --prepare-data writes --data and --val-data (a
name ending in .xz is compressed) on a machine with the network and stops; --states online runs the
target on every batch instead of keeping its states (any data size); --resume-state makes a run that
gets SIGTERM save its state and the draft so far (exit 124), and the same command continue from it.
--time-budget-s S fits the run into S seconds from the command's start: after a short probe of the
step rate, --steps is cut to what fits (the cosine decays over that) and the run ends cleanly in time.

Output: DIR/config.json, DIR/model.safetensors and DIR/training.json (the command, loss and
validation curves, timings, machine; `sglang-specvocab report-eagle3` tabulates and plots them). The default DIR is the
package cache's drafts/TARGET-eagle3-full (or -d2tNk), where the lab finds its default draft. Serve it with

    python -m sglang.launch_server --model-path TARGET --speculative-algorithm EAGLE3 \\
        --speculative-draft-model-path DIR --speculative-num-steps 3 --speculative-eagle-topk 1 \\
        --speculative-num-draft-tokens 4

Example (GPU, Gemma-3 270M):

    sglang-specvocab train-eagle3 --target gemma3-270m --head d2t --draft-vocab 32768 \\
        --conversations 4000 --steps 3000 --batch-size 8 --device cuda
"""


DTYPES = ("float32", "bfloat16", "float16")


def _add_train_eagle3(sub) -> None:
    p = sub.add_parser(
        "train-eagle3",
        help="train an EAGLE-3 draft (SGLang format) by self-distillation",
        description=TRAIN_EAGLE3,
        formatter_class=RAW,
    )
    _add_eagle3_data(p)
    _add_eagle3_training(p)
    _add_eagle3_output(p)
    p.set_defaults(run=_run_train_eagle3)


def _add_eagle3_data(p) -> None:
    """What the draft learns from: the target, the draft vocabulary, the text and its caches."""
    g = p.add_argument_group("target, vocabulary and data")
    g.add_argument("--target", default=GEMMA3_270M, help=f"'{GEMMA3_270M}' or a local Hugging Face checkpoint dir")
    g.add_argument("--out", help="directory to write the draft to (default: the package cache's drafts/ folder)")
    g.add_argument("--head", choices=("full", "d2t"), default="d2t", help="draft vocabulary (default: %(default)s)")
    g.add_argument("--draft-vocab", type=POSITIVE, default=32768, help="draft vocabulary size for --head d2t")
    g.add_argument(
        "--freq",
        default="auto",
        help="frequency table (.npz) choosing the d2t vocabulary; 'data' counts the training responses; "
        "'auto' (default): the shipped ShareGPT table for gemma3-270m, else 'data'",
    )
    g.add_argument(
        "--source",
        choices=("sharegpt", "generated"),
        default="sharegpt",
        help="training text: 'sharegpt' (whole conversations as Question/Answer turns, teacher-forced) or "
        "'generated' (first user turns answered greedily by the target) (default: %(default)s)",
    )
    g.add_argument(
        "--data",
        help="cache of the training token ids (.pt, or .pt.xz compressed): read if it exists, else written "
        "(default: under the package cache, named by target, source and size)",
    )
    g.add_argument(
        "--val-data",
        help="cache of the held-out validation data (.pt, .pt.xz): read if it exists, else written "
        "(default: under the package cache)",
    )
    g.add_argument(
        "--prepare-data",
        action="store_true",
        help="write --data and --val-data (a name ending in .xz is compressed) and stop: what a GPU lease carries "
        "(scripts/device/README.md, Lease T)",
    )
    g.add_argument(
        "--states",
        help="folder caching the target's states on the data, in chunks (default: under the package cache); "
        "'online': run the target on every batch instead and keep nothing (data of any size; several KB per token "
        "otherwise)",
    )
    g.add_argument(
        "--resume-state",
        help="file keeping the training state: on SIGTERM the run finishes its step, saves the state there and the "
        "draft so far to --out, and exits 124; the same command again continues from it (same settings); also "
        "saved every --val-every steps",
    )
    g.add_argument("--conversations", type=POSITIVE, default=2000, help="ShareGPT conversations to use")
    g.add_argument("--skip", type=NON_NEGATIVE, default=1000, help="ShareGPT conversations to skip first")
    g.add_argument(
        "--prompt-tokens", type=POSITIVE, default=512, help="--source generated: longer prompts are left out"
    )
    g.add_argument("--max-new-tokens", type=POSITIVE, default=256, help="--source generated: response length cap")
    g.add_argument("--gen-batch-size", type=POSITIVE, default=32, help="prompts per generate() call")
    g.add_argument(
        "--val", type=NON_NEGATIVE, default=32, help="held-out ShareGPT prompts answered by the target (0: none)"
    )
    g.add_argument("--val-new-tokens", type=POSITIVE, default=128, help="answer length of the held-out prompts")


def _add_eagle3_training(p) -> None:
    """The optimisation: schedule, loss, initialisation and the unrolled draft steps."""
    g = p.add_argument_group("training")
    g.add_argument("--val-every", type=POSITIVE, default=250, help="validate every N steps (and at the end)")
    g.add_argument("--steps", type=POSITIVE, default=2000, help="optimiser steps")
    g.add_argument("--batch-size", type=POSITIVE, default=8, help="sequences per step")
    g.add_argument(
        "--lr", type=positive_float, default=3e-4, help="peak learning rate (warm-up, then cosine to --lr-floor x lr)"
    )
    g.add_argument("--warmup", type=NON_NEGATIVE, default=None, help="warm-up steps (default: 5%% of --steps)")
    g.add_argument(
        "--lr-floor",
        type=share,
        default=0.1,
        metavar="F",
        help="where the cosine ends, as a fraction of --lr (the published recipes: about 0) (default: %(default)s)",
    )
    g.add_argument(
        "--step-weight",
        type=positive_float,
        default=1.0,
        metavar="G",
        help="unrolled draft step k's KL weighs G^k, normalised (the published recipes: 0.8, the first steps "
        "counting more; 1: all alike) (default: %(default)s)",
    )
    g.add_argument(
        "--fc-norm",
        action="store_true",
        help="an RMSNorm per captured target layer before fc (SGLang's config fc_norm: true; reported +7 %% accept "
        "length); a new draft only: --init-from refuses a draft trained without it",
    )
    g.add_argument(
        "--time-budget-s",
        type=positive_float,
        default=None,
        metavar="S",
        help="seconds the whole command may take: after ~20 steps the step rate is measured and the steps are cut "
        "to what fits (never more than --steps), the schedule following; a run falling behind stops as on SIGTERM",
    )
    g.add_argument(
        "--loss-vocab",
        type=NON_NEGATIVE,
        default=32768,
        help="--head full: the KL runs over the N most frequent tokens plus the target's top-8 at every scored "
        "position (0: the whole vocabulary, exact and several times slower) (default: %(default)s)",
    )
    g.add_argument(
        "--init",
        choices=("random", "target"),
        default="target",
        help="'target': the draft's final norm starts as the target's (its logits start at the target's scale) "
        "(default: %(default)s)",
    )
    g.add_argument("--init-from", help="start from this saved draft (its layer, fc and norms; its head if it has one)")
    g.add_argument("--seq-len", type=POSITIVE, default=1024, help="sequences are cut to this many tokens")
    g.add_argument(
        "--ttt-steps", type=POSITIVE, default=5, help="draft steps unrolled per position (training-time test)"
    )
    g.add_argument(
        "--aux-layer-ids",
        type=_int_list_any,
        help="eagle_aux_hidden_state_layer_ids, e.g. '1,8,14' (default: SGLang's)",
    )
    g.add_argument("--seed", type=int, default=0)


def _add_eagle3_output(p) -> None:
    """Where it runs and what it writes."""
    g = p.add_argument_group("device and output")
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="default: cuda when available")
    g.add_argument(
        "--dtype",
        choices=("auto", *DTYPES),
        default="auto",
        help="the target's dtype for data and states (auto: bfloat16 on cuda, float32 on cpu)",
    )
    g.add_argument(
        "--train-dtype",
        choices=("bfloat16", "float32"),
        default="bfloat16",
        help="autocast dtype of the draft's forward and its head matmuls (default: %(default)s)",
    )
    g.add_argument("--save-dtype", choices=DTYPES, default="bfloat16", help="dtype of the saved weights")
    g.add_argument("--log-every", type=NON_NEGATIVE, default=100, help="print the loss every N steps (0: never)")


def _int_list_any(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: comma-separated layer numbers") from None


def _run_train_eagle3(args) -> int:
    from time import perf_counter  # the clock only: the command's start, before the heavy imports

    started = perf_counter()  # --time-budget-s counts from here
    from ..train.command import run  # heavy: transformers
    from ..train.settings import TrainEagle3

    settings = TrainEagle3.from_args(args)
    settings.started = started
    return run(settings)


def _add_report_eagle3(sub) -> None:
    p = sub.add_parser(
        "report-eagle3",
        help="the training record of EAGLE-3 drafts (train-eagle3's training.json) as JSON, Markdown and a plot",
        description="Reads DRAFT/training.json of each draft and writes OUT.json, OUT.md (command, data, time, "
        "machine, versions, validation accept length per check) and OUT.png (loss per step, validation accept "
        "length). Example: sglang-specvocab report-eagle3 ~/.cache/sglang_specvocab/drafts/gemma3-270m-eagle3-full "
        "--out benchmarks/eagle3-gemma3-270m-training",
    )
    p.add_argument("drafts", nargs="+", type=Path, metavar="DRAFT", help="draft directories with a training.json")
    p.add_argument("--out", required=True, help="output path without extension")
    p.set_defaults(run=_run_report_eagle3)


def _run_report_eagle3(args) -> int:
    from ..train.report import run  # heavy: matplotlib

    return run(args)


def add(sub) -> None:
    for add_one in (_add_train_eagle3, _add_report_eagle3):
        add_one(sub)
