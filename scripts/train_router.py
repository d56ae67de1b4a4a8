#!/usr/bin/env python3
"""Train a DynaSpec router (``cluster`` policy, ``router: PATH``) on recorded draft hidden states.

The clusters are the policy's own (spherical k-means of the LM-head rows, same settings as
the config, from the cache). The router, a two-layer MLP on [embedding of the input token,
draft hidden state], is fitted with multi-label BCE: positives are the clusters that hold the
full head's top-L tokens. Training text: ShareGPT prompts, never the evaluation prompts.

    python scripts/train_router.py --config configs/dynaspec.yaml --out routers/gemma3-270m.pt
"""

from __future__ import annotations

import argparse
import sys

from sglang_specvocab.errors import SpecVocabError
from sglang_specvocab.lab.training import add_recording_args, recorded_states, save_trained, train_router
from sglang_specvocab.policies import ModelContext, build_policy, load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_recording_args(parser)
    parser.add_argument("--config", required=True, help="the cluster policy config whose clusters to route to")
    parser.add_argument("--top-l", type=int, default=8, help="L: the head's top-L tokens mark positive clusters")
    parser.add_argument("--width", type=int, default=512, help="the MLP's hidden width")
    parser.add_argument("--out", required=True, help="router file to write (.pt)")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config)
        if cfg.policy != "cluster":
            raise SpecVocabError(f"{args.config}: policy = {cfg.policy!r}, a router needs a 'cluster' config")
        cfg = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"router": "centroid"})})
        lm, draft, hidden, tokens = recorded_states(args)
        policy = build_policy(cfg, 1, model=ModelContext(weight=draft.weight.detach(), vocab_size=draft.vocab_size))
    except SpecVocabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"[train_router] {len(hidden)} recorded draft states, {len(policy.offsets) - 1} clusters", file=sys.stderr)
    router, losses = train_router(draft.weight, draft.embedding, hidden, tokens, policy.perm, policy.offsets,
                                  top_l=args.top_l, width=args.width, steps=args.steps, lr=args.lr,
                                  batch_size=args.batch_size, seed=args.seed, progress=True)
    data = {"state": router.state_dict(), "clusters_key": policy.clusters_key, "width": args.width,
            "clusters": len(policy.offsets) - 1}
    save_trained(args.out, data, losses, "train_router", "BCE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
