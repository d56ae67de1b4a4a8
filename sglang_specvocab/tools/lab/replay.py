"""Replay recorded decoding events through a policy: study a policy offline, check its semantics.

Trace (jsonl, one request per line)::

    {"prompt_ids": [...], "prompt_topk": [[K ids] per prompt position],
     "rounds": [{"draft_tokens": [...], "verify_topk": [[K ids] per verified position],
                 "accepted": [...]}, ...]}

Output (jsonl, one line per request and round; round 0 is after prefill)::

    {"request": i, "round": r, "size": n, "ids": [sorted active ids]}

Requests run in lockstep batches of ``batch_size`` table rows (rows 1..B; row 0 is the
padding row), the same batched calls the server makes; rows are reset and reused between
batches, like SGLang's request slots.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ...config import PolicyConfig
from ...errors import SpecVocabError, TraceError
from ...policies import Policy, build_policy, load_config

_REQUEST_KEYS = {"prompt_ids", "prompt_topk", "rounds"}
_ROUND_KEYS = {"draft_tokens", "verify_topk", "accepted"}


@dataclass
class Round:
    draft_tokens: list[int]
    verify_topk: list[list[int]]
    accepted: list[int]


@dataclass
class Request:
    prompt_ids: list[int]
    prompt_topk: list[list[int]]
    rounds: list[Round]


def read_trace(
    path: str | Path, prefill_topk: int = 0, verify_topk: int = 0, vocab_size: int | None = None
) -> list[Request]:
    """Parse and check a trace; ``*_topk`` are how many ids per position the policy needs."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"cannot read trace file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    out = []
    for n, line in enumerate(lines, 1):
        if line.strip():
            out.append(_parse(line, f"{path} line {n}", prefill_topk, verify_topk, vocab_size))
    if not out:
        raise TraceError(f"{path}: no requests")
    return out


def _ids(value, where: str, vocab_size: int | None, *, nonempty: bool = False) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise TraceError(f"{where} must be a list of integer token ids, got {str(value)[:60]}")
    if nonempty and not value:
        raise TraceError(f"{where} must not be empty")
    bad = [v for v in value if v < 0 or (vocab_size is not None and v >= vocab_size)]
    if bad:
        limit = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
        raise TraceError(f"{where} has token id {bad[0]}; ids must be {limit}")
    return value


def _topk(value, where: str, k: int, vocab_size: int | None, positions: int | None = None) -> list[list[int]]:
    if not isinstance(value, list):
        raise TraceError(f"{where} must be a list of top-K id lists (one per position)")
    if positions is not None and len(value) != positions:
        raise TraceError(f"{where} has {len(value)} positions but prompt_ids has {positions}")
    rows = [_ids(v, f"{where}[{i}]", vocab_size) for i, v in enumerate(value)]
    short = next((i for i, r in enumerate(rows) if len(r) < k), None)
    if short is not None:
        raise TraceError(f"{where}[{short}] has {len(rows[short])} ids; the policy needs {k} per position")
    return [r[:k] for r in rows]


def _keys(item, where: str, valid: set[str], required: set[str]) -> None:
    if not isinstance(item, dict):
        raise TraceError(f"{where} must be a JSON object with keys {', '.join(sorted(valid))}")
    unknown = sorted(set(item) - valid)
    if unknown:
        raise TraceError(f"{where}: unknown key '{unknown[0]}'; valid keys: {', '.join(sorted(valid))}")
    missing = sorted(required - set(item))
    if missing:
        raise TraceError(f"{where}: missing key '{missing[0]}'")


def _parse(line: str, where: str, kpre: int, kver: int, vocab: int | None) -> Request:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}: not valid JSON: {exc.msg} (column {exc.colno})") from None
    _keys(item, where, _REQUEST_KEYS, {"prompt_ids"} | ({"prompt_topk"} if kpre else set()))
    prompt = _ids(item["prompt_ids"], f"{where}: prompt_ids", vocab, nonempty=True)
    ptopk = _topk(item.get("prompt_topk", []), f"{where}: prompt_topk", kpre, vocab, len(prompt) if kpre else None)
    rounds = item.get("rounds", [])
    if not isinstance(rounds, list):
        raise TraceError(f"{where}: rounds must be a list of round objects")
    parsed = []
    for r, rnd in enumerate(rounds, 1):
        at = f"{where}: rounds[{r - 1}]"
        _keys(rnd, at, _ROUND_KEYS, {"draft_tokens"} | ({"verify_topk"} if kver else set()))
        parsed.append(
            Round(
                _ids(rnd["draft_tokens"], f"{at}.draft_tokens", vocab),
                _topk(rnd.get("verify_topk", []), f"{at}.verify_topk", kver, vocab),
                _ids(rnd.get("accepted", []), f"{at}.accepted", vocab),
            )
        )
    return Request(prompt, ptopk, parsed)


def _pad(rows: list[list[int]]) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0)
    return torch.tensor([r + [-1] * (width - len(r)) for r in rows], dtype=torch.int64).reshape(len(rows), width)


def _pad3(rows: list[list[list[int]]], k: int) -> torch.Tensor | None:
    if k == 0:
        return None
    width = max((len(r) for r in rows), default=0)
    return torch.tensor([r + [[-1] * k] * (width - len(r)) for r in rows], dtype=torch.int64).reshape(
        len(rows), width, k
    )


def replay_policy(config: PolicyConfig, batch_size: int = 8) -> Policy:
    """The policy to replay ``config`` with: ``batch_size`` request rows plus the padding row."""
    if batch_size < 1:
        raise TraceError(f"batch size = {batch_size} is invalid: must be >= 1")
    policy = build_policy(config, num_rows=batch_size + 1)
    if policy.dense:
        raise TraceError(f"policy '{config.policy}' has no candidate set to replay")
    return policy


def replay(policy: Policy, requests: list[Request]) -> Iterator[dict]:
    """Yield the active set of every request after prefill and after every round."""
    table, kpre, kver = policy.table, policy.prefill_topk, policy.verify_topk
    batch_size = table.num_rows - 1
    for start in range(0, len(requests), batch_size):
        group = requests[start : start + batch_size]
        rows = torch.arange(1, len(group) + 1)
        policy.on_reset(rows)
        policy.on_prefill(rows, _pad([q.prompt_ids for q in group]), _pad3([q.prompt_topk for q in group], kpre))
        yield from _sets(table, rows, start, 0)
        for r in range(max(len(q.rounds) for q in group)):
            live = [i for i, q in enumerate(group) if r < len(q.rounds)]
            rnds = [group[i].rounds[r] for i in live]
            policy.on_verify(
                rows[live],
                _pad([x.draft_tokens for x in rnds]),
                _pad3([x.verify_topk for x in rnds], kver),
                _pad([x.accepted for x in rnds]),
            )
            yield from _sets(table, rows[live], start, r + 1)


def _sets(table, rows: torch.Tensor, start: int, rnd: int) -> Iterator[dict]:
    for row in rows.tolist():
        ids = table.row(row)
        yield {"request": start + row - 1, "round": rnd, "size": len(ids), "ids": ids}


def run(args) -> int:
    """``sglang-specvocab replay``: every request of ``args.trace`` through ``args.config``'s policy, sets to ``args.out``."""
    cfg = load_config(args.config)
    if args.vocab_size is not None:
        cfg.check_vocab(args.vocab_size, f"--vocab-size {args.vocab_size}")
    policy = replay_policy(cfg, args.batch_size)
    requests = read_trace(args.trace, policy.prefill_topk, policy.verify_topk, args.vocab_size)
    lines = sorted(replay(policy, requests), key=lambda d: (d["request"], d["round"]))
    try:
        with open(args.out, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
    except OSError as exc:
        raise SpecVocabError(f"cannot write {args.out}: {exc.strerror or exc}") from None
    print(f"replayed {len(requests)} requests, {len(lines)} sets -> {args.out}")
    return 0
