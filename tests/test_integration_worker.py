"""The DYNVOCAB worker's GPU wiring on CPU, with SGLang's GPU parts faked: the verify override (policy
table == the literal window, chain and tree rounds; telemetry coverage taken before the update),
the prefill event with slot reuse (policy row and telemetry reset), the finished-request report,
the stepwise select inputs, and the copied methods (loadable by path, signatures recorded)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from helpers import (
    GenerationPool,
    Mode,
    compact_accepted,
    literal_event,
    sglang_req,
    sglang_round,
    window_config,
)
from literal import LiteralWindow

pytestmark = pytest.mark.sglang

NUM_ROWS, V = 9, 60


@pytest.fixture(scope="module")
def W(torchvision_standin):
    from sglang_specvocab.integration import worker

    return worker


class FakeEvent:
    """A CUDA event stand-in: ``done`` says whether the copy it follows has finished."""

    def __init__(self, done=True):
        self.done, self.waited = done, False

    def query(self):
        return self.done

    def synchronize(self):
        self.waited, self.done = True, True


def mirrored_telemetry(num_rows, done=True):
    """``Telemetry`` with its GPU host mirror on CPU: plain host buffers, fake events (``events`` lists them)."""
    from sglang_specvocab.integration.telemetry import Telemetry

    class Mirrored(Telemetry):
        def _host_buffer(self):
            return torch.full(self.all.shape, float("nan"), dtype=self.all.dtype)

        def _host_counts_buffer(self, n):
            return torch.full((n,), -1, dtype=torch.int64)  # -1: never published

        def _new_event(self):
            self.events.append(FakeEvent(done))
            return self.events[-1]

    t = Mirrored.__new__(Mirrored)
    t.events = []
    Telemetry.__init__(t, num_rows, mirror=True)
    return t


def make_worker(W, monkeypatch, policy, *, topk, nd, results=None):
    from sglang_specvocab.integration.telemetry import Gauges

    w = object.__new__(W.DynVocabWorkerV2)
    # the GPU path of the telemetry: summaries read what verify published
    w._draft_worker = SimpleNamespace(dynvocab_policy=policy, dynvocab_telemetry=mirrored_telemetry(NUM_ROWS))
    w._target_worker = SimpleNamespace(model_runner=SimpleNamespace(model_config=SimpleNamespace(vocab_size=V)))
    w.topk, w.speculative_num_draft_tokens = topk, nd
    w._dv_seen = w._dv_fed = None
    w._dv_live, w._dv_row_rid = {}, {}
    w.dynvocab_gauges = Gauges(False)
    calls = []

    def fake_verify(self, batch, pp_proxy_tensors=None, grammar_barrier=None):
        calls.append(batch)
        batch.spec_info = "replaced by verify"  # the override must have read it before
        return results.pop(0)

    monkeypatch.setattr(W.EAGLEWorkerV2, "verify", fake_verify)
    return w, calls


def verify_result(rnd, compacted):
    predict = compact_accepted(rnd["predict"], rnd["accept_index"], rnd["nd"]) if compacted else rnd["predict"]
    return SimpleNamespace(
        logits_output=SimpleNamespace(next_token_logits=rnd["logits"].float()),
        accept_index=rnd["accept_index"],
        accept_lens=rnd["accept_lens"],
        next_token_ids=predict,
    )


@pytest.mark.parametrize("chain", [True, False])
def test_verify_updates_policy_as_literal_window_and_telemetry(W, monkeypatch, chain):
    from sglang_specvocab.policies import build_policy

    cap, k = 14, 3
    pol = build_policy(window_config(cap, 2, k), num_rows=NUM_ROWS, fallback_id=0)
    gen = torch.Generator().manual_seed(3 + chain)
    nd, steps, topk = (5, 4, 1) if chain else (8, 4, 3)
    rounds = [sglang_round(gen, 3, nd, steps, V, chain, accept_depths=[r, 4 - r, 2]) for r in range(4)]
    w, calls = make_worker(
        W, monkeypatch, pol, topk=topk, nd=nd, results=[verify_result(r, compacted=topk > 1) for r in rounds]
    )
    rows = torch.tensor([5, 2, 7])
    lit = {r: LiteralWindow(cap, 2, k, ["context", "extension"]) for r in rows.tolist()}
    want = {r: [0.0, 0, 0, 0] for r in rows.tolist()}  # set_sum, rounds, in_set, committed
    for no, rnd in enumerate(rounds):
        for r, (_, _, committed) in zip(rows.tolist(), literal_event(rnd, k), strict=True):
            active = set(pol.table.row(r))  # the set the round drafted from (before on_verify)
            want[r][0] += len(active)
            want[r][1] += 1
            want[r][2] += sum(t in active for t in committed)
            want[r][3] += len(committed)
        batch = SimpleNamespace(
            spec_info=SimpleNamespace(draft_token=rnd["draft_token"]), req_pool_indices=rows, forward_mode=Mode()
        )
        res = w.verify(batch)
        assert res is not None and calls[-1] is batch
        for r, (drafts, vt, _) in zip(rows.tolist(), literal_event(rnd, k), strict=True):
            lit[r].verify(drafts, vt)
            assert pol.table.row(r) == lit[r].active(), f"row {r}, round {no}"
    t = w.dynvocab_telemetry
    for r in rows.tolist():
        assert [float(t.set_sum[r]), int(t.rounds[r]), int(t.in_set[r]), int(t.committed[r])] == want[r]
        size, cov = t.summary(r)
        assert size == pytest.approx(want[r][0] / want[r][1]) and cov == pytest.approx(want[r][2] / want[r][3])
    assert int(t.rounds[0]) == 0  # untouched rows stay zero


def test_idle_and_empty_batches_are_skipped(W, monkeypatch):
    from sglang_specvocab.policies import build_policy

    pol = build_policy(window_config(10, 2, 2), num_rows=NUM_ROWS, fallback_id=0)
    before = pol.table.ids.clone()
    w, calls = make_worker(W, monkeypatch, pol, topk=1, nd=4, results=["idle", "empty"])
    idle = SimpleNamespace(spec_info=None, req_pool_indices=torch.zeros(0, dtype=torch.int64), forward_mode=Mode(True))
    assert w.verify(idle) == "idle"
    empty = SimpleNamespace(spec_info=None, req_pool_indices=torch.zeros(0, dtype=torch.int64), forward_mode=Mode())
    assert w.verify(empty) == "empty"
    assert len(calls) == 2 and torch.equal(pol.table.ids, before)
    assert int(w.dynvocab_telemetry.rounds.sum()) == 0


# --- prefill, slot reuse, finished-request report -------------------------------------------------


def prefill_batch(reqs, ids, prefix_lens, extend_lens):
    return SimpleNamespace(
        reqs=reqs,
        input_ids=torch.tensor(ids),
        req_pool_indices=torch.tensor([r.kv.req_pool_idx for r in reqs]),
        extend_lens=list(extend_lens),
        prefix_lens=list(prefix_lens),
        forward_mode=Mode(),
    )


def test_prefill_slot_reuse_and_report(W, monkeypatch):
    from sglang_specvocab.integration.telemetry import COVERAGE_KEY, SET_SIZE_KEY, UNSEEDED_KEY
    from sglang_specvocab.policies import build_policy

    H, k, cap = 8, 2, 30
    gen = torch.Generator().manual_seed(9)
    weight = torch.randn(V, H, generator=gen, dtype=torch.float64)
    pol = build_policy(window_config(cap, k, k), num_rows=NUM_ROWS, fallback_id=0)
    w, _ = make_worker(W, monkeypatch, pol, topk=1, nd=4)
    w.req_to_token_pool = GenerationPool(NUM_ROWS)
    w._draft_worker.dynvocab_target_head = W.prefill_head(SimpleNamespace(weight=weight, tp_size=1), None)

    def req(rid, row, prompt, extend_end=None):
        return sglang_req(rid, row, prompt, extend_end=extend_end)

    def run(batch):
        n = batch.input_ids.numel()
        hidden = torch.randn(n, H, generator=gen, dtype=torch.float64)
        out = SimpleNamespace(logits_output=SimpleNamespace(last_hidden_states=hidden))
        w.dynvocab_prefill(batch, out)
        assert out.logits_output.last_hidden_states is None  # released once the top-K is taken
        return hidden

    p1 = torch.randint(0, V, (7,), generator=gen).tolist()
    w.req_to_token_pool.alloc(4)
    a = req("a", 4, p1)
    hidden = run(prefill_batch([a], p1, [0], [7]))
    lw = LiteralWindow(cap, k, k, ["context", "extension"])
    topk = [sorted(range(V), key=lambda v, h=h: -float(h @ weight[v]))[:k] for h in hidden]
    lw.prefill(p1, topk)
    assert pol.table.row(4) == lw.active()

    # one verify round's telemetry, then the request finishes: one report, on the request and the gauges
    t = w.dynvocab_telemetry
    t.record_verify(pol.table, torch.tensor([4]), torch.tensor([[p1[0], V - 1 if V - 1 not in lw.active() else -1]]))
    t.publish()  # as the verify override does
    gauges = []
    w.dynvocab_gauges = SimpleNamespace(update=lambda s, c: gauges.append((s, c)), update_counts=gauges.append)
    w.note_request_finished(rid="a", natural_stop=True)
    size, cov = len(lw.active()), 1 / int(t.committed[4])
    assert a.customized_info == {
        SET_SIZE_KEY: [pytest.approx(size)],
        COVERAGE_KEY: [pytest.approx(cov)],
        UNSEEDED_KEY: [0],
    }
    assert gauges == [(pytest.approx(size), pytest.approx(cov)), {}]  # no counters watched by this worker
    w.note_request_finished(rid="a", natural_stop=True)  # twice (or unknown rid): no second report
    assert len(gauges) == 2

    # the slot is re-used by a new request with a 3-token radix hit: row and telemetry reset, hit seeded from ids
    w.req_to_token_pool.alloc(4)
    p2 = torch.randint(0, V, (6,), generator=gen).tolist()
    more = torch.randint(0, V, (2,), generator=gen).tolist()  # the prompt's second chunk
    b = req("b", 4, p2 + more, extend_end=6)
    hidden = run(prefill_batch([b], p2[3:], [3], [3]))
    assert int(t.rounds[4]) == 0 and int(t.committed[4]) == 0 and float(t.set_sum[4]) == 0
    assert t.unseeded_positions(4) == 3, t.acc[:, 4]
    lw = LiteralWindow(cap, k, k, ["context", "extension"])
    topk = [sorted(range(V), key=lambda v, h=h: -float(h @ weight[v]))[:k] for h in hidden]
    lw.prefill(p2, topk)
    assert pol.table.row(4) == lw.active()
    assert w._dv_live["b"][0] == 4 and "a" not in w._dv_live

    # a second chunk of b (same row, same generation): no reset, appended
    b.extend_end = 8
    hidden = run(prefill_batch([b], more, [6], [2]))
    lw.prefill(more, [sorted(range(V), key=lambda v, h=h: -float(h @ weight[v]))[:k] for h in hidden])
    assert pol.table.row(4) == lw.active()
    assert w.dynvocab_report("b") is not None and math.isnan(b.customized_info[SET_SIZE_KEY][0])  # no rounds yet
    assert b.customized_info[UNSEEDED_KEY] == [3]  # the 3-token radix hit had no top-K


def test_telemetry_summary_reads_the_newest_finished_copy():
    """On a GPU the summary never reads the live accumulators: the newest published copy that has
    finished, waiting only when none has; a reset row is published as zeros."""
    t = mirrored_telemetry(4, done=False)
    assert all(math.isnan(v) for v in t.summary(2))  # nothing published yet
    rows = torch.tensor([2])

    def round_(size, hits, committed):
        t.record(rows, torch.tensor([float(size)]), torch.tensor([hits]), torch.tensor([committed]))
        t.publish()

    round_(10, 1, 2)
    assert t.summary(2) == (10.0, 0.5) and t.events[0].waited  # none finished: waited for it
    round_(20, 2, 2)  # second buffer, its copy not finished: the first one is read, no wait
    assert t.summary(2) == (10.0, 0.5) and not t.events[1].waited
    t.events[1].done = True
    assert t.summary(2) == (15.0, 0.75)
    round_(30, 0, 2)  # overwrites the first buffer; unfinished, so the second is read
    assert t.summary(2) == (15.0, 0.75) and not t.events[2].waited
    t.events[2].done = True
    assert t.summary(2) == pytest.approx((20.0, 0.5))
    t.reset(rows)  # published: a new request in the slot never reads the old one's numbers
    t.events[-1].done = True
    assert all(math.isnan(v) for v in t.summary(2))
    assert float(t.acc.abs().sum()) == 0


@pytest.mark.gpu  # pinned memory and CUDA events
def test_telemetry_mirror_on_cuda():
    from sglang_specvocab.integration.telemetry import Telemetry

    t = Telemetry(8, device="cuda")
    assert t.mirror and all(h.is_pinned() for h in t._host)
    rows = torch.tensor([3, 5], device="cuda")
    for size in (100.0, 200.0):
        t.record(
            rows,
            torch.full((2,), size, device="cuda"),
            torch.tensor([1, 2], device="cuda"),
            torch.tensor([2, 2], device="cuda"),
        )
        t.publish()
    torch.cuda.synchronize()
    assert t.summary(3) == (150.0, 0.5) and t.summary(5) == (150.0, 1.0)


def test_counters_are_read_from_the_published_copy():
    """A watched device counter reaches the host only through publish: counts() reads the newest finished copy
    (zeros before any), never the live tensor; a source may rebind its tensor (read at each publish)."""
    t = mirrored_telemetry(4)
    owner = SimpleNamespace(n=torch.zeros((), dtype=torch.int64))
    fixed = torch.zeros(1, dtype=torch.int64)
    t.watch("rebound", lambda: owner.n)
    t.watch("fixed", lambda: fixed)
    t.watch("absent", lambda: None)
    assert t.counts() == {"rebound": 0, "fixed": 0, "absent": 0}  # nothing published yet
    owner.n += 3
    fixed += 7
    t.publish()
    assert t.counts() == {"rebound": 3, "fixed": 7, "absent": -1}  # absent: never copied
    owner.n = owner.n + 2  # rebound, and not published yet
    fixed += 1
    assert t.counts() == {"rebound": 3, "fixed": 7, "absent": -1}
    t.events[-1].done = True
    t.publish()
    t.events[-1].done = False  # the newest copy unfinished: the previous one is read
    assert t.counts()["rebound"] == 3
    t.events[-1].done = True
    assert t.counts() == {"rebound": 5, "fixed": 8, "absent": -1}


def test_counters_off_gpu_are_read_directly():
    from sglang_specvocab.integration.telemetry import Telemetry

    t = Telemetry(4)
    n = torch.zeros((), dtype=torch.int64)
    t.watch("n", lambda: n)
    n += 4
    assert t.counts() == {"n": 4}


def test_init_warns_once_and_the_report_exports_the_head_counters(W, monkeypatch, caplog):
    """No runtime context: the gauges are off and the log says why, once per process. With a head, the worker
    watches its counters: a table row with a bad count is counted on the device by the head's op, published with the
    telemetry and handed to the gauges when a request finishes."""
    from sglang_specvocab import ops
    from sglang_specvocab.head import DraftHead, head_options
    from sglang_specvocab.integration.telemetry import BAD_ENTRIES, UNION_OVERFLOW, Gauges
    from sglang_specvocab.table import CandidateTable

    def no_context():
        raise ValueError("config namespace 'observability' not published")

    monkeypatch.setattr(W, "get_observability", no_context)
    monkeypatch.setattr(W, "_warned_no_gauges", False)
    table = CandidateTable(NUM_ROWS, 4, fallback_id=0)
    table.cnt[5] = 0  # a policy bug: slot 5 has no live id
    head = DraftHead(torch.randn(V, 8), table, head=head_options(kernel="torch", batch="per-request"))
    telemetry = mirrored_telemetry(NUM_ROWS)
    w = object.__new__(W.DynVocabWorkerV2)
    w._draft_worker = SimpleNamespace(
        dynvocab_policy=None, dynvocab_telemetry=telemetry, dynvocab_proc=SimpleNamespace(dv_head=head)
    )
    with caplog.at_level("WARNING", logger=W.__name__):
        w._init_dynvocab_state(SimpleNamespace())
        w._init_dynvocab_state(SimpleNamespace())
    warnings = [r for r in caplog.records if "no Prometheus gauges" in r.getMessage()]
    assert len(warnings) == 1 and "observability' not published" in warnings[0].getMessage()
    assert isinstance(w.dynvocab_gauges, Gauges) and w.dynvocab_gauges.set_size is None

    before = int(ops.bad_entries("cpu"))
    head(torch.randn(3, 8), torch.tensor([1, 5, 2]))  # one hidden row reads slot 5
    head.union_overflow += 2  # as two overflowing union calls would
    telemetry.publish()
    counts = []
    w.dynvocab_gauges = SimpleNamespace(update=lambda s, c: None, update_counts=counts.append)
    w._dv_live, w._dv_row_rid = {"r": (5, None)}, {5: "r"}
    w.dynvocab_report("r")
    assert counts == [{BAD_ENTRIES: before + 1, UNION_OVERFLOW: 2}]


def test_gauges_export_the_counters():
    from prometheus_client import REGISTRY

    from sglang_specvocab.integration.telemetry import BAD_ENTRIES, UNION_OVERFLOW, Gauges

    gauges = Gauges(True, {"model_name": "counted"})
    gauges.update_counts({BAD_ENTRIES: 3, UNION_OVERFLOW: 11, "other": 1})
    labels = {"model_name": "counted"}
    assert REGISTRY.get_sample_value("sglang:dynvocab_bad_table_entries", labels) == 3
    assert REGISTRY.get_sample_value("sglang:dynvocab_union_overflow", labels) == 11
    Gauges(False).update_counts({BAD_ENTRIES: 1})  # metrics off: nothing to set


def test_dense_policy_telemetry_counts_the_vocabulary():
    from sglang_specvocab.integration.telemetry import Telemetry

    t = Telemetry(4)
    t.record_verify(None, torch.tensor([2]), torch.tensor([[5, 6, -1]]), vocab_size=100)
    assert t.summary(2) == (100.0, 1.0)
    t.reset(torch.tensor([2]))
    s, c = t.summary(2)
    assert math.isnan(s) and math.isnan(c)


def test_request_level_keys(W):
    from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer

    from sglang_specvocab.integration.telemetry import KEYS, install_request_level_keys

    install_request_level_keys()
    install_request_level_keys()  # idempotent: wrapped once
    fn = SchedulerOutputStreamer.is_request_level_customized_info_key
    assert not hasattr(fn.__wrapped__, "__wrapped__")
    streamer = object.__new__(SchedulerOutputStreamer)
    assert all(streamer.is_request_level_customized_info_key(k) for k in KEYS)
    assert not streamer.is_request_level_customized_info_key("other")


# --- stepwise select inputs -------------------------------------------------------------------------


def test_stepwise_inputs_layouts(W):
    d, bs = 4, 3
    rows = torch.tensor([5, 2, 7])
    hidden = torch.arange(bs * 2 * d, dtype=torch.float32).view(bs * 2, d)
    ids = torch.arange(100, 100 + bs * 2)
    h, t = W.stepwise_inputs("decode", hidden, ids, rows)  # topk = 2 beams per request
    assert h.shape == (bs, 2, d) and t.tolist() == [[100, 101], [102, 103], [104, 105]]
    assert torch.equal(h[1, 0], hidden[2])
    # prefill extend: one pruned row per request, the token at each request's last position
    ext = torch.tensor([3, 1, 2])
    ids = torch.arange(200, 206)
    h, t = W.stepwise_inputs("extend", hidden[:bs], ids, rows, extend_seq_lens=ext)
    assert h.shape == (bs, 1, d) and t.view(-1).tolist() == [202, 203, 205]
    # decode draft extend, graph path: pruned to select_index
    sel = torch.tensor([1, 4, 6])
    ids = torch.arange(300, 309)
    h, t = W.stepwise_inputs("draft_extend", hidden[:bs], ids, rows, select_index=sel)
    assert t.view(-1).tolist() == [301, 304, 306] and torch.equal(h[:, 0], hidden[:bs])
    # eager path: all num_draft_tokens rows per request, the last accepted one taken
    nd = 3
    full = torch.randn(bs * nd, d)
    acc = torch.tensor([2, 1, 3])
    h, t = W.stepwise_inputs("draft_extend", full, ids, rows, num_accept_tokens=acc)
    assert t.view(-1).tolist() == [301, 303, 308] and torch.equal(h[:, 0], full[[1, 3, 8]])


def test_stepwise_inputs_meta_device_no_sync(W):
    meta = torch.device("meta")
    rows = torch.empty(4, dtype=torch.int64, device=meta)
    h, t = W.stepwise_inputs(
        "decode", torch.empty(8, 16, device=meta), torch.empty(8, dtype=torch.int64, device=meta), rows
    )
    assert h.shape == (4, 2, 16) and t.shape == (4, 2)
    h, t = W.stepwise_inputs(
        "draft_extend",
        torch.empty(12, 16, device=meta),
        torch.empty(12, dtype=torch.int64, device=meta),
        rows,
        num_accept_tokens=torch.empty(4, dtype=torch.int64, device=meta),
    )
    assert h.shape == (4, 1, 16) and t.shape == (4, 1)


# --- copied methods: in copies/from-sglang/, loadable by path, signatures recorded ---------------------


COPIES = {
    "dynvocab_draft": {
        "draft_forward": "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft_forward",
        "draft_extend_for_prefill": "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_prefill",
        "draft_extend_for_decode": "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_decode",
    },
    "dynvocab_worker": {
        "forward_prefill_batch": "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2._forward_prefill_batch",
    },
    "eagle_worker_v2": {"worker_init": "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.__init__"},
}


def test_copied_methods_load_by_path_and_signatures_are_recorded(W):
    import inspect
    import pkgutil

    import sglang_specvocab.copies as P

    folder = P.COPIES_DIR
    recorded = P.recorded_signatures()["WORKER"]
    for module, funcs in COPIES.items():
        assert (folder / f"{module}.py").is_file()
        mod = P.load_copy(module)
        assert P.load_copy(module) is mod and "Copied-and-trimmed from the pinned SGLang" in (mod.__doc__ or "")
        for name, target in funcs.items():
            assert callable(getattr(mod, name)) and target in recorded, target
            # the copy takes the upstream parameters after the ones it adds
            copy = list(inspect.signature(getattr(mod, name)).parameters)
            upstream = list(inspect.signature(pkgutil.resolve_name(target)).parameters)
            assert copy[: len(upstream)] == upstream or set(upstream) <= set(copy), (target, copy, upstream)
    # every SGLang method the worker classes override is recorded
    for cls, base in ((W.DynVocabDraftWorker, "EagleDraftWorker"), (W.DynVocabWorkerV2, "EAGLEWorkerV2")):
        for name, value in vars(cls).items():
            if callable(value) and not name.startswith("dynvocab") and hasattr(cls.__mro__[1], name):
                owner = next(c for c in cls.__mro__[1:] if name in vars(c))
                assert f"{owner.__module__}.{owner.__qualname__}.{name}" in recorded, (base, name)
    P.check_signatures(recorded)  # and they all match the installed SGLang


# --- the target's LM head under language_model (multimodal wrappers), resolved at start -------------


def draft_worker_for_install(W, policy, target_model, vocab, dim=8):
    """A ``DynVocabDraftWorker`` as ``alloc_memory_pool`` leaves it just before ``install_dynvocab_head``."""
    d = object.__new__(W.DynVocabDraftWorker)
    d.dynvocab_policy, d.dynvocab_config, d.hot_token_id = policy, policy.config, None
    original = torch.nn.Module()
    original.logit_scale = original.final_logit_softcapping = None
    head = SimpleNamespace(weight=torch.randn(vocab, dim, dtype=torch.float64), tp_size=1)
    d.draft_runner = SimpleNamespace(model=SimpleNamespace(logits_processor=original, lm_head=head))
    runner = SimpleNamespace(model=target_model, model_config=SimpleNamespace(vocab_size=vocab))
    d.target_worker = SimpleNamespace(model_runner=runner)
    return d


def language_model(vocab, dim=8):
    """What a multimodal wrapper holds: the text model with its logits processor and LM head."""
    inner = torch.nn.Module()
    inner.logits_processor = SimpleNamespace(keep_last_hidden_states=False)
    inner.lm_head = torch.nn.Linear(dim, vocab, bias=False, dtype=torch.float64)
    return inner


@pytest.mark.parametrize(
    "cls_path", ["gemma3_mm.Gemma3ForConditionalGeneration", "kimi_k25.KimiK25ForConditionalGeneration"]
)
def test_target_head_under_language_model_is_resolved_at_start(W, cls_path):
    """SGLang's Gemma-3 4B-27B and Kimi-K2.5 wrappers keep the head in ``language_model``: the prefill top-K
    head and ``keep_last_hidden_states`` go to the inner model, at start."""
    import importlib

    from sglang_specvocab.errors import SpecVocabError
    from sglang_specvocab.policies import build_policy

    module, name = cls_path.split(".")
    cls = getattr(importlib.import_module(f"sglang.srt.models.{module}"), name)
    outer = cls.__new__(cls)  # the real class (its attributes and properties), without loading weights
    torch.nn.Module.__init__(outer)
    outer.language_model = inner = language_model(V)
    pol = build_policy(window_config(16, 2, 2), num_rows=NUM_ROWS, fallback_id=0)
    d = draft_worker_for_install(W, pol, outer, V)
    d.install_dynvocab_head()
    assert inner.logits_processor.keep_last_hidden_states is True
    assert d.dynvocab_target_head is inner.lm_head.weight  # what the prefill top-K multiplies with

    # a target without any LM head is refused at start, naming the model class
    outer.language_model = torch.nn.Module()
    d = draft_worker_for_install(W, pol, outer, V)
    with pytest.raises(SpecVocabError, match=f"target model {name} has no logits_processor and lm_head"):
        d.install_dynvocab_head()
    # a policy without prefill top-K needs no target head
    d.dynvocab_policy = build_policy(window_config(16, 0, 2, sources=("context",)), num_rows=NUM_ROWS, fallback_id=0)
    d.install_dynvocab_head()
    assert d.dynvocab_target_head is None
