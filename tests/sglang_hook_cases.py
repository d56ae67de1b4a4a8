"""The plug-in on an SGLang with the draft top-k hook (``patches/sglang-draft-topk-hook.diff``).

Not collected by the suite (the file name): ``tests/test_sglang_patch.py`` runs it with pytest in a child
process whose ``sys.path`` starts with a patched copy of SGLang. There the worker classes use SGLang's own
methods and ``CompactTopKHook`` instead of the copies, and must give

- the copies' results, compared directly on the same inputs (the copies still load by path);
- and pass the copies' own integration tests (draft loop, both draft extends, the prefill batch), which
  compare with SGLang's built-in top-k over a masked full head and with plain-Python references.
"""

from __future__ import annotations

from types import MethodType, SimpleNamespace

import pytest
import test_integration_draft_loop as loop
import test_integration_prefill as prefill
import torch
from helpers import window_config

from sglang_specvocab.copies import has_draft_topk_hook, load_copy
from sglang_specvocab.tools.testing.standins import install

pytestmark = pytest.mark.sglang

# The copies' tests' fixtures, requested here by name.
_eager_and_spec, draft, ew = loop._eager_and_spec, loop.draft, loop.ew
_record_mm, _stand_ins, mods = prefill._record_mm, prefill._stand_ins, prefill.mods

# CompactTopKHook tells the prefill extend (EXTEND) from the decode extend by ForwardMode.is_extend().
loop.FBMode.is_extend = lambda self: self.name == "extend"

install(("torchvision",))  # SGLang imports torchvision, which has no CPU build here (before the check below)
if not has_draft_topk_hook():
    raise RuntimeError(f"{__file__} needs SGLang with the draft top-k hook: tests/test_sglang_patch.py runs it")


class HookPath:
    """The copies' functions (``draft.draft_forward(w, fb)`` ...) served by SGLang's own methods through the hook."""

    def __init__(self, ew, W):
        self.ew, self.W = ew, W

    def _install(self, w):
        w.set_draft_topk_hook(self.W.CompactTopKHook(w.dynvocab_proc))

    def draft_forward(self, w, forward_batch):
        self._install(w)
        return self.ew.EagleDraftWorker.draft_forward(w, forward_batch)

    def draft_extend_for_decode(self, w, batch, batch_result, **kwargs):
        self._install(w)
        return self.ew.EagleDraftWorker._draft_extend_for_decode(w, batch, batch_result, **kwargs)


@pytest.fixture
def hook(ew, mods):
    return HookPath(ew, mods.W)


@pytest.fixture
def hooked_setup(mods, monkeypatch):
    """``prefill.Setup`` with the hook on its draft worker (what ``install_dynvocab_head`` does in a server)."""
    init = prefill.Setup.__init__

    def with_hook(self, *args, **kwargs):
        init(self, *args, **kwargs)
        dw = self.draft_worker
        dw.speculative_algorithm = self.worker.speculative_algorithm  # read by SGLang's own draft extend
        dw.set_draft_topk_hook(mods.W.CompactTopKHook(self.model.proc))

    monkeypatch.setattr(prefill.Setup, "__init__", with_hook)


def test_the_plugin_takes_the_hook(mods):
    W = mods.W
    assert W.SGLANG_HOOK is True
    for name in ("draft_forward", "_draft_extend_for_prefill", "_draft_extend_for_decode"):
        assert name not in vars(W.DynVocabDraftWorker), name
    assert "_forward_prefill_batch" not in vars(W.DynVocabWorkerV2)
    assert W.DynVocabWorkerV2._forward_prefill_batch is mods.ew.EAGLEWorkerV2._forward_prefill_batch
    assert W.DynVocabWorkerV2.draft_worker_cls is W.DynVocabDraftWorker


def test_worker_init_is_sglangs_building_the_draft_worker_cls(mods, monkeypatch):
    ew = mods.ew
    spec = SimpleNamespace(
        speculative_eagle_topk=1,
        speculative_num_steps=3,
        speculative_num_draft_tokens=4,
        speculative_algorithm="EAGLE3",
        speculative_adaptive=False,
    )
    monkeypatch.setattr(ew, "get_spec", lambda: spec)
    monkeypatch.setattr(ew, "get_device", lambda: SimpleNamespace(device="cpu"))
    monkeypatch.setattr(ew, "get_schedule", lambda: SimpleNamespace(page_size=1))
    monkeypatch.setattr(ew, "get_parallel", lambda: SimpleNamespace(pp_group=SimpleNamespace(is_last_rank=True)))
    built = []

    class Recorder(mods.W.DynVocabWorkerV2):
        draft_worker_cls = staticmethod(lambda *a: built.append(a) or SimpleNamespace(dynvocab_policy="p"))

    w = Recorder("sa", 0, 1234, "target")
    assert built == [("sa", 0, 1234, "target")] and w.dynvocab_policy == "p"
    assert (w.topk, w.speculative_num_steps, w.speculative_num_draft_tokens) == (1, 3, 4)
    assert w.adaptive_controller is None and w._dv_live == {} and w._dv_seen is None


def test_install_dynvocab_head_sets_the_hook(mods):
    from sglang_specvocab.policies import build_policy

    W = mods.W
    model = loop.Model()
    dw = object.__new__(W.DynVocabDraftWorker)
    dw.dynvocab_config = window_config(loop.CAP, 2, 2)
    dw.dynvocab_policy = build_policy(dw.dynvocab_config, num_rows=loop.R, fallback_id=0)
    original = torch.nn.Module()
    original.logit_scale = original.final_logit_softcapping = None
    dw.draft_runner = SimpleNamespace(model=SimpleNamespace(logits_processor=original, lm_head=model.lm_head))
    target_lp = SimpleNamespace()
    dw.target_worker = SimpleNamespace(
        model_runner=SimpleNamespace(
            model=SimpleNamespace(logits_processor=target_lp, lm_head=model.lm_head),
            model_config=SimpleNamespace(vocab_size=loop.V),
        )
    )
    dw.hot_token_id = None
    dw.install_dynvocab_head()
    assert dw.dynvocab_target_head is model.lm_head.weight  # the prefill top-K's head, resolved at start
    assert isinstance(dw.draft_topk_hook, W.CompactTopKHook) and dw.draft_topk_hook.proc is dw.dynvocab_proc
    assert dw.draft_runner.model.logits_processor is dw.dynvocab_proc and target_lp.keep_last_hidden_states


# --- the draft loop and the decode draft extend: the copies' tests on the hook, and hook == copy ------


@pytest.mark.parametrize("max_bs", [8, 2], ids=["prealloc", "organize"])
@pytest.mark.parametrize("steps", [1, 3, 5])
def test_chain_on_the_hook(ew, hook, steps, max_bs):
    loop.test_chain_is_greedy_over_each_set_and_matches_upstream(ew, hook, steps, max_bs)


@pytest.mark.parametrize("topk,steps,nd", [(2, 3, 6), (3, 4, 8), (3, 2, 4), (4, 3, 10), (2, 1, 2)])
def test_tree_on_the_hook(ew, hook, topk, steps, nd):
    loop.test_tree_matches_upstream_on_masked_full_logits(ew, hook, topk, steps, nd)


@pytest.mark.parametrize("topk", [1, 3])
def test_draft_extend_for_decode_on_the_hook(ew, hook, monkeypatch, topk):
    loop.test_draft_extend_for_decode_eager_matches_upstream(ew, hook, monkeypatch, topk)


def assert_same(got, want):
    assert type(got) is type(want)
    if isinstance(got, torch.Tensor):
        assert torch.equal(got, want) and got.dtype == want.dtype
    elif isinstance(got, tuple | list):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
    elif isinstance(got, dict):
        assert got.keys() == want.keys()
        for key in got:
            assert_same(got[key], want[key])
    else:
        assert got == want


@pytest.mark.parametrize("topk,steps,nd", [(1, 3, 4), (1, 5, 6), (2, 3, 6), (3, 4, 8), (4, 3, 10)])
def test_draft_forward_hook_equals_copy(ew, draft, hook, topk, steps, nd):
    model = loop.Model(seed=topk + 7 * steps)
    rows, h0 = torch.tensor(loop.ROWS), loop.hidden0(len(loop.ROWS), seed=steps)
    same = {"compact": True, "topk": topk, "steps": steps, "nd": nd, "rows": rows, "h0": h0}
    got, calls, fb, _ = loop.run_draft_forward(ew, hook, model, **same)
    want, want_calls, want_fb, _ = loop.run_draft_forward(ew, draft, model, **same)
    assert_same(got, want)  # parent_list, top_scores_index, draft_tokens, draft_probs (None)
    assert_same(calls, want_calls)  # per step: ids, cache locations, positions, attention backend, dv_step
    assert_same(fb.positions, want_fb.positions)


@pytest.mark.parametrize("topk", [1, 2, 3])
def test_draft_extend_for_decode_hook_equals_copy(ew, draft, hook, monkeypatch, topk):
    model = loop.Model(seed=3 + topk)
    rows, nd = torch.tensor(loop.ROWS), 4
    g = torch.Generator().manual_seed(topk)
    predict = torch.tensor([loop.SETS[r][j] for r in loop.ROWS for j in torch.randint(0, 8, (nd,), generator=g)])
    hidden = torch.randn(len(loop.ROWS) * nd, loop.D, generator=g, dtype=torch.float64)
    accept_lens = torch.tensor([3, 1, 4], dtype=torch.int32)
    same = {
        "compact": True,
        "topk": topk,
        "nd": nd,
        "rows": rows,
        "predict": predict,
        "hidden": hidden,
        "accept_lens": accept_lens,
    }
    got = loop.run_extend_for_decode(ew, hook, monkeypatch, model, **same)
    want = loop.run_extend_for_decode(ew, draft, monkeypatch, model, **same)
    assert_same(vars(got), vars(want))  # topk_p, topk_index, hidden_states, cuda_graph_compatible


# --- the prefill batch: the copies' tests on the hook, and hook == copy -------------------------------


@pytest.mark.parametrize("mm", [False, True], ids=["text", "mm"])
@pytest.mark.parametrize("topk", [1, 3])
def test_prefill_on_the_hook(mods, _stand_ins, hooked_setup, topk, mm):
    prefill.test_prefill_seeds_policy_then_draft_extend_reads_it_and_matches_upstream(mods, _stand_ins, topk, mm)


def test_chunked_prefill_on_the_hook(mods, _stand_ins, hooked_setup):
    prefill.test_chunked_prefill_tail_token_slot_reuse_and_second_chunk(mods, _stand_ins)


def test_prefix_hit_on_the_hook(mods, _stand_ins, hooked_setup):
    prefill.test_prefix_hit_is_seeded_from_the_request_ids(mods, _stand_ins)


def test_no_draft_worker_on_the_hook(mods, _stand_ins, hooked_setup):
    prefill.test_no_draft_worker_returns_the_target_output_untouched(mods, _stand_ins)


def test_idle_prefill_on_the_hook(mods, _stand_ins, hooked_setup, monkeypatch):
    prefill.test_idle_prefill_batch_runs_the_draft_without_a_policy_event(mods, _stand_ins, monkeypatch)


@pytest.mark.parametrize("topk", [1, 2])
def test_prefill_hook_equals_copy(mods, _stand_ins, hooked_setup, topk):
    V = loop.V
    g = torch.Generator().manual_seed(9 + topk)
    prompts = {3: torch.randint(0, V, (6,), generator=g).tolist(), 4: torch.randint(0, V, (3,), generator=g).tolist()}
    ids = [t for p in prompts.values() for t in p]
    rec = prefill.target_output(len(ids), len(prompts), seed=topk)

    def run(copies: bool):
        s = prefill.Setup(mods, topk, seed=topk)
        for r in prompts:
            s.worker.req_to_token_pool.alloc(r)
        reqs = [prefill.req(f"r{r}", r, p) for r, p in prompts.items()]
        batch = prefill.schedule_batch(reqs, ids, [0, 0], [len(p) for p in prompts.values()])
        if not copies:
            return s, batch, s.run(batch, rec)
        dw = s.draft_worker
        dw.set_draft_topk_hook(None)
        dw._draft_extend_for_prefill = MethodType(load_copy("dynvocab_draft").draft_extend_for_prefill, dw)
        s.target.outputs.append(prefill.as_batch_output(rec, loop.D))
        return s, batch, load_copy("dynvocab_worker").forward_prefill_batch(s.worker, batch)

    s, batch, out = run(copies=False)
    cs, cbatch, cout = run(copies=True)
    assert_same(vars(out.next_draft_input), vars(cout.next_draft_input))
    assert_same(batch.input_ids, cbatch.input_ids)  # rotated the same way
    assert_same(s.policy.table.ids, cs.policy.table.ids)
    assert_same(s.policy.table.cnt, cs.policy.table.cnt)
    assert_same(s.draft_worker.draft_runner.calls, cs.draft_worker.draft_runner.calls)
    assert out.kv_loc_plan is None and cout.kv_loc_plan is None


def test_compact_hook_takes_the_argmax_for_chains_except_after_prefill(mods):
    """topk 1: ``draft_topk1`` (p = 1) in the draft steps and the decode extend, the softmax after prefill."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    proc = SimpleNamespace(
        draft_topk=lambda logits, k, rows, head_key: ("draft_topk", k, head_key),
        draft_topk1=lambda logits, rows, head_key: ("draft_topk1", 1, head_key),
    )
    hook = mods.W.CompactTopKHook(proc)
    rows = torch.tensor([3, 1])
    for mode, step, want in [
        (ForwardMode.DECODE, 2, "draft_topk1"),
        (ForwardMode.DRAFT_EXTEND_V2, 0, "draft_topk1"),
        (ForwardMode.EXTEND, 0, "draft_topk"),
    ]:
        fb = SimpleNamespace(forward_mode=mode, req_pool_indices=rows)
        # the head call's shape reaches the processor: after a replay it is the graph's, not the logits'
        assert hook.draft_topk(None, 1, fb, step, (4, 1)) == (want, 1, (4, 1)), mode
        assert hook.draft_topk(None, 3, fb, step, (2, 3)) == ("draft_topk", 3, (2, 3)), mode
    hook.before_draft_forward(None, 4)
    assert proc.dv_step == 4
