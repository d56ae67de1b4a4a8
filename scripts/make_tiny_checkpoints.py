#!/usr/bin/env python3
"""Write tiny random checkpoints for tests: DIR/target (a Llama with an offline tokenizer),
DIR/draft-d2t (EAGLE-3 draft, 32768-token head + d2t) and DIR/draft-full (EAGLE-3 draft that
borrows the target's full-vocabulary LM head, draft_vocab_size: null). See
sglang_specvocab/fixtures.py for what exactly is written. Deterministic for a seed.

    python scripts/make_tiny_checkpoints.py --out /tmp/tiny
    python -m sglang.launch_server --model-path /tmp/tiny/target --speculative-algorithm EAGLE3 \\
        --speculative-draft-model-path /tmp/tiny/draft-d2t --speculative-num-steps 3 \\
        --speculative-eagle-topk 1 --speculative-num-draft-tokens 4
"""

from __future__ import annotations

import argparse
import sys

from sglang_specvocab.errors import SpecVocabError


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory to write (must be empty or absent, unless --force)")
    p.add_argument("--vocab", type=int, default=128256, help="target vocabulary size (default: %(default)s)")
    p.add_argument("--draft-vocab", type=int, default=32768, help="d2t draft vocabulary size (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    p.add_argument("--force", action="store_true", help="overwrite the target/draft folders of a non-empty --out")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from sglang_specvocab.testing.tiny import make_tiny_checkpoints

    try:
        ck = make_tiny_checkpoints(
            args.out, vocab_size=args.vocab, seed=args.seed, force=args.force, draft_vocab_size=args.draft_vocab
        )
    except SpecVocabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(ck.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
