"""How large is the union of a batch's candidate sets? ``sglang-specvocab union-sizes`` measures it in the lab.

The union head (``head.batch: union``) reads the batch's distinct candidate rows once; the cost model
(``headcost.UnionSizes``) needs its expected size as a function of the batch size. Per Spec-Bench question (first
turn, the lab's prompt format) the real ``window`` policy is fed the events of greedy target decoding on Gemma-3
270M, one table row per question:

- prefill: the prompt ids and the target's top-K at every prompt position (what the server computes);
- then rounds of ``round_tokens`` committed tokens, each as a verify event whose draft-tree tokens are the round's
  root and committed tokens (a draft that proposed exactly the target's chain) and whose verified top-K is the
  target's at those positions.

After prefill and after every round the question's set is kept. A batch of ``bs`` requests is then ``bs`` distinct
questions drawn uniformly, each at a uniformly drawn point of its decoding (requests of a serving batch are at
different points); its union size is the number of distinct ids over their sets. For every batch size the result
holds the mean (and 10th/90th percentile) union size and the mean set size of the drawn sets, and the ratio
``mean union / mean set``: how many sets' worth of rows the union reads (1 = identical sets, ``bs`` = disjoint).
The cost model scales that ratio by the set capacity, i.e. it assumes full sets overlap as the measured ones do.
"""

from __future__ import annotations

import json
import random
import sys
import time

import numpy as np
import torch

from ...errors import SpecVocabError
from ...policies import build_policy, load_config
from ..models import load_model
from ..prompts import format_prompt, load_questions
from .decoder import CausalLM

BATCHES = (1, 8, 32, 64, 128)


@torch.no_grad()
def question_sets(
    target: CausalLM, policy, prompts: list[list[int]], new_tokens: int, round_tokens: int, progress: bool = True
) -> list[list[np.ndarray]]:
    """Per prompt (table row i + 1): its set after prefill and after each round, as sorted int arrays."""
    out = []
    kpre, kver = policy.prefill_topk, policy.verify_topk
    for i, ids in enumerate(prompts):
        row = torch.tensor([i + 1])
        cache = target.new_cache()
        prompt = torch.tensor([ids])
        hidden = target.hidden(prompt, cache)[0]
        policy.on_reset(row)
        policy.on_prefill(row, prompt, target.topk_ids(hidden, kpre)[None] if kpre else None)
        snaps = [np.array(policy.table.row(i + 1))]
        root = int(target.logits(hidden[-1]).argmax())  # the first token, committed by prefill
        logits = target.logits(target.hidden(torch.tensor([[root]]), cache)[0])  # predicts the token after it
        done = 0
        while done < new_tokens:
            chain, tops = [], []
            tok = root
            for _ in range(round_tokens):
                tops.append(logits.topk(max(kver, 1), dim=-1).indices[0])
                tok = int(logits.argmax())
                chain.append(tok)
                logits = target.logits(target.hidden(torch.tensor([[tok]]), cache)[0])
            vtopk = torch.stack(tops)[None, :, :kver] if kver else None
            policy.on_verify(row, torch.tensor([[root, *chain[:-1]]]), vtopk, torch.tensor([chain]))
            snaps.append(np.array(policy.table.row(i + 1)))
            root = chain[-1]
            done += round_tokens
        out.append(snaps)
        if progress:
            print(f"\r[union-sizes] {i + 1}/{len(prompts)} questions", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    return out


def union_stats(sets: list[list[np.ndarray]], batches: tuple[int, ...], samples: int, seed: int = 0) -> list[dict]:
    """For each batch size: union and set sizes over ``samples`` draws of distinct questions at random points."""
    rng = random.Random(seed)
    out = []
    for bs in batches:
        if bs > len(sets):
            raise SpecVocabError(f"batch {bs} needs at least {bs} questions, {len(sets)} were decoded")
        unions, sizes = [], []
        for _ in range(samples):
            drawn = [rng.choice(sets[q]) for q in rng.sample(range(len(sets)), bs)]
            unions.append(len(np.unique(np.concatenate(drawn))))
            sizes.extend(len(s) for s in drawn)
        u = np.array(unions, dtype=np.float64)
        out.append(
            {
                "batch": bs,
                "mean_union": float(u.mean()),
                "p10_union": float(np.percentile(u, 10)),
                "p90_union": float(np.percentile(u, 90)),
                "mean_set": float(np.mean(sizes)),
                "ratio": float(u.mean() / np.mean(sizes)),
            }
        )
    return out


def run(args) -> int:
    """``sglang-specvocab union-sizes``: decode, measure, write the JSON the cost model reads."""
    from .runner import versions  # the lab's version record

    config = load_config(args.config)
    if config.policy != "window":
        raise SpecVocabError(f"{args.config}: policy = {config.policy!r} is invalid here: union-sizes feeds a window")
    questions = load_questions(args.questions, args.per_category)
    lm = load_model(args.model)
    config.check_vocab(lm.vocab_size, args.model)
    target = CausalLM(lm.model, name=args.model)
    prompts = [lm.encode(format_prompt(lm.tokenizer, [q.turns[0]], []))[: args.max_prompt_tokens] for q in questions]
    eos = lm.eos_token_ids
    policy = build_policy(config, num_rows=len(prompts) + 1, fallback_id=min(eos) if eos else 0)
    started = time.perf_counter()
    sets = question_sets(target, policy, prompts, args.new_tokens, args.round_tokens, progress=not args.no_progress)
    stats = union_stats(sets, tuple(args.batches), args.samples, args.seed)
    result = {
        "schema": "union_sizes/1",
        "capacity": config.table_capacity,
        "batches": [s["batch"] for s in stats],
        "ratio": [s["ratio"] for s in stats],
        "provenance": {
            "source": "sglang-specvocab union-sizes (window sets of greedy target decoding over Spec-Bench questions)",
            "command": args.command_line,
            "model": args.model,
            "config": str(args.config),
            "questions": str(args.questions),
            "n_questions": len(prompts),
            "categories": sorted({q.category for q in questions}),
            "new_tokens": args.new_tokens,
            "round_tokens": args.round_tokens,
            "max_prompt_tokens": args.max_prompt_tokens,
            "samples": args.samples,
            "seed": args.seed,
            "stats": stats,
            "seconds": round(time.perf_counter() - started, 1),
            "versions": versions(),
        },
    }
    text = json_dump(result)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    lines = ["| batch | mean union | p10-p90 | mean set | union / set |", "|---:|---:|---:|---:|---:|"]
    for s in stats:
        lines.append(
            f"| {s['batch']} | {s['mean_union']:.0f} | {s['p10_union']:.0f}-{s['p90_union']:.0f} | "
            f"{s['mean_set']:.0f} | {s['ratio']:.2f} |"
        )
    print("\n".join(lines))
    return 0


def json_dump(result: dict) -> str:
    return json.dumps(result, indent=1) + "\n"
