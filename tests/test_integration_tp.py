"""Tensor parallelism of the compact draft head: two gloo processes each hold half of the head
(SGLang's ParallelLMHead layout); the local top-k and the merge give exactly the one-process
top-k (values, token ids, tie order, probabilities), identically on every rank, for every batch
mode of the head (per request, the union by either scorer, the stock dense head).

Torch only (``sglang_specvocab.head``): neither the processes nor this module import SGLang."""

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers import free_port

from sglang_specvocab.head import head_options
from sglang_specvocab.ops import topk as L
from sglang_specvocab.vocab import VocabSpace

V, D, R, W = 1000, 16, 7, 24
KS = (1, 3, 8, W)
BATCHES = ("per-request", "union-indexed", "union-gemm", "stock")
HOT = 300  # the d2t draft's vocabulary
NEG_INF = float("-inf")


def _case(space: str):
    """(target-space weight [V, D], draft head [Vd, D], hot ids or None, table, hidden, request slots).

    Small integers in fp32: every dot product is exact, so ranks and the reference agree bit for
    bit, and many logits tie (the tie order is part of what is checked)."""
    from sglang_specvocab.table import CandidateTable

    g = torch.Generator().manual_seed(1 if space == "full" else 2)
    if space == "full":
        hot = None
        head = torch.randint(-2, 3, (V, D), generator=g).float()
        weight = head
        pool = torch.arange(V)
    else:
        hot = torch.randperm(V, generator=g)[:HOT]  # unsorted: draft order is not target order
        head = torch.randint(-2, 3, (HOT, D), generator=g).float()
        weight = torch.randint(-2, 3, (V, D), generator=g).float()
        weight[hot] = head  # the reference head sees the draft rows at their target ids
        pool = hot
    table = CandidateTable(R, W, fallback_id=int(pool[0]))
    sizes = [1, W, 2, 5, W - 1, 9, 13]  # row 0 keeps one id (padding row); some rows below k
    cands = torch.full((R, W), -1)
    for r, n in enumerate(sizes):
        if r == 0:
            continue
        cands[r, :n] = pool[torch.randperm(pool.numel(), generator=g)[:n]]
    table.assign(torch.arange(1, R), cands[1:])
    hidden = torch.randint(-2, 3, (12, D), generator=g).float()
    rpi = torch.tensor([3, 0, 5, 1, 6, 4])  # 6 requests, 2 rows each, padding row 0 included
    return weight, head, hot, table, hidden, rpi


def _reference(space: str, k: int, batch: str):
    """The one-process head over the whole draft head."""
    from sglang_specvocab.head import DraftHead

    _, head, hot, table, hidden, rpi = _case(space)
    out = DraftHead(
        head,
        table,
        VocabSpace.build(V, head_ids=hot, fallback_id=table.fallback_id),
        head_options(kernel="torch", batch=batch),
    )(hidden, rpi)
    values, tokens = out.topk(k)
    _, cols = torch.sort(out.logits, dim=1, descending=True, stable=True)
    probs = torch.softmax(out.logits, dim=1).gather(1, cols[:, :k])
    return values, tokens, probs


def _rank(rank: int, world: int, port: int, outdir: str):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    from sglang_specvocab.head import DraftHead

    try:
        out = {}
        for space in ("full", "d2t"):
            _, head, hot, table, hidden, rpi = _case(space)
            start, end = L.vocab_shard(head.shape[0], world, rank)
            # The rank's weight: its rows plus SGLang's zero padding rows at the end of the shard.
            per = L.vocab_shard(head.shape[0], world, 0)[1]
            local = torch.zeros(per, D)
            local[: end - start] = head[start:end]
            for batch in BATCHES:
                dh = DraftHead(
                    local,
                    table,
                    VocabSpace.build(V, head_ids=hot, shard=(start, end), tp_size=world, fallback_id=table.fallback_id),
                    head_options(kernel="torch", batch=batch),
                    group=None,
                )
                out_ = dh(hidden, rpi)
                for k in KS:
                    values, tokens = out_.topk(k)
                    out[space, batch, k] = (values, tokens, out_.topk_probs(k)[0])
        torch.save(out, f"{outdir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_vocab_shard_follows_parallel_lm_head():
    # 1000 pads to 1024: 512 rows a rank, the last one ends at the real vocabulary.
    assert [L.vocab_shard(1000, 2, r) for r in range(2)] == [(0, 512), (512, 1000)]
    # 300 pads to 320 (divisible by 2); 3 ranks: 320 % 3 != 0, so padding becomes 64 * 3 = 192 -> 384.
    assert [L.vocab_shard(300, 2, r) for r in range(2)] == [(0, 160), (160, 300)]
    assert [L.vocab_shard(300, 3, r) for r in range(3)] == [(0, 128), (128, 256), (256, 300)]


def test_sharded_topk_equals_one_process_topk(tmp_path):
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    got = {r: torch.load(tmp_path / f"rank{r}.pt") for r in range(2)}
    assert set(got) == {0, 1}
    for space in ("full", "d2t"):
        for batch in BATCHES:
            for k in KS:
                values, tokens, probs = _reference(space, k, batch)
                for rank in (0, 1):
                    v, t, p = got[rank][space, batch, k]
                    assert torch.equal(v, values), (space, batch, k, rank)
                    assert torch.equal(t, tokens), (space, batch, k, rank)
                    torch.testing.assert_close(p, probs, atol=1e-6, rtol=1e-5)
                # the same probabilities on every rank
                assert torch.equal(got[0][space, batch, k][2], got[1][space, batch, k][2])


def test_merge_orders_ties_by_column():
    """One process, the merge fed by hand: equal values across ranks keep column order; the live entries are the
    one-process top-k (a -inf entry's column is any dead one: the head reads it as its fallback id)."""
    full = torch.tensor([[1.0, 5.0, 5.0, 2.0, 5.0, NEG_INF, NEG_INF, NEG_INF]])
    own0 = torch.tensor([True, False, True, False, False, False, False, False])
    shards = [full.masked_fill(~own0, NEG_INF), full.masked_fill(own0, NEG_INF)]
    ref_v, ref_c = torch.sort(full, dim=1, descending=True, stable=True)
    for k in (1, 2, 3, 6, 8):
        parts = [L.local_topk(s, k) for s in shards]
        stacked = (torch.stack([p[i] for p in parts]) for i in range(3))
        v, c, lse = _merge_local(L, *stacked, k)
        live = ~torch.isneginf(ref_v[:, :k])
        assert torch.equal(v, ref_v[:, :k]) and torch.equal(c[live], ref_c[:, :k][live]), k
        torch.testing.assert_close(lse, torch.logsumexp(full, 1))


def _merge_local(L, values, cols, lse, k):
    """``merge_topk``'s arithmetic on already gathered [tp, N, k] parts (no process group)."""

    class _Fake:
        world_size = values.shape[0]

        def all_gather_into_tensor(self, out, inp):
            packed = torch.cat([values.float(), cols.float(), lse.float()[..., None]], dim=2)
            out.copy_(packed.reshape(out.shape))

    return L.merge_topk(values[0], cols[0], lse[0], k, _Fake())
