"""What several test modules share: tiny models, padding, free ports, fake HTTP servers and fakes of
SGLang's verify round and request pool. (``sglang_specvocab.tools.testing`` holds what package code uses too:
tiny checkpoints and the stand-ins that let SGLang import on a CPU machine; ``literal.py`` the literal
references of every policy.)"""

from __future__ import annotations

import pytest
import torch
from fake_http import FakeServer, JsonHandler, free_port  # noqa: F401  (re-exported)

# --- models and tensors -------------------------------------------------------------------------


def tiny_llama(vocab_size: int = 512, layers: int = 4, seed: int = 0, dtype=torch.float64):
    """A random Llama with spread-out logits, so greedy decoding is not one repeated token."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        initializer_range=0.2,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return LlamaForCausalLM(cfg).to(dtype).eval()


def pad(rows: list[list[int]], width: int | None = None) -> torch.Tensor:
    """int64 ``[len(rows), width]``, -1 past each row (``width``: the longest row by default)."""
    width = max([len(r) for r in rows] + [0]) if width is None else width
    return torch.tensor([r + [-1] * (width - len(r)) for r in rows], dtype=torch.int64).reshape(len(rows), width)


def pad3(rows: list[list[list[int]]], k: int) -> torch.Tensor:
    """int64 ``[len(rows), longest, k]``: rows of k-wide lists, -1 lists past each row."""
    width = max([len(r) for r in rows] + [0])
    padded = [r + [[-1] * k] * (width - len(r)) for r in rows]
    return torch.tensor(padded, dtype=torch.int64).reshape(len(rows), width, k)


def unpad(t: torch.Tensor) -> list[list[int]]:
    """Each row's entries >= 0, as lists."""
    return [[int(v) for v in row if v >= 0] for row in t.tolist()]


# --- fakes of SGLang's verify round and request pool --------------------------------------------


class Mode:
    """A ``ForwardMode`` stand-in: idle or not."""

    def __init__(self, idle=False):
        self.idle = idle

    def is_idle(self):
        return self.idle


class GenerationPool:
    """``ReqToTokenPool.req_generation`` alone: ``alloc(row)`` hands the row to a new request."""

    def __init__(self, n):
        self.req_generation = torch.zeros(n, dtype=torch.int64)

    def alloc(self, row):
        self.req_generation[row] += 1


def sglang_req(rid: str, row: int, ids, *, extend_end: int | None = None, output=()):
    """A real SGLang ``Req`` (import SGLang first): prompt ``ids``, ``output`` already generated (a retracted
    request's refill), slot ``row``, extending up to ``extend_end`` (default: all of prompt and output)."""
    from array import array

    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    r = Req(rid, "", array("q", list(ids)), SamplingParams(max_new_tokens=64))
    r.output_ids.extend(list(output))
    r.refresh_fill_ids()  # what init_next_round_input does before a prefill
    r.extend_end = len(r.full_untruncated_fill_ids) if extend_end is None else extend_end
    r.kv.req_pool_idx = row
    return r


def window_config(cap=16, kpre=3, kver=3, sources=("context", "extension")):
    from sglang_specvocab.policies import parse_config

    if "extension" not in sources:  # only the extension source reads a top-K (a set top-K is refused)
        kpre = kver = 0
    return parse_config(
        {
            "policy": "window",
            "capacity": cap,
            "window": {"prefill_topk": kpre, "verify_topk": kver, "sources": list(sources)},
        }
    )


def random_tree(gen, nd, steps, chain):
    """Parents of nodes 1..nd-1 (node 0 the root), parent before child, depth <= steps."""
    parents, depth = [-1], [0]
    for j in range(1, nd):
        p = j - 1 if chain else int(torch.randint(0, j, (1,), generator=gen))
        while depth[p] >= steps:
            p = parents[p]
        parents.append(p)
        depth.append(depth[p] + 1)
    return parents


def sglang_round(gen, bs, nd, steps, vocab, chain, accept_depths):
    """One verify round in SGLang's layout, greedy, with the accepted path of request i at most accept_depths[i]."""
    width = steps + 1
    draft = torch.zeros(bs, nd, dtype=torch.int64)
    logits = torch.randn(bs, nd, vocab, generator=gen, dtype=torch.float64)
    ri = torch.full((bs, nd), -1, dtype=torch.int64)
    rnt = torch.full((bs, nd), -1, dtype=torch.int64)
    rns = torch.full((bs, nd), -1, dtype=torch.int64)
    trees = []
    for i in range(bs):
        parents = random_tree(gen, nd, steps, chain)
        trees.append(parents)
        draft[i, 0] = int(torch.randint(0, vocab, (1,), generator=gen))
        for j in range(1, nd):
            taken = {int(draft[i, s]) for s in range(1, j) if parents[s] == parents[j]}
            draft[i, j] = int(
                torch.tensor([t for t in range(vocab) if t not in taken])[
                    torch.randint(0, vocab - len(taken), (1,), generator=gen)
                ]
            )
        for j in range(nd):
            ri[i, j] = i * nd + j
            kids = [c for c in range(nd) if parents[c] == j]
            rnt[i, j] = kids[0] if kids else -1
            sibs = [c for c in range(j + 1, nd) if parents[c] == parents[j]] if j else []
            rns[i, j] = sibs[0] if sibs else -1
        # Make the target agree with a random root-to-node walk of up to accept_depths[i] drafts.
        node = 0
        for _ in range(accept_depths[i]):
            kids = [c for c in range(nd) if parents[c] == node]
            if not kids:
                break
            child = kids[int(torch.randint(0, len(kids), (1,), generator=gen))]
            logits[i, node, draft[i, child]] = 10.0
            node = child
    target = logits.argmax(-1)
    predict, accept_index, accept_lens = greedy_verify(draft, ri, rnt, rns, target, width)
    return {
        "draft_token": draft.reshape(-1),
        "logits": logits.reshape(bs * nd, vocab),
        "predict": predict,
        "accept_index": accept_index,
        "accept_lens": accept_lens,
        "nd": nd,
        "trees": trees,
    }


def greedy_verify(candidates, retrieve_index, next_token, next_sibling, target_predict, width):
    """SGLang's ``verify_tree_greedy``, one request at a time, in Python."""
    bs, nd = candidates.shape
    predict = torch.zeros(bs * nd, dtype=torch.int32)
    accept_index = torch.full((bs, width), -1, dtype=torch.int32)
    accept_num = torch.zeros(bs, dtype=torch.int32)
    for b in range(bs):
        last = int(retrieve_index[b, 0])
        accept_index[b, 0] = last
        n, cur = 0, 0
        for _ in range(1, width):
            cur = int(next_token[b, cur])
            want = int(target_predict.view(-1)[last])
            while cur != -1 and int(candidates[b, cur]) != want:
                cur = int(next_sibling[b, cur])
            if cur == -1:
                break
            predict[last] = want
            n += 1
            accept_index[b, n] = int(retrieve_index[b, cur])
            last = int(retrieve_index[b, cur])
        accept_num[b] = n
        predict[last] = int(target_predict.view(-1)[last])
    return predict, accept_index, accept_num + 1


def compact_accepted(predict, accept_index, nd):
    """SGLang's ``_compact_accept_to_front`` on predict: each request's accepted entries moved to its front."""
    bs, width = accept_index.shape
    out = predict.clone()
    gathered = predict[accept_index.long().clamp(min=0).reshape(-1)]
    out.view(bs, nd)[:, :width] = gathered.view(bs, width)
    return out


def literal_event(rnd, k):
    """Per request: (draft tokens, verified top-k lists, committed tokens), read literally."""
    nd, logits, out = rnd["nd"], rnd["logits"], []
    for i in range(rnd["accept_index"].shape[0]):
        path = [int(x) for x in rnd["accept_index"][i][: int(rnd["accept_lens"][i])]]
        assert all(x >= 0 for x in path)
        drafts = rnd["draft_token"][i * nd : (i + 1) * nd].tolist()
        vtopk = [sorted(range(logits.shape[1]), key=lambda v, x=x: -float(logits[x, v]))[:k] for x in path]
        committed = [int(rnd["predict"][x]) for x in path]
        # Greedy semantics: the accepted drafts are the path's nodes, the bonus the target's choice.
        assert committed[:-1] == [int(rnd["draft_token"][x]) for x in path[1:]]
        assert committed[-1] == int(logits[path[-1]].argmax())
        out.append((drafts, vtopk, committed))
    return out


def spawn_result(target, *args, timeout: float = 240):
    """Run ``target(queue, *args)`` in a spawned process (a fresh interpreter: nothing of this one imported) and
    return what it put on the queue; the process is joined, or killed if it hangs."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(queue, *args))
    proc.start()
    try:
        return queue.get(timeout=timeout)
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()


# The tiny checkpoints of conftest's ``sg`` fixture: small and fast; the vocabulary rule only needs V > H.
SG_VOCAB, SG_DRAFT_VOCAB = 8192, 4096


def interpreter_broken() -> str | None:
    """Why this Triton's interpreter cannot run our kernels here, or None.

    Triton 3.6's interpreter (the GPU machine's) turns a scalar kernel argument into a 1-element array and
    calls ``int()`` on it in ``range()``, which NumPy >= 2.4 refuses; a later Triton squeezes the array
    first. The compiled Triton kernels are unaffected: the GPU tests cover them there, CI's Triton runs these.
    """
    import inspect

    import numpy as np
    import triton
    import triton.runtime.interpreter as interp

    try:
        int(np.array([1]))
        return None
    except TypeError:
        pass
    if "int(self.handle.data)" in inspect.getsource(interp):
        return (
            f"Triton {triton.__version__}'s interpreter calls int() on 1-element arrays, which NumPy "
            f"{np.__version__} refuses (fixed in later Triton): the interpreted kernels cannot run here"
        )
    return None


def run_interpreted(script: str, out, **env):
    """Run ``script`` (a test module's ``__main__``) as ``python script out`` in a child under the Triton
    interpreter (``TRITON_INTERPRET=1`` must be set before Triton is imported, hence a fresh process), with the
    repository first on the path and ``env`` added; returns what it saved to ``out`` (``torch.save``)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    reason = interpreter_broken()
    if reason:
        pytest.skip(reason)
    repo = Path(__file__).resolve().parents[1]
    env = dict(
        os.environ,
        TRITON_INTERPRET="1",
        PYTHONPATH=os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]),
        **env,
    )
    proc = subprocess.run(
        [sys.executable, str(Path(script).resolve()), str(out)],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"interpreted run failed:\n{proc.stdout}\n{proc.stderr}"
    return torch.load(out)


# The review's host-sync probe (issue 36: ``rows.tolist(); (rows >= 0).nonzero(); hidden[mask]`` inside
# ``DraftHead.__call__``): each as (probe(hidden, rows), what the capture's refusal names).
REVIEW_PROBES = [
    (lambda hidden, rows: rows.tolist(), r"torch\.Tensor\.tolist"),
    (lambda hidden, rows: (rows >= 0).nonzero(), r"aten\.nonzero"),
    (lambda hidden, rows: hidden[hidden[:, 0] > 0], r"aten\.index\.Tensor indexes with a boolean mask"),
]


def recorded(res, who: str):
    """What a child process recorded for one case, or the test fails showing the traceback it recorded instead
    (the children of the gloo TP tests record a case that raised as its traceback string and run the others)."""
    if isinstance(res, str):
        pytest.fail(f"{who} raised:\n{res}")
    return res
