"""Tensor parallelism through SGLang's own code on CPU: two gloo processes build SGLang's distributed state as
its model runner and launcher do (``init_distributed_environment``, ``publish`` of a ``tp_size=2`` ``ServerArgs``
with the rank, ``initialize_model_parallel``), a real ``LlamaForCausalLMEagle3`` draft whose ``ParallelLMHead``
SGLang shards and pads itself (its weight loader cuts the checkpoint's head; 1001 rows pad to 1024, so rank 1
owns 489 real rows and 23 padding rows), and the compact processor installed by ``integration.logits.install``,
which merges its top-k over SGLang's TP ``GroupCoordinator`` (``get_parallel().tp_group``). Then one process
(rank 0's, after SGLang's teardown) does the same at tp=1.

Checked, for a full-vocabulary and a d2t (``hot_token_id``) draft and every ``head.batch`` mode, with 2 rows and
1 row a request: ``draft_topk`` (k = 1, 3, 8, 24) and ``draft_topk1`` give bit-identical ids and probabilities on
both ranks; every process's result is the brute-force top-k of the checkpoint tensors (values and probabilities:
independent of the package's tie rule); the tp=2 ids, tie order included, are the tp=1 ids. Weights and hidden
states are small integers in fp32, so every logit is exact on every rank and ties abound.

One setting is the CPU engine's, not a GPU server's: SGLang's ``GroupCoordinator.all_gather_into_tensor``
(sglang/srt/distributed/parallel_state.py:1363) calls its own gather directly only on its CPU engine
(``_is_cpu``, i.e. ``SGLANG_USE_CPU_ENGINE=1``); otherwise it goes through the custom op
``sglang::reg_all_gather_into_tensor``, registered for the CUDA key only, which raises ``NotImplementedError:
Could not run 'sglang::reg_all_gather_into_tensor' with arguments from the 'CPU' backend`` on CPU tensors. The CPU
engine itself cannot be imported here (sglang/kernels/ops/kvcache/cache_move.py:10 needs the CPU ``sgl_kernel``
build, not installed), so the children set ``parallel_state._is_cpu`` after the groups are built: the gather is
then ``GroupCoordinator._all_gather_into_tensor`` over its gloo ``device_group``, the same method the custom op
runs on a GPU."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers import free_port, recorded

from sglang_specvocab.config import HeadSection
from sglang_specvocab.table import CandidateTable
from sglang_specvocab.vocab import VocabSpace

pytestmark = pytest.mark.sglang

V, HOT, D, R, W = 1001, 301, 16, 7, 24  # 1001 -> 1024 and 301 -> 320 padded rows: shards end short
KS = (1, 3, 8, W)  # 24 is past the fused top-k's largest k: both one-rank paths
BATCHES = ("per-request", "union-indexed", "union-gemm", "stock")
SPACES = ("full", "d2t")
PROCS = ("tp2_rank0", "tp2_rank1", "tp1")
RPI = torch.tensor([3, 0, 5, 1, 6, 4])  # 6 requests; slot 0 is the padding row (its fallback set)
NEG_INF = float("-inf")
# At tp=1 too SGLang pads the head's weight (1001 -> 1024, 301 -> 320 rows): the stock head must never propose a
# padding row (row 0 of the hidden states makes every real logit -40, below a padding row's 0).


def _inputs():
    """Checkpoint tensors (the target-space head; the d2t draft's head is its hot rows), tables, hidden states."""
    g = torch.Generator().manual_seed(0)
    weight = torch.randint(-2, 3, (V, D), generator=g).float()  # few values: many exact ties
    weight[:, 0] = -2  # with hidden row 0 below, every real logit of that row is -40, below a padding row's 0
    hot = torch.randperm(V, generator=g)[:HOT]  # unsorted: draft row order is not target id order
    tables = {}
    for space, pool in (("full", torch.arange(V)), ("d2t", hot)):
        t = CandidateTable(R, W, fallback_id=int(pool[0]))
        sizes = [1, W, 2, 5, W - 1, 9, 13]  # some rows shorter than k
        cands = torch.full((R, W), -1)
        for r, n in enumerate(sizes[1:], start=1):
            cands[r, :n] = pool[torch.randperm(pool.numel(), generator=g)[:n]]
        t.assign(torch.arange(1, R), cands[1:])
        tables[space] = (t.ids.clone(), t.cnt.clone(), t.fallback_id)
    hidden = torch.randint(-2, 3, (12, D), generator=g).float()  # 2 rows a request
    hidden[0] = 0
    hidden[0, 0] = 20  # one row whose logits all tie at -40
    return {"weight": weight, "hot": hot, "tables": tables, "hidden": hidden}


def _forward_batch(n_rows, rpi):
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode

    bs = rpi.shape[0]
    return ForwardBatch(
        forward_mode=ForwardMode.DECODE, batch_size=bs, input_ids=torch.zeros(n_rows, dtype=torch.long),
        req_pool_indices=rpi, seq_lens=torch.full((bs,), 8), out_cache_loc=torch.zeros(n_rows, dtype=torch.long),
        seq_lens_sum=8 * bs, return_logprob=False, capture_hidden_mode=CaptureHiddenMode.LAST,
    )  # fmt: skip


def _draft(space, inp):
    """SGLang's EAGLE-3 draft; its head loaded by SGLang's own weight loader (which shards and pads it)."""
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3
    from transformers import LlamaConfig

    cfg = LlamaConfig(
        vocab_size=V, hidden_size=D, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip
    cfg.draft_vocab_size = HOT if space == "d2t" else None
    model = LlamaForCausalLMEagle3(cfg)
    if space == "d2t":  # the checkpoint's d2t holds target id - draft row
        hot = inp["hot"]
        model.load_weights([("lm_head.weight", inp["weight"][hot]), ("d2t", hot - torch.arange(HOT))])
    else:
        model.load_weights([("lm_head.weight", inp["weight"])])
    return model


def _case(model, proc, hidden):
    """The processor's forward on a decode batch, then the worker's calls: 2 rows a request (the multi-step draft's
    topk rows), then 1 (a chain)."""
    res = {}
    for n, h in ((2, hidden), (1, hidden[::2])):
        logits = proc(None, h, model.lm_head, _forward_batch(h.shape[0], RPI)).next_token_logits
        for k in KS:
            res[n, k] = proc.draft_topk(logits, k, RPI)
        chain = torch.full((h.shape[0], 3), -7, dtype=torch.int64)
        res[n, "top1"] = proc.draft_topk1(logits, RPI, chain=chain, column=1)
        res[n, "chain"] = chain
    return res


def _run(rank, worlds, inp_path):
    """One process: for each (world size, port, output file), SGLang's distributed state at tp=world, every (space,
    batch) through the processor, then SGLang's teardown. (Rank 0 runs the tp=1 world after the tp=2 one: one SGLang
    import less on a small machine.) A case that raises records its traceback (the test shows it)."""
    os.environ.pop("SGLANG_USE_CPU_ENGINE", None)  # its import chain needs the CPU sgl_kernel (module docstring)
    from sglang_specvocab.tools.testing.standins import install as standins

    standins()
    torch.set_num_threads(1)
    inp = torch.load(inp_path)
    for world, port, out_path in worlds:
        _world(rank, world, port, inp, out_path)


def _world(rank, world, port, inp, out_path):
    import traceback

    from sglang.srt.distributed import parallel_state as ps
    from sglang.srt.runtime_context import get_parallel
    from sglang.test.test_utils import publish_build_topology

    from sglang_specvocab.integration import logits as L

    ps.init_distributed_environment(
        world_size=world, rank=rank, local_rank=rank, backend="gloo",
        distributed_init_method=f"tcp://127.0.0.1:{port}",
        timeout=120,  # a rank that fails before a collective leaves the other waiting this long, not 30 min
    )  # fmt: skip
    try:
        publish_build_topology(world_rank=rank, tp_size=world)  # the launcher's publish: widths and this rank
        ps.initialize_model_parallel(backend="gloo")
        ps._is_cpu = True  # the CPU engine's collectives (module docstring)
        tp = get_parallel().tp_group
        out = {"tp_group": (type(tp).__name__, tp.world_size, tp.rank_in_group, dist.get_backend(tp.device_group))}
        for space in SPACES:
            model = _draft(space, inp)
            si = model.lm_head.shard_indices
            out[space, "shard"] = (si.org_vocab_start_index, si.org_vocab_end_index, model.lm_head.weight.shape[0])
            table = CandidateTable.over(*inp["tables"][space])  # the parent's table, rebuilt
            kw = {}
            if space == "d2t":
                kw.update(
                    space=VocabSpace.build(
                        V, head_ids=model.hot_token_id, fallback_id=table.fallback_id, **L.head_shard(model.lm_head)
                    )
                )
            for batch in BATCHES:
                try:
                    # a plan's name forces that plan (no config file can name one)
                    head = HeadSection(kernel="torch").model_copy(update={"batch": batch})
                    proc = L.install(model, table, head, **kw)
                    out[space, batch, "group"] = proc.dv_head.group is tp
                    out[space, batch] = _case(model, proc, inp["hidden"])
                except Exception:  # noqa: BLE001 - recorded for the test to show; the other cases still run
                    out[space, batch] = traceback.format_exc()
        torch.save(out, out_path)
    finally:
        ps.destroy_model_parallel()
        ps.destroy_distributed_environment()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tp_sglang")
    inp = _inputs()
    torch.save(inp, tmp / "in.pt")
    port2, port1 = free_port(), free_port()
    worlds = {0: [(2, port2, tmp / "tp2_rank0.pt"), (1, port1, tmp / "tp1.pt")], 1: [(2, port2, tmp / "tp2_rank1.pt")]}
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_run, args=(rank, w, str(tmp / "in.pt"))) for rank, w in worlds.items()]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    for p in procs:
        if p.is_alive():  # stuck (a collective the other rank never joined): do not outlive the test
            p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    return inp, {n: torch.load(tmp / f"{n}.pt", weights_only=False) for n in PROCS}


def _result(got, name, space, batch):
    return recorded(got[name][space, batch], name)


def test_sglang_built_the_sharded_state(runs):
    _, got = runs
    # SGLang's TP GroupCoordinator over gloo, the group every processor merges over.
    assert got["tp2_rank0"]["tp_group"] == ("GroupCoordinator", 2, 0, "gloo")
    assert got["tp2_rank1"]["tp_group"] == ("GroupCoordinator", 2, 1, "gloo")
    assert got["tp1"]["tp_group"] == ("GroupCoordinator", 1, 0, "gloo")
    # ParallelLMHead's shards: the last rank's ends at the real vocabulary, its weight keeps the padding rows.
    assert got["tp2_rank0"]["full", "shard"] == (0, 512, 512)
    assert got["tp2_rank1"]["full", "shard"] == (512, 1001, 512)
    assert got["tp2_rank0"]["d2t", "shard"] == (0, 160, 160)
    assert got["tp2_rank1"]["d2t", "shard"] == (160, 301, 160)
    assert got["tp1"]["full", "shard"] == (0, 1001, 1024) and got["tp1"]["d2t", "shard"] == (0, 301, 320)
    for name in PROCS[:2]:
        assert all(got[name][s, b, "group"] for s in SPACES for b in BATCHES)


def _brute_force(inp, space, batch, hidden, n, k):
    """Top-k logits and probabilities of each row from the checkpoint tensors, by hand: the row's candidate ids
    (every draft-vocabulary id for the stock head), logit = weight[id] . h, sorted; -inf and 0 past the live ids."""
    ids, cnt, _ = inp["tables"][space]
    pool = torch.arange(V) if space == "full" else inp["hot"]
    vals, probs = [], []
    for row, h in enumerate(hidden):
        slot = int(RPI[row // n])
        cand = pool if batch == "stock" else ids[slot, : int(cnt[slot])].long()
        logit = inp["weight"][cand] @ h
        top = torch.sort(logit, descending=True).values[:k]
        pad = k - top.numel()
        vals.append(torch.cat([top, torch.full((pad,), NEG_INF)]))
        probs.append(torch.cat([torch.exp(top - torch.logsumexp(logit, 0)), torch.zeros(pad)]))
    return torch.stack(vals), torch.stack(probs)


def _cases(names):
    """(name, space, batch) params."""
    for space in SPACES:
        for batch in BATCHES:
            for name in names:
                yield pytest.param(name, space, batch, id=f"{name}-{space}-{batch}")


@pytest.mark.parametrize("name, space, batch", list(_cases(PROCS)))
def test_draft_topk_is_the_brute_force_topk(runs, name, space, batch):
    inp, got = runs
    res = _result(got, name, space, batch)
    fallback = inp["tables"][space][2]
    allowed = torch.arange(V) if space == "full" else inp["hot"]
    for n in (2, 1):
        hidden = inp["hidden"] if n == 2 else inp["hidden"][::2]
        for k in KS:
            probs, tokens = res[n, k]
            assert tokens.shape == probs.shape == (hidden.shape[0], k) and tokens.dtype == torch.int64
            assert bool(torch.isin(tokens, allowed).all()), (n, k)  # real ids, of the draft's vocabulary
            want_v, want_p = _brute_force(inp, space, batch, hidden, n, k)
            live = torch.isfinite(want_v)
            logit = torch.einsum("nkd,nd->nk", inp["weight"][tokens], hidden)
            assert torch.equal(logit[live], want_v[live]), (n, k)  # the k best logits of the row
            assert bool((tokens[~live] == fallback).all())  # past a short set: the fallback id
            for row in range(tokens.shape[0]):
                assert len(set(tokens[row][live[row]].tolist())) == int(live[row].sum())  # no id twice
            torch.testing.assert_close(probs, want_p, atol=1e-6, rtol=1e-5)
        # draft_topk1: the top-1 id, probability 1 (as upstream's topk=1 paths), also in the chain buffer's column.
        p1, t1 = res[n, "top1"]
        assert torch.equal(t1, res[n, 1][1]) and torch.equal(p1, torch.ones_like(p1))
        assert torch.equal(res[n, "chain"][:, 1], t1.view(-1)) and bool((res[n, "chain"][:, [0, 2]] == -7).all())


@pytest.mark.parametrize("space", SPACES)
@pytest.mark.parametrize("batch", BATCHES)
def test_both_ranks_propose_the_same_tokens(runs, space, batch):
    _, got = runs
    r0, r1 = (_result(got, name, space, batch) for name in PROCS[:2])
    assert r0.keys() == r1.keys()
    for key in r0:
        pairs = zip(r0[key], r1[key]) if isinstance(r0[key], tuple) else [(r0[key], r1[key])]
        for a, b in pairs:  # (probabilities, ids) of draft_topk and draft_topk1, the chain buffer
            assert torch.equal(a, b), key  # bit for bit


@pytest.mark.parametrize("name, space, batch", list(_cases(PROCS[:2])))
def test_tp2_proposes_the_tp1_tokens(runs, name, space, batch):
    inp, got = runs
    one = _result(got, "tp1", space, batch)
    res = _result(got, name, space, batch)

    def logits(n, tokens):
        hidden = inp["hidden"] if n == 2 else inp["hidden"][::2]
        return torch.einsum("nkd,nd->nk", inp["weight"][tokens.view(hidden.shape[0], -1)], hidden)

    for key in one:
        if batch == "stock":
            # One rank's stock plan is EAGLE3's own top-k (torch's order among exactly tied logits; this test's
            # integer weights tie often), two ranks merge shards by the tie rule: the same best logits in order.
            t, t1 = (x if key[1] == "chain" else x[1] for x in (res[key], one[key]))
            if key[1] == "chain":
                t, t1 = t[:, 1], t1[:, 1]
            assert torch.equal(logits(key[0], t), logits(key[0], t1)), key
            continue
        if key[1] == "chain":
            assert torch.equal(res[key], one[key]), key
            continue
        (p, t), (p1, t1) = res[key], one[key]
        assert torch.equal(t, t1), key  # the same ids in the same order, ties included
        torch.testing.assert_close(p, p1, atol=1e-6, rtol=1e-5)  # a merged logsumexp vs one softmax
