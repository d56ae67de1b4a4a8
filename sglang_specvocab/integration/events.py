"""The pinned SGLang's verify / prefill tensors -> the policies' events (``policies/base.py``), on the device.

Pure torch functions for the worker (``integration/worker.py``). Per decode round they never
sync with the host (no ``.item()``, ``.cpu()``, ``.tolist()``, no data-dependent shapes, no
Python loop over requests or tokens): every output shape follows from input shapes.

Where the worker calls them (the pinned SGLang):

- ``verify_event``: in ``EAGLEWorkerV2.verify`` overridden as ``res = super().verify(...)``
  (``speculative/eagle_worker_v2.py``; both decode paths call it), right after it returns and
  before ``_draft_extend_for_decode``, skipping idle batches: ``vi = batch.spec_info`` (read before the call), then
  ``verify_event(vi.draft_token, res.accept_index, res.accept_lens, res.next_token_ids,
  res.logits_output.next_token_logits, num_draft_tokens=self.speculative_num_draft_tokens,
  k=policy.verify_topk, compacted=self.topk > 1)`` and
  ``policy.on_verify(batch.req_pool_indices, *event)``.
- ``reset_rows`` and ``prefill_event``: in the ``_forward_prefill_batch`` copy, between the
  target forward and ``_draft_extend_for_prefill``: ``reset_rows`` on the host first, then
  ``policy.on_reset``, then ``prefill_event`` and ``policy.on_prefill``.

Which distribution the verified top-K comes from: ``eagle_sample`` (``eagle_utils.py``) adds the penalties and the logit bias to ``logits_output.next_token_logits`` and applies the
grammar mask **in place**, before it samples or takes the argmax, and ``run_eagle_verify``
returns that same tensor. After ``verify`` the logits are therefore the distribution the
round's tokens were drawn from (temperature, top-k and top-p renormalisation do not change
the ranking), which is the one MicroSpec's top-K should predict: for greedy requests the
top-1 of every accepted row is the committed token. We use it as is; getting the unprocessed
model distribution would need a ``[bs * num_draft_tokens, V]`` clone before ``eagle_sample``.
Ids the grammar mask forbids (logit ``-inf``) are dropped (-1), so a masked row gives fewer
than K ids. Without penalties, bias or grammar (the reference decoder's case) both coincide.

Two differences from the reference decoder's events, both SGLang's layout: the draft-tree
tokens come in SGLang's node order (root, then the chosen nodes sorted by node index, as
``eagle_utils.py`` builds the tree), not best-first, so a window policy may order a round's new
distinct ids differently inside the ring; and ``accepted`` holds all ``accept_lens`` tokens
(SGLang cuts at EOS / max_new_tokens later, on the host).
"""

from __future__ import annotations

import array
import functools
from collections.abc import Callable, Sequence

import torch

LMHead = torch.Tensor | Callable[[torch.Tensor], torch.Tensor]


def verify_event(
    draft_token: torch.Tensor,
    accept_index: torch.Tensor,
    accept_lens: torch.Tensor,
    predict: torch.Tensor,
    next_token_logits: torch.Tensor | None,
    *,
    num_draft_tokens: int,
    k: int,
    compacted: bool = False,
    vocab_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """The ``on_verify`` event of one verify round: ``(draft_tokens, verify_topk, accepted)``.

    Inputs as the pinned SGLang has them after ``run_eagle_verify``:

    - ``draft_token`` ``[bs * num_draft_tokens]``: the verify input's tree tokens, per request
      the root (the previous round's bonus token) first, then the tree nodes;
    - ``accept_index`` ``[bs, S]`` (``S = spec_steps + 1``): GLOBAL node indices into the
      flattened rows of the accepted path, root first, -1 padded; only entries >= 0 (and
      before ``accept_lens``) count;
    - ``accept_lens`` ``[bs]``: accepted drafts + 1 (the bonus);
    - ``predict`` (``next_token_ids``) ``[bs * num_draft_tokens]``: the committed token after
      each node. ``compacted=True`` when it went through ``_finalize_accept_tree_path``
      (``eagle_worker_common.py``; EAGLEWorkerV2 with topk > 1), which moves the accepted
      path to the front of each request's block: token j of request i is then at
      ``i * num_draft_tokens + j`` instead of ``accept_index[i, j]``. The logits are never
      compacted (only ``hidden_states`` is);
    - ``next_token_logits`` ``[bs * num_draft_tokens, V']``: the target's logits per node, as
      ``eagle_sample`` left them (see the module doc); may be None when ``k == 0``.
      ``vocab_size`` cuts padded vocabulary columns (``V' > V``) off.

    Returns, padded with -1:

    - ``draft_tokens`` ``[bs, num_draft_tokens]`` int64 (root first, SGLang's node order);
    - ``verify_topk`` ``[bs, S, k]`` int64: the target's top-``k`` ids (rank order) after each
      accepted node, i.e. at the accepted positions and at the bonus position; None if k == 0;
    - ``accepted`` ``[bs, S]`` int64: the committed tokens in order (accepted drafts, bonus).

    Cost: the top-k runs in place over all ``bs * num_draft_tokens`` rows and only its
    ``[rows, k]`` result is gathered (no vocabulary-wide row is copied). Nothing is computed
    for k == 0.
    """
    bs, width = accept_index.shape
    nd = num_draft_tokens
    steps, front = _layout(bs, width, nd, accept_index.device)
    index = accept_index.long()
    valid = (index >= 0) & (steps < accept_lens[:, None])
    safe = index.clamp(min=0)

    draft_tokens = draft_token.long().view(bs, nd)
    accepted = torch.where(valid, predict.view(-1)[front if compacted else safe].long(), -1)

    if k <= 0:
        return draft_tokens, None, accepted
    if next_token_logits is None:
        raise ValueError("verify_event: next_token_logits is required when k > 0")
    logits = next_token_logits
    vocab = logits.shape[-1] if vocab_size is None else min(vocab_size, logits.shape[-1])
    if vocab < logits.shape[-1]:
        logits = logits[:, :vocab]
    kk = min(k, vocab)
    # Top-k of every row in place, then gather the [bs, S, k] accepted ones: no copy of vocabulary-wide rows
    # (a tree's bs * num_draft_tokens rows are read once, where gathering first would read S of them twice).
    values, ids = logits.topk(kk, dim=-1)
    keep = valid[:, :, None] & (values[safe] > float("-inf"))  # ids the grammar mask forbids are dropped
    verify_topk = torch.where(keep, ids[safe], -1)
    if kk < k:
        verify_topk = torch.nn.functional.pad(verify_topk, (0, k - kk), value=-1)
    return draft_tokens, verify_topk, accepted


@functools.lru_cache(maxsize=64)
def _layout(bs: int, width: int, nd: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per batch shape, made once (no per-round ops): ``steps`` ``[S]`` and, for a compacted tree, where
    request i's j-th committed token is (``i * nd + min(j, nd - 1)``, ``[bs, S]``)."""
    steps = torch.arange(width, device=device)
    front = torch.arange(bs, device=device)[:, None] * nd + steps.clamp(max=nd - 1)[None, :]
    return steps, front


def host_to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device``: pinned + non-blocking on CUDA (no stream sync), a plain copy elsewhere."""
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _host_ints(values, what: str) -> list[int]:
    if isinstance(values, torch.Tensor):
        if values.device.type != "cpu":
            raise ValueError(
                f"prefill_event: {what} must be host values (a list or a CPU tensor), not on {values.device}"
            )
        return [int(v) for v in values.tolist()]
    return [int(v) for v in values]


def prefill_event(
    hidden: torch.Tensor | None,
    lm_head: LMHead | None,
    input_ids: torch.Tensor,
    extend_lens: Sequence[int] | torch.Tensor,
    prefix_lens: Sequence[int] | torch.Tensor | None = None,
    full_ids: Sequence[Sequence[int]] | None = None,
    fed_lens: Sequence[int] | torch.Tensor | None = None,
    *,
    k: int,
    chunk: int = 1024,
    extend_start_loc: Sequence[int] | torch.Tensor | None = None,
    vocab_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The ``on_prefill`` event of one extend batch (a whole prompt or one chunk of it).

    - ``hidden`` ``[sum(extend_lens), H]``: the target's final post-norm hidden states of
      every extended position (``logits_output.last_hidden_states`` with
      ``keep_last_hidden_states``; note section 5), packed request after request;
    - ``lm_head``: the target's LM head weight ``[V', H]``, or a callable mapping a chunk
      ``[n, H]`` to logits ``[n, V']`` (e.g. one that all-gathers vocabulary shards under
      TP); ``vocab_size`` cuts padded vocabulary columns off. ``hidden``/``lm_head`` may be
      None when ``k == 0``;
    - ``input_ids`` ``[sum(extend_lens)]``: the extended ids (``batch.input_ids``), on the device;
    - ``extend_lens``, ``prefix_lens`` (``batch.extend_lens`` / ``batch.prefix_lens``) and
      ``extend_start_loc`` (default: packed, the exclusive cumsum of ``extend_lens``): host
      values, read at prefill only;
    - ``full_ids``: per request the ids of its positions ``[0, prefix_len)`` at least
      (``Req.get_fill_ids()``: ``origin_input_ids + output_ids``, so a retracted request's too);
      needed only where a request has prefix positions the policy has not seen;
    - ``fed_lens``: per request, how many leading positions the policy already got (0 for a
      row just reset; the previous chunk's ``prefix_len + extend_len`` under chunked prefill),
      default 0. Positions ``[fed_len, prefix_len)`` are radix-cache hits: they have no hidden
      states and are seeded from ``full_ids`` only (their top-K entries are -1).

    Returns ``prompt_ids`` ``[B, L]`` and ``prompt_topk`` ``[B, L, k]`` (None if k == 0), int64,
    padded with -1: per request its unseen prefix-hit positions, then its extended positions,
    in order. The top-k runs over ``chunk`` rows at a time, so at most a ``[chunk, V']``
    logits tensor exists.

    Chunked prefill calls this once per chunk (same ``req_pool_idx``), and the policy appends
    per chunk: the window policy's stream gets chunk 1's ids, chunk 1's distinct top-K, chunk
    2's ids, ... -- what the reference decoder does when fed the chunks as separate prefill
    events. Every position's id and top-K reach the policy exactly once.

    Host work (index building, the prefix ids' copy) is O(tokens) at prefill; there is no
    device-to-host copy.
    """
    ext = _host_ints(extend_lens, "extend_lens")
    b = len(ext)
    pre = [0] * b if prefix_lens is None else _host_ints(prefix_lens, "prefix_lens")
    fed = [0] * b if fed_lens is None else _host_ints(fed_lens, "fed_lens")
    hit = [max(p - f, 0) for p, f in zip(pre, fed, strict=True)]
    if extend_start_loc is None:
        start = (
            torch.cumsum(torch.tensor([0] + ext[:-1], dtype=torch.int64), 0) if b else torch.zeros(0, dtype=torch.int64)
        )
    else:
        start = torch.tensor(_host_ints(extend_start_loc, "extend_start_loc"), dtype=torch.int64)
    width = max([h + e for h, e in zip(hit, ext, strict=True)] + [0])
    device = input_ids.device
    src, dst = _scatter_index(ext, hit, start, width, device)

    if sum(hit):
        if full_ids is None:
            raise ValueError("prefill_event: full_ids is required for prefix-cache hits (prefix_lens > fed_lens)")
        prompt_ids = host_to_device(_seeded_hits(full_ids, fed, pre, hit, width).view(-1), device)
    else:
        prompt_ids = torch.full((b * width,), -1, dtype=torch.int64, device=device)
    prompt_ids[dst] = input_ids.long().view(-1)[src]
    prompt_ids = prompt_ids.view(b, width)
    if k <= 0:
        return prompt_ids, None

    if hidden is None or lm_head is None:
        raise ValueError("prefill_event: hidden and lm_head are required when k > 0")
    topk = _chunked_topk(hidden, lm_head, k, chunk, vocab_size)
    prompt_topk = torch.full((b * width, k), -1, dtype=torch.int64, device=device)
    prompt_topk[dst] = topk[src]
    return prompt_ids, prompt_topk.view(b, width, k)


def _scatter_index(
    ext: list[int], hit: list[int], start: torch.Tensor, width: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each extended token is read (its row of the packed batch) and written (``[b * width]``), on ``device``."""
    b = len(ext)
    ext_t = torch.tensor(ext, dtype=torch.int64)
    hit_t = torch.tensor(hit, dtype=torch.int64)
    n_ext = sum(ext)
    # Extended token t of request i: source row start[i] + t, destination i * width + hit[i] + t.
    owner = torch.repeat_interleave(torch.arange(b), ext_t, output_size=n_ext)
    offset = torch.arange(n_ext) - torch.repeat_interleave(torch.cumsum(ext_t, 0) - ext_t, ext_t, output_size=n_ext)
    src = host_to_device(start[owner] + offset, device)
    dst = host_to_device(owner * width + hit_t[owner] + offset, device)
    return src, dst


def _seeded_hits(
    full_ids: Sequence[Sequence[int]], fed: list[int], pre: list[int], hit: list[int], width: int
) -> torch.Tensor:
    """The prefix-cache hits' ids on the host, ``[b, width]`` padded with -1, each request's from column 0."""
    # The hit ids are host values: laid out on the host and copied once; a slice of each request's list,
    # unboxed by ``array`` in C (about 16 ns an id, where ``torch.tensor`` of a list takes about 55 and a
    # Python loop over the ids about 90).
    b = len(hit)
    seeded = torch.full((b, width), -1, dtype=torch.int64)
    for i in range(b):
        if hit[i]:
            ids = _host_ids(full_ids[i][fed[i] : pre[i]])
            if ids.numel() != hit[i]:
                raise ValueError(
                    f"prefill_event: full_ids[{i}] has {len(full_ids[i])} ids, the prefix-cache hit needs "
                    f"positions up to prefix_len = {pre[i]}"
                )
            seeded[i, : hit[i]] = ids
    return seeded


def _host_ids(ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """Token ids as a host int64 tensor: a list is unboxed in C (``array``), a tensor copied."""
    if isinstance(ids, torch.Tensor):
        return ids.to("cpu", torch.int64)
    return torch.frombuffer(array.array("q", ids), dtype=torch.int64) if len(ids) else torch.zeros(0, dtype=torch.int64)


def _chunked_topk(hidden: torch.Tensor, lm_head: LMHead, k: int, chunk: int, vocab_size: int | None) -> torch.Tensor:
    """Top-k ids ``[n, k]`` (-1 past the vocabulary) of the logits of ``hidden[n, H]``, ``chunk`` rows at a time."""
    if chunk < 1:
        raise ValueError(f"prefill_event: chunk = {chunk} is invalid: must be >= 1")
    n = hidden.shape[0]
    out = torch.full((n, k), -1, dtype=torch.int64, device=hidden.device)
    for lo in range(0, n, chunk):  # chunks of rows: a shape-derived loop, bounded memory
        h = hidden[lo : lo + chunk]
        logits = lm_head(h) if callable(lm_head) else h.to(lm_head.dtype) @ lm_head.T
        vocab = logits.shape[-1] if vocab_size is None else min(vocab_size, logits.shape[-1])
        kk = min(k, vocab)
        out[lo : lo + h.shape[0], :kk] = logits[:, :vocab].topk(kk, dim=-1).indices
        del logits  # before the next chunk's: one [chunk, V'] tensor at a time
    return out


def reset_rows(
    req_generation: torch.Tensor,
    seen_generation: torch.Tensor,
    rows: Sequence[int] | torch.Tensor,
    fed_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    """The rows of this prefill batch whose slot was reallocated since we last saw it; updates our state.

    ``req_generation`` is ``ReqToTokenPool.req_generation`` (``mem_cache/memory_pool.py``),
    a CPU int64 tensor ``[R]`` bumped at every allocation of a row (``alloc_rows``)
    and never reset (``clear`` keeps it); ``seen_generation`` is our CPU int64 ``[R]`` copy of
    the generation each row had when its policy state was last (re)started; ``rows`` the
    batch's ``req_pool_indices`` as host values (``batch.req_pool_indices_cpu`` or
    ``[r.kv.req_pool_idx for r in batch.reqs]``). Rows whose generation changed are returned
    (CPU int64, for ``policy.on_reset(stale.to(device))``), their ``seen_generation`` set and
    their ``fed_lens`` (the positions already fed to the policy, see ``prefill_event``) zeroed.

    Both tensors live in host memory, so this reads nothing from the device; it runs once per
    prefill batch, never per decode step. A chunked prefill's later chunks keep their row and
    generation, so they are not reset; a retracted request comes back with a new row
    allocation, so it is reset and re-seeded from its full prefill.
    """
    rows_t = torch.as_tensor(rows, dtype=torch.int64)
    if rows_t.device.type != "cpu" or req_generation.device.type != "cpu" or seen_generation.device.type != "cpu":
        raise ValueError("reset_rows: req_generation, seen_generation and rows must be host (CPU) values")
    gen = req_generation[rows_t]
    stale = rows_t[gen != seen_generation[rows_t]]
    seen_generation[rows_t] = gen
    if fed_lens is not None:
        fed_lens[stale] = 0
    return stale


__all__ = ["host_to_device", "prefill_event", "reset_rows", "verify_event"]
