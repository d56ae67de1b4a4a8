#!/usr/bin/env python3
"""Train a SpecVocab ranker (``lowrank`` policy, ``ranker: PATH``) on recorded draft hidden states.

The reference decoder drafts ShareGPT prompts (never the evaluation prompts) with the model's
self-draft; every draft step's hidden states are recorded. The ranker (W_down [d', d],
W_vocab [V, d']) starts from the truncated SVD of the draft's LM head and is fitted by KL
distillation to the full head's distribution. The loss of each step is printed at the end.

    python scripts/train_ranker.py --rank 64 --out rankers/gemma3-270m-r64.pt
"""

from __future__ import annotations

import argparse
import sys

from sglang_specvocab.lab.training import add_recording_args, recorded_states, save_trained, train_ranker


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_recording_args(parser)
    parser.add_argument("--rank", type=int, required=True, help="d', the ranker's inner dimension")
    parser.add_argument("--out", required=True, help="ranker file to write (.pt)")
    args = parser.parse_args(argv)
    _, draft, hidden, _ = recorded_states(args)
    print(f"[train_ranker] {len(hidden)} recorded draft states", file=sys.stderr)
    w_down, w_vocab, losses = train_ranker(draft.weight, hidden, args.rank, steps=args.steps, lr=args.lr,
                                           batch_size=args.batch_size, seed=args.seed, progress=True)
    save_trained(args.out, {"w_down": w_down, "w_vocab": w_vocab}, losses, "train_ranker", "KL")
    return 0


if __name__ == "__main__":
    sys.exit(main())
