"""The decode loop's own costs on CPU: the copied methods bound once (no package metadata read per
round), the compact topk=1 chain path (equal to the general path, fewer ops), the verify event's
top-k in place (no vocabulary-wide copy), the window's one-pass repeats, the prefill top-K chunk
(config key, validated) and the hidden states released after the prefill event.

Driven through ``sglang_specvocab.tools.bench.harness`` (the real DYNVOCAB worker methods over a toy
draft; see its doc) and the fake draft of ``test_integration_draft_loop``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

pytestmark = pytest.mark.sglang


class Ops(TorchDispatchMode):
    """Records every dispatched aten op: (name, is_view, output shapes)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        shapes = [tuple(o.shape) for o in outs if isinstance(o, torch.Tensor)]
        self.calls.append((func.overloadpacket.__name__, func.is_view, shapes))
        return out

    @property
    def launches(self) -> int:
        return sum(not view for _, view, _ in self.calls)


@pytest.fixture(scope="module")
def H(torchvision_standin):
    from sglang_specvocab.tools.bench import harness

    return harness


def dyn(H, **kw):
    shape = H.Shape(**kw)
    (r,) = H.build(shape, names=("DYNVOCAB",))
    return r


# --- the copies are bound once ---------------------------------------------------------------------


def test_copied_methods_are_bound_once_no_metadata_read_per_round(H, monkeypatch):
    import sglang_specvocab.copies as P
    from sglang_specvocab.integration import worker

    assert worker._DRAFT is P.load_copy("dynvocab_draft")
    assert worker._PREFILL is P.load_copy("dynvocab_worker")
    reads = []

    def version(name):
        reads.append(name)
        raise AssertionError("package metadata read inside the decode loop")

    monkeypatch.setattr(P.metadata, "version", version)
    for topk, nd in ((1, 4), (3, 6)):
        r = dyn(H, bs=3, topk=topk, steps=3, num_draft_tokens=nd)
        with H.stand_ins(r.inputs):
            out, nxt = r.round()
            r.prefill()
        assert out[2].shape == (3, nd - 1) and nxt.topk_index.shape == (3, topk)
    assert reads == []


# --- the topk=1 chain --------------------------------------------------------------------------------


def test_draft_topk1_equals_draft_topk_with_ties_and_dead_columns(H):
    r = dyn(H, bs=4, capacity=16)
    proc, table = r.stack.proc, r.stack.policy.table
    rows = torch.tensor([1, 2, 3, 4])
    table.assign(rows, torch.tensor([[5, 9, 2, -1], [7, -1, -1, -1], [1, 2, 3, 4], [8, 8, 6, -1]]))
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 16, generator=g)
    logits[2, :4] = 1.0  # a tie: the lowest column (smallest id) wins, as in draft_topk
    logits[1, 1:] = float("-inf")  # a one-id set
    logits[0, 3:] = float("-inf")
    logits[3, 2:] = float("-inf")
    p, idx = proc.draft_topk1(logits, rows)
    _, want = proc.draft_topk(logits, 1, rows)
    assert torch.equal(idx, want) and idx.dtype == torch.int64 and idx.shape == (4, 1)
    assert torch.equal(p, torch.ones(4, 1))
    chain = torch.full((4, 3), -7, dtype=torch.int64)
    proc.draft_topk1(logits, rows, chain, 2)
    assert torch.equal(chain[:, 2], want.view(-1)) and bool((chain[:, :2] == -7).all())


@pytest.mark.parametrize("batch", ["union-indexed", "union-gemm", "stock"])
def test_draft_topk1_equals_draft_topk_in_every_batch_mode(H, batch):
    r = dyn(H, bs=4, capacity=16, batch=batch)
    proc, table = r.stack.proc, r.stack.policy.table
    rows = torch.tensor([1, 2, 3, 4])
    table.assign(rows, torch.tensor([[5, 9, 2, -1], [7, -1, -1, -1], [1, 2, 3, 4], [8, 8, 6, -1]]))
    hidden = torch.randn(4, proc.dv_head.weight.shape[1], generator=torch.Generator().manual_seed(1))
    out = proc.dv_head(hidden, rows)
    logits = out.logits
    assert out.plan == batch
    _, want = proc.draft_topk(logits, 1, rows)
    assert torch.equal(proc.draft_topk1(logits, rows)[1], want)


def _general_topk1(proc):
    """The general path's top-1 (``draft_topk`` with k = 1) in ``draft_topk1``'s signature."""

    def topk1(logits, rows, chain=None, column=0):
        p, idx = proc.draft_topk(logits, 1, rows)
        if chain is not None:
            chain[:, column].copy_(idx.view(-1))
        return p, idx

    return topk1


@pytest.mark.parametrize("steps", [1, 2, 4])
def test_chain_path_equals_general_path_and_launches_fewer_ops(H, steps):
    runs = {}
    for path in ("chain", "general"):
        r = dyn(H, bs=5, topk=1, steps=steps, num_draft_tokens=steps + 1, seed=3)
        w = r.stack.draft_worker
        if path == "general":  # before the chain path: select_top_k_tokens every step, draft_topk(k=1)
            w._topk1_parents_prealloc = w._topk1_parents_prealloc[:0]  # the chain buffers do not fit: organize
            r.stack.proc.draft_topk1 = _general_topk1(r.stack.proc)
        with H.stand_ins(r.inputs):
            r.prefill()  # seeds the sets from the prompts
            with Ops() as ops:
                out = r.draft()
        runs[path] = (out, ops.launches, r)
    (cp, cs, ct, cprobs), chain_ops, rc = runs["chain"]
    (gp, gs, gt, gprobs), general_ops, _ = runs["general"]
    assert torch.equal(ct, gt) and ct.shape == (5, steps)
    assert torch.equal(cp, gp) and torch.equal(cs, gs) and cprobs is None and gprobs is None
    for b, row in enumerate(rc.inputs.rows.tolist()):  # every draft token after the first is in the set
        assert set(ct[b, 1:].tolist()) <= set(rc.stack.policy.table.row(row))
    if steps > 1:
        assert chain_ops < general_ops, (chain_ops, general_ops)


def test_decode_extend_topk1_is_the_argmax_over_the_set(H):
    r = dyn(H, bs=4, topk=1, steps=3, num_draft_tokens=4, seed=5)
    with H.stand_ins(r.inputs):
        r.prefill()
        r.verify()
        nxt = r.extend()
    assert torch.equal(nxt.topk_p, torch.ones(4, 1))
    toy, res = r.stack.runner.toy, r.result
    table, nd = r.stack.policy.table, 4
    for b, row in enumerate(r.inputs.rows.tolist()):
        m = b * nd + int(res.accept_lens[b]) - 1
        h = torch.tanh(res.logits_output.hidden_states[m] @ toy.A + toy.E[int(res.next_token_ids[m])])
        ranked = sorted(table.row(row), key=lambda v, h=h: (-float(h @ toy.W[v]), v))
        assert nxt.topk_index[b].tolist() == ranked[:1]


# --- verify: top-k in place -------------------------------------------------------------------------


@pytest.mark.parametrize("nd,steps,compacted", [(4, 3, False), (8, 3, True), (12, 5, True)])
def test_verify_event_never_copies_vocabulary_rows(nd, steps, compacted):
    from sglang_specvocab.integration.events import verify_event

    bs, V, k = 3, 500, 4
    g = torch.Generator().manual_seed(nd)
    lens = torch.tensor([1, steps + 1, 2], dtype=torch.int32)
    width = steps + 1
    cols = torch.arange(width)
    index = torch.where(cols[None, :] < lens[:, None], torch.arange(bs)[:, None] * nd + cols[None, :] * 2 % nd, -1)
    logits = torch.randn(bs * nd, V, generator=g)
    predict = torch.randint(0, V, (bs * nd,), generator=g).to(torch.int32)
    with Ops() as ops:
        _, vt, acc = verify_event(
            torch.zeros(bs * nd, dtype=torch.int64),
            index.to(torch.int32),
            lens,
            predict,
            logits,
            num_draft_tokens=nd,
            k=k,
            compacted=compacted,
        )
    topk = [shapes for name, _, shapes in ops.calls if name == "topk"]
    assert topk == [[(bs * nd, k), (bs * nd, k)]]  # the one op that reads the logits: top-k in place
    assert all(V not in s for _, view, shapes in ops.calls if not view for s in shapes)  # no [., V] copy
    for b in range(bs):
        for j in range(width):
            if j < int(lens[b]):
                row = int(index[b, j])
                assert vt[b, j].tolist() == logits[row].topk(k).indices.tolist()
                assert int(acc[b, j]) == int(predict[b * nd + j] if compacted else predict[row])
            else:
                assert vt[b, j].tolist() == [-1] * k and int(acc[b, j]) == -1


# --- the window's round: repeats become holes in one pass -------------------------------------------


def test_distinct_segments_is_unique_first_per_segment_with_holes():
    from sglang_specvocab.table import distinct_segments, unique_first

    g = torch.Generator().manual_seed(1)
    for n1, n2 in ((6, 12), (1, 9), (8, 0)):
        a = torch.randint(-1, 5, (4, n1), generator=g)
        b = torch.randint(-1, 5, (4, n2), generator=g)
        segments = [a, b] if n2 else [a]
        got = distinct_segments(segments)
        want = torch.cat([unique_first(s) for s in segments], dim=1)
        for row_got, row_want in zip(got.tolist(), want.tolist(), strict=True):
            assert [v for v in row_got if v >= 0] == [v for v in row_want if v >= 0]
        # repeats of the other segment are kept: each segment is deduplicated on its own
        assert got.shape == (4, n1 + n2)


# --- prefill: the top-K chunk, validated; hidden states released -------------------------------------


@pytest.mark.parametrize("bad", [0, 65537, "512", True, 2.5])
def test_prefill_chunk_is_validated(bad):
    from sglang_specvocab.errors import ConfigError
    from sglang_specvocab.policies import parse_config

    with pytest.raises(ConfigError) as info:
        parse_config({"policy": "window", "capacity": 8, "prefill_chunk": bad})
    msg = str(info.value)
    assert "prefill_chunk" in msg and (repr(bad) in msg or str(bad) in msg), msg


@pytest.mark.parametrize("chunk", [5, 64])
def test_prefill_top_k_runs_in_chunks_of_the_config_and_releases_hidden_states(H, chunk, monkeypatch):
    from sglang_specvocab.integration import events

    r = dyn(H, bs=3, prompt_len=20, prefill_chunk=chunk)
    seen = []
    real = events._chunked_topk

    def spy(hidden, lm_head, k, chunk_, vocab_size):
        def head(h):
            seen.append(h.shape[0])
            return h.to(lm_head.dtype) @ lm_head.T

        return real(hidden, head, k, chunk_, vocab_size)

    monkeypatch.setattr(events, "_chunked_topk", spy)
    outputs = []
    target = r.stack.target
    forward = target.forward_batch_generation

    def keep(*a, **kw):
        outputs.append(forward(*a, **kw))
        return outputs[-1]

    target.forward_batch_generation = keep
    with H.stand_ins(r.inputs):
        r.prefill()
    assert max(seen) == min(chunk, 60) and sum(seen) == 60
    assert outputs[0].logits_output.last_hidden_states is None  # released after the prefill event
    # and the policy saw every position's top-K: the window holds the last ids of each prompt
    table = r.stack.policy.table
    assert all(table.cnt[row] > 1 for row in (1, 2, 3))


def test_stand_ins_restore_sglang(H):
    from sglang.srt.speculative import eagle_worker_v2 as ew

    before = (ew.get_spec, ew.run_eagle_verify, ew.prepare_for_draft_extend, ew.ForwardBatch)
    with H.stand_ins(SimpleNamespace(verify_result=lambda: None)):
        assert ew.run_eagle_verify is not before[1]
    assert (ew.get_spec, ew.run_eagle_verify, ew.prepare_for_draft_extend, ew.ForwardBatch) == before


# --- --speculative-adaptive: SGLang's own controller switching DYNVOCAB's draft worker ----------------


class Context:
    """SGLang's runtime context as the adaptive code reads and writes it (``get_spec``/``get_exec``/
    ``get_schedule``/``get_context().override``), over plain values."""

    def __init__(self, steps, max_bs):
        self.spec = SimpleNamespace(
            speculative_num_steps=steps,
            speculative_num_draft_tokens=steps + 1,
            speculative_use_rejection_sampling=False,
            speculative_adaptive=True,
            speculative_adaptive_config=None,
        )
        self.graph = SimpleNamespace(cuda_graph_bs_decode=None, disable_cuda_graph=True, cuda_graph_config=None)
        self.schedule = SimpleNamespace(max_running_requests=max_bs, page_size=1)
        self.overrides = []

    def override(self, source, **fields):
        self.overrides.append((source, fields))
        for key, value in fields.items():
            for bag in (self.spec, self.graph):
                if hasattr(bag, key):
                    setattr(bag, key, value)

    def install(self, monkeypatch, ew):
        from sglang.srt.speculative import base_spec_worker as bsw

        for mod in (ew, bsw):
            monkeypatch.setattr(mod, "get_spec", lambda: self.spec, raising=False)
            monkeypatch.setattr(mod, "get_exec", lambda: SimpleNamespace(graph=self.graph), raising=False)
            monkeypatch.setattr(mod, "get_schedule", lambda: self.schedule, raising=False)
        monkeypatch.setattr(ew, "get_context", lambda: self)
        # no GPU: no target verify graph to capture, no device memory to read
        monkeypatch.setattr(ew, "check_cuda_graph_backend", lambda phase, backend: True)
        monkeypatch.setattr(ew, "get_available_gpu_memory", lambda device, gpu_id: 0.0)


def adaptive_worker(H, monkeypatch, bs):
    from sglang.srt.speculative import eagle_worker_v2 as ew
    from sglang.srt.speculative.adaptive_runtime_state import AdaptiveController
    from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams

    r = dyn(H, bs=bs, topk=1, steps=3, num_draft_tokens=4, seed=7)
    w, dw = r.stack.worker, r.stack.draft_worker
    ctx = Context(3, max_bs=bs)
    dw.server_args = None
    ctx.install(monkeypatch, ew)
    captured = []

    def init_attention_backend():  # a backend per state, as SGLang's DraftBackendFactory builds
        dw.draft_attn_backend = SimpleNamespace(
            attn_backends=[f"s{dw.speculative_num_steps}.{i}" for i in range(max(dw.speculative_num_steps, 1))]
        )
        dw.draft_extend_attn_backend = None

    def capture_cuda_graphs():  # what a capture sees: the state's steps and its chain buffers
        captured.append(
            (
                dw.speculative_num_steps,
                dw.speculative_num_draft_tokens,
                None if dw._topk1_score_indices_prealloc is None else tuple(dw._topk1_score_indices_prealloc.shape),
            )
        )
        dw.cuda_graph_runner = f"graph-{dw.speculative_num_steps}"
        dw.cuda_graph_runner_for_draft_extend = None

    monkeypatch.setattr(dw, "init_attention_backend", init_attention_backend)
    monkeypatch.setattr(dw, "_capture_cuda_graphs", capture_cuda_graphs)
    dw.cuda_graph_runner = dw.draft_extend_attn_backend = None
    dw.draft_runner.draft_attn_backend = dw.draft_runner.attn_backend = dw.draft_attn_backend
    w.server_args, w.gpu_id = None, 0
    w._additional_graph_memory_usage, w._additional_graph_time_usage = {}, {}
    target_runner = w._target_worker.model_runner
    target_runner.attn_backend, target_runner.decode_cuda_graph_runner = "target-attn", None
    target_runner.init_new_workspace = False
    target_runner._get_attention_backend = lambda init_new_workspace: f"target-attn-{w.speculative_num_steps}"
    w.adaptive_controller = AdaptiveController(w, AdaptiveSpeculativeParams(initial_steps=3))
    return r, w, dw, ctx, captured


def test_adaptive_states_switch_steps_chain_buffers_and_zero_steps(H, monkeypatch):
    """SGLang's AdaptiveController, AdaptiveSpeculativeParams (the default per-batch-size config),
    SpecRuntimeState and EAGLEWorkerV2's build/apply of runtime states, over DYNVOCAB's draft worker:
    every state is built with its own steps and chain buffers, a batch-size switch changes the steps,
    the chain buffers and the graph runner, and a DYNVOCAB round runs at each (0 steps: verify only)."""
    from sglang.srt.speculative.adaptive_spec_params import resolve_candidate_steps_from_config
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2, SpecRuntimeState

    bs = 4
    r, w, dw, ctx, captured = adaptive_worker(H, monkeypatch, bs)
    with H.stand_ins(r.inputs):
        monkeypatch.setattr(H.ew, "get_spec", lambda: ctx.spec)  # one view of the spec bag inside stand_ins too
        r.prefill()
        # as EAGLEWorkerV2.init_cuda_graphs: the current state, then SGLang builds one per candidate step count
        ctrl = w.adaptive_controller
        ctrl.register(
            SpecRuntimeState(3, 4, dw.draft_attn_backend, dw.cuda_graph_runner, "target-attn", None, None, None)
        )
        ctrl.init_states(cuda_graph_bs=None)
        steps_all = resolve_candidate_steps_from_config(None)
        assert sorted(ctrl._states) == steps_all and 0 in steps_all
        # each state was captured with its own steps and chain buffers (no chain for 0 steps' width 0)
        assert sorted(c[0] for c in captured) == [s for s in steps_all if s != 3]
        for steps, nd, shape in captured:
            assert nd == steps + 1 and shape == (bs, steps)  # rows: max_running_requests
        assert (w.speculative_num_steps, dw.speculative_num_steps) == (3, 3)  # restored after the builds
        assert EAGLEWorkerV2.apply_runtime_state is type(w).apply_runtime_state  # SGLang's switch, unchanged

        seen = {}
        for batch_size in (1, 32, 64, 8):  # default config: bs 1 -> 3 steps, 32 -> 1, 64 -> 0, 8 -> 3
            w.activate_step_by_batch(batch_size)
            steps = w.speculative_num_steps
            assert dw.speculative_num_steps == steps and w.speculative_num_draft_tokens == steps + 1
            assert dw.cuda_graph_runner == (None if steps == 3 else f"graph-{steps}")
            assert dw._topk1_score_indices_prealloc.shape[1] == steps
            assert dw._topk1_parents_prealloc.shape[1] == (steps if steps > 1 else 0)
            if steps > 0:
                table = r.stack.policy.table
                sets = {row: set(table.row(row)) for row in r.inputs.rows.tolist()}  # what the round drafts from
                out, nxt = r.round()
                parents, scores, tokens, _ = out
                assert parents.shape == (bs, steps if steps > 1 else 0)
                assert tokens.shape == (bs, steps) and scores.shape == (bs, steps)
                for b, row in enumerate(r.inputs.rows.tolist()):
                    assert set(tokens[b, 1:].tolist()) <= sets[row]
            else:  # SGLang skips the draft at 0 steps and verifies the bonus token alone (nd = 1)
                res = r.verify()
                assert res.accept_index.shape == (bs, 1)
                nxt = r.extend()
            assert nxt.topk_index.shape == (bs, 1)
            seen[batch_size] = steps
        assert seen == {1: 3, 32: 1, 64: 0, 8: 3}
        assert ctx.overrides[-1][1]["speculative_num_steps"] == 3
