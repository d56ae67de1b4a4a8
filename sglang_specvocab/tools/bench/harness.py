"""DYNVOCAB's decode round and prefill, and EAGLE3's, driven on a CPU over a toy draft model.

What ``sglang-specvocab bench host`` times (``bench/host.py``) and what the loop tests drive. Real,
in both stacks: the worker classes' methods (``DynVocabDraftWorker`` / ``EagleDraftWorker``
``draft_forward`` and both draft extends, ``DynVocabWorkerV2`` / ``EAGLEWorkerV2`` ``verify`` and
``_forward_prefill_batch``), the SGLang helpers they call (``select_top_k_tokens``,
``organize_draft_results``, ``forward_context``, ``renorm_draft_probs``, ``fast_topk``, the topk=1
chain buffers), the draft heads at the level where the two differ (EAGLE3: a real
``LogitsProcessor._get_logits`` over a real ``ParallelLMHead``; DYNVOCAB: the compact processor's
``_get_logits`` over a real policy's table, with the request slots its ``forward`` stashes), the
policy, its events and the telemetry.

Stand-ins, identical in both stacks (so they cancel in a comparison): the draft model's body
(``h' = tanh(h @ A + E[token])``, what ``LogitsProcessor.forward`` does before and after
``_get_logits`` is the same code for both), the target forward (a recorded output),
``run_eagle_verify`` (a recorded verify result), ``prepare_for_draft_extend`` and
``ForwardBatch.init_new`` (forward batches built from the batch), the server context (``get_spec``:
no rejection sampling). SGLang's ``LogitsProcessor`` reads the parallel state, so ``init_dist`` (one
gloo process) must run first, once per process.

Shapes are tiny on purpose: what is measured is the host cost of each stack (Python and the
dispatch of each op), not arithmetic.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from sglang.srt.layers.logits_processor import LogitsMetadata, LogitsProcessor
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.speculative import eagle_worker_v2 as ew
from sglang.srt.speculative.eagle_info import EagleDraftInput

from ...integration.logits import DynVocabLogitsProcessor
from ...integration.telemetry import Gauges, Telemetry
from ...integration.worker import DynVocabDraftWorker, DynVocabWorkerV2, prefill_head
from ...policies import build_policy, parse_config

ARCH = "LlamaForCausalLMEagle3"


def init_dist(port: int) -> None:
    """One-process torch.distributed and SGLang's parallel state (``LogitsProcessor`` reads it)."""
    from sglang.test.layer_ut_utils import init_single_process_dist  # SGLang's test utilities: only when used

    if not torch.distributed.is_initialized():
        init_single_process_dist(master_port=port)


@dataclass(frozen=True)
class Shape:
    bs: int = 8
    topk: int = 1
    steps: int = 3
    num_draft_tokens: int = 4
    vocab: int = 256  # V: the target's and the full-vocabulary draft head's rows
    d: int = 16  # the draft's hidden size
    target_d: int = 16  # the target's hidden size (its LM head input, the prefill top-K)
    capacity: int = 32  # W: the table width
    prefill_topk: int = 3  # MicroSpec's K_pre and K_ver
    verify_topk: int = 3
    prompt_len: int = 64  # tokens per prompt in a prefill batch
    prefill_chunk: int = 1024
    kernel: str = "cuda"  # the head/update backend: the extension's ops (its C++ kernels on a CPU), as on a GPU
    batch: str = "per-request"  # head.batch: a named mode, so the path measured never depends on the cost model
    seed: int = 0

    @property
    def rows(self) -> int:
        """Request slots: the batch's rows are 1..bs (row 0 is SGLang's padding row)."""
        return self.bs + 1


def window_policy(shape: Shape, fallback_id: int = 0):
    """The default policy (MicroSpec's window) at the shape's capacity and top-K."""
    config = parse_config(
        {
            "policy": "window",
            "capacity": shape.capacity,
            "prefill_chunk": shape.prefill_chunk,
            "head": {"kernel": shape.kernel},
            "window": {"prefill_topk": shape.prefill_topk, "verify_topk": shape.verify_topk},
        }
    )
    return build_policy(config, num_rows=shape.rows, fallback_id=fallback_id)


class ToyDraft:
    """The draft model's body and head weight: ``h' = tanh(h @ A + E[token])``, head ``W[V, d]`` (fp32)."""

    def __init__(self, shape: Shape) -> None:
        g = torch.Generator().manual_seed(shape.seed)
        d, v = shape.d, shape.vocab
        self.A = torch.randn(d, d, generator=g) * 0.7
        self.E = torch.randn(v, d, generator=g)
        self.W = torch.randn(v, d, generator=g) * 2.0

    def body(self, tokens: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.addmm(self.E[tokens], hidden, self.A))


class ToyRunner:
    """``draft_runner``: the toy body, then the stack's head (``head(hidden, forward_mode)``)."""

    def __init__(self, toy: ToyDraft, head) -> None:
        self.toy, self.head = toy, head
        self.model_config = SimpleNamespace(hf_config=SimpleNamespace(architectures=[ARCH]), model_is_mrope=False)
        self.canary_manager = None
        self.calls = 0

    def forward(self, fb):
        self.calls += 1
        h = self.toy.body(fb.input_ids, fb.spec_info.hidden_states)
        if fb.forward_mode == ForwardMode.EXTEND:  # CaptureHiddenMode.LAST: each request's last position
            h = h[torch.cumsum(fb.extend_seq_lens, dim=0) - 1]
        logits = self.head(h, fb)
        return SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=logits, hidden_states=h))


def eagle3_head(toy: ToyDraft, vocab: int):
    """EAGLE3's draft head: SGLang's ``LogitsProcessor._get_logits`` over the full-vocabulary head."""
    from transformers import LlamaConfig  # heavy: only for the EAGLE3 stack

    config = LlamaConfig(vocab_size=vocab, hidden_size=toy.A.shape[0], num_attention_heads=1, num_key_value_heads=1)
    lp = LogitsProcessor(config)
    lm_head = ParallelLMHead(vocab, toy.W.shape[1])
    with torch.no_grad():
        lm_head.weight.copy_(toy.W)
    metas = {}

    def head(h, fb):
        meta = metas.get(fb.forward_mode)
        if meta is None:
            meta = metas[fb.forward_mode] = LogitsMetadata(forward_mode=fb.forward_mode)
        return lp._get_logits(h, lm_head, meta)

    return head


def dynvocab_head(toy: ToyDraft, policy, kernel: str, batch: str = "per-request"):
    """DYNVOCAB's: the compact processor over the policy's table (its ``forward`` stashes the slots)."""
    original = torch.nn.Module()
    original.logit_scale, original.final_logit_softcapping = None, None
    table = policy.table
    lm_head = SimpleNamespace(weight=toy.W, tp_size=1)  # what the compact processor reads of a ParallelLMHead
    # the shape's batch may name a plan, which no config file can: set on a copy of the policy's head section
    head_config = policy.config.head.model_copy(update={"kernel": kernel, "batch": batch})
    proc = DynVocabLogitsProcessor.wrap(original, lm_head, table, head_config)
    metas = {}

    def head(h, fb):
        meta = metas.get(fb.forward_mode)
        if meta is None:
            meta = metas[fb.forward_mode] = LogitsMetadata(forward_mode=fb.forward_mode)
        proc._dv_rows = fb.req_pool_indices
        try:
            return proc._get_logits(h, lm_head, meta)
        finally:
            proc._dv_rows = None

    return proc, head


def _chain_buffers(w, max_bs: int) -> None:
    """``EagleDraftWorkerBase._rebuild_topk1_chain_buffers`` (its formula, without the server context)."""
    if w.topk != 1:
        w._topk1_parents_prealloc = w._topk1_score_indices_prealloc = None
        return
    steps = w.speculative_num_steps
    width = steps if steps > 1 else 0
    w._topk1_parents_prealloc = torch.arange(-1, width - 1, dtype=torch.long).repeat(max_bs, 1)
    w._topk1_score_indices_prealloc = torch.arange(steps, dtype=torch.long).repeat(max_bs, 1)


def _draft_worker(cls, shape: Shape, runner: ToyRunner):
    w = object.__new__(cls)
    w.topk, w.speculative_num_steps = shape.topk, shape.steps
    w.speculative_num_draft_tokens = shape.num_draft_tokens
    w.hot_token_id = None
    w.device = "cpu"
    w.index_share_for_mtp_iteration = False
    w.seed_dsa_topk_from_draft_extend = False
    w.dsa_extend_topk_buf = None
    w.plan_stream, w.plan_stream_ctx = None, contextlib.nullcontext()
    w.cuda_graph_runner_for_draft_extend = None
    w.draft_runner = runner
    w.draft_attn_backend = SimpleNamespace(attn_backends=[f"step{i}" for i in range(max(shape.steps, 1))])
    w.parallel_layout = SimpleNamespace(tp_group=None, local_dp=True)
    w.speculative_algorithm = SimpleNamespace(is_standalone=lambda: False)
    _chain_buffers(w, max_bs=max(shape.bs, 1))
    w._draft_forward_idle = lambda fb, spec: (None, None, None, None)
    return w


class Target:
    """``target_worker``: the target's LM head (prefill top-K) and a recorded prefill output."""

    def __init__(self, shape: Shape, weight: torch.Tensor) -> None:
        self.output = None
        self.model_runner = SimpleNamespace(
            model_config=SimpleNamespace(vocab_size=shape.vocab),
            model=SimpleNamespace(lm_head=SimpleNamespace(weight=weight, tp_size=1)),
        )

    def forward_batch_generation(
        self, batch, pp_proxy_tensors=None, capture_hidden_mode=None, return_kv_loc_plan=False
    ):
        out = self.output
        return SimpleNamespace(
            logits_output=SimpleNamespace(
                hidden_states=out.hidden_states,
                last_hidden_states=out.last_hidden_states,
                mm_input_embeds=None,
            ),
            next_token_ids=out.next_token_ids,
            kv_loc_plan=None,
        )


class Pool:
    """``ReqToTokenPool.req_generation`` alone (the prefill's slot-reuse check reads it)."""

    def __init__(self, rows: int) -> None:
        self.req_generation = torch.ones(rows, dtype=torch.int64)


class Stack:
    """One algorithm's workers over the toy draft: ``name`` is ``"EAGLE3"`` or ``"DYNVOCAB"``."""

    def __init__(self, name: str, shape: Shape, toy: ToyDraft, target_weight: torch.Tensor) -> None:
        self.name, self.shape = name, shape
        dyn = name == "DYNVOCAB"
        self.policy = window_policy(shape) if dyn else None
        if dyn:
            self.proc, head = dynvocab_head(toy, self.policy, shape.kernel, shape.batch)
        else:
            self.proc, head = None, eagle3_head(toy, shape.vocab)
        self.runner = ToyRunner(toy, head)
        dw = _draft_worker(DynVocabDraftWorker if dyn else ew.EagleDraftWorker, shape, self.runner)
        self.target = Target(shape, target_weight)
        w = object.__new__(DynVocabWorkerV2 if dyn else ew.EAGLEWorkerV2)
        w._draft_worker, w._target_worker = dw, self.target
        w.topk, w.speculative_num_steps = shape.topk, shape.steps
        w.speculative_num_draft_tokens = shape.num_draft_tokens
        w.speculative_algorithm = SimpleNamespace(is_standalone=lambda: False)
        w.req_to_token_pool = Pool(shape.rows)
        w.token_to_kv_pool_allocator = None
        w.plan_stream, w.plan_stream_ctx = None, contextlib.nullcontext()
        w.device = "cpu"
        w.adaptive_controller = None
        if dyn:
            dw.dynvocab_policy, dw.dynvocab_proc = self.policy, self.proc
            dw.dynvocab_telemetry = Telemetry(shape.rows)
            # resolved at start by install_dynvocab_head, which this hand-built worker skips
            dw.dynvocab_target_head = prefill_head(self.target.model_runner.model.lm_head, lambda: None)
            w._dv_seen = w._dv_fed = None
            w._dv_live, w._dv_row_rid = {}, {}
            w.dynvocab_gauges = Gauges(False)
        self.draft_worker, self.worker = dw, w


# --- inputs: one decode round and one prefill batch, the same for both stacks ---------------------


class Inputs:
    """Recorded inputs of one decode round and one prefill batch (``rows`` 1..bs).

    A round's verify result follows the step count it is asked for (``verify_result(steps, nd)``), so
    a worker whose steps change (adaptive steps) gets a round of its current shape; 0 steps is
    SGLang's trivial verify (the bonus token alone)."""

    def __init__(self, shape: Shape) -> None:
        g = torch.Generator().manual_seed(shape.seed + 1)
        bs, v = shape.bs, shape.vocab
        self.shape = shape
        self.rows = torch.arange(1, bs + 1)
        self.h0 = torch.randn(bs, shape.d, generator=g)
        self.first_ids = torch.randint(0, v, (bs, shape.topk), generator=g)
        self.positions = torch.arange(bs * shape.topk, dtype=torch.int64) * 7 + 20
        self._cache_locs = torch.randperm(bs * shape.topk * 64, generator=g)
        self._rounds: dict[tuple[int, int], SimpleNamespace] = {}
        # one prefill batch: bs prompts of prompt_len tokens
        n = bs * shape.prompt_len
        self.prompt_ids = torch.randint(0, v, (n,), generator=g)
        self.prefill_hidden = torch.randn(n, shape.d, generator=g)  # the target's aux states (draft input)
        self.prefill_last_hidden = torch.randn(n, shape.target_d, generator=g)  # post-norm, for the top-K
        self.prefill_next = torch.randint(0, v, (bs,), generator=g)

    def verify_round(self, steps: int, nd: int) -> SimpleNamespace:
        """The verify round of a ``steps``-step, ``nd``-token draft (made once per shape): accepted paths of
        varied lengths, root first (global node indices)."""
        key = (steps, nd)
        if key not in self._rounds:
            g = torch.Generator().manual_seed(self.shape.seed + 10 + 100 * steps + nd)
            bs, v, width = self.shape.bs, self.shape.vocab, steps + 1
            accept_lens = torch.randint(1, width + 1, (bs,), generator=g).clamp(max=nd)
            cols = torch.arange(width)
            index = torch.arange(bs)[:, None] * nd + cols[None, :]
            self._rounds[key] = SimpleNamespace(
                accept_index=torch.where(cols[None, :] < accept_lens[:, None], index, -1).to(torch.int32),
                accept_lens=accept_lens.to(torch.int32),
                draft_token=torch.randint(0, v, (bs * nd,), generator=g),
                predict=torch.randint(0, v, (bs * nd,), generator=g).to(torch.int32),
                logits=torch.randn(bs * nd, v, generator=g),
                hidden=torch.randn(bs * nd, self.shape.d, generator=g),
            )
        return self._rounds[key]

    # decode
    def draft_batch(self, topk_p: torch.Tensor, topk_index: torch.Tensor, steps: int):
        spec = EagleDraftInput(topk_p=topk_p, topk_index=topk_index, hidden_states=self.h0.clone())
        bs, k = self.shape.bs, self.shape.topk
        return SimpleNamespace(
            spec_info=spec,
            out_cache_loc=self._cache_locs[: bs * k * steps],
            batch_size=bs,
            positions=self.positions.clone(),
            req_pool_indices=self.rows,
            input_ids=None,
            forward_mode=ForwardMode.DECODE,
            moe_num_token_non_padded=None,
            sampling_info=SimpleNamespace(is_all_greedy=True),
        )

    def verify_batch(self, steps: int, nd: int):
        return SimpleNamespace(
            spec_info=SimpleNamespace(draft_token=self.verify_round(steps, nd).draft_token, spec_steps=steps),
            req_pool_indices=self.rows,
            forward_mode=ForwardMode.DECODE,
            seq_lens=torch.full((self.shape.bs,), 30),
            sampling_info=SimpleNamespace(temperatures=None),
        )

    def verify_result(self, steps: int, nd: int):
        r = self.verify_round(steps, nd)
        return SimpleNamespace(
            logits_output=SimpleNamespace(next_token_logits=r.logits, hidden_states=r.hidden),
            accept_index=r.accept_index,
            accept_lens=r.accept_lens,
            next_token_ids=r.predict,
            next_draft_input=SimpleNamespace(),
            prepared_draft_extend_inputs=None,
        )

    # prefill
    def prefill_batch(self):
        bs, n = self.shape.bs, self.shape.prompt_len
        reqs = [
            SimpleNamespace(rid=f"r{r}", kv=SimpleNamespace(req_pool_idx=r), fill_ids=None, customized_info=None)
            for r in range(1, bs + 1)
        ]
        return SimpleNamespace(
            reqs=reqs,
            input_ids=self.prompt_ids.clone(),
            req_pool_indices=self.rows,
            extend_lens=[n] * bs,
            prefix_lens=[0] * bs,
            seq_lens=torch.full((bs,), n),
            forward_mode=ForwardMode.EXTEND,
            sampling_info=SimpleNamespace(temperatures=None),
            chunked_req=None,
            chunked_req_next_prompt_token=None,
            global_num_tokens=None,
            spec_info=None,
            is_extend_in_batch=False,
        )

    def prefill_output(self):
        return SimpleNamespace(
            hidden_states=self.prefill_hidden,
            last_hidden_states=self.prefill_last_hidden,
            next_token_ids=self.prefill_next,
        )


# --- the stand-ins around both stacks ------------------------------------------------------------


@contextlib.contextmanager
def stand_ins(inputs: Inputs):
    """SGLang's server-context and batch-building functions that need a running server, replaced."""

    def init_new(batch, runner, capture_hidden_mode=None, return_hidden_states_before_norm=None, kv_loc_plan=None):
        return SimpleNamespace(
            input_ids=batch.input_ids,
            spec_info=batch.spec_info,
            req_pool_indices=batch.req_pool_indices,
            extend_seq_lens=torch.tensor(batch.extend_lens),
            forward_mode=ForwardMode.EXTEND,
            out_cache_loc=None,
            positions=None,
            batch_size=len(batch.reqs),
            capture_hidden_mode=capture_hidden_mode,
        )

    def prepare_for_draft_extend(draft_extend_input, batch, next_token_ids, num_draft_tokens, runner, graph, **kw):
        batch.spec_info = draft_extend_input
        return SimpleNamespace(
            input_ids=next_token_ids,
            spec_info=draft_extend_input,
            req_pool_indices=batch.req_pool_indices,
            out_cache_loc=None,
            positions=None,
            forward_mode=ForwardMode.DRAFT_EXTEND_V2,
        )

    def run_eagle_verify(batch, *, num_draft_tokens, **kw):
        return inputs.verify_result(batch.spec_info.spec_steps, num_draft_tokens)

    patches = {
        "get_spec": lambda: SimpleNamespace(speculative_use_rejection_sampling=False),
        "ForwardBatch": SimpleNamespace(init_new=init_new),
        "prepare_for_draft_extend": prepare_for_draft_extend,
        "run_eagle_verify": run_eagle_verify,
        "speculative_moe_backend_context": contextlib.nullcontext,
        "speculative_moe_a2a_backend_context": contextlib.nullcontext,
    }
    saved = {name: getattr(ew, name) for name in patches}
    for name, value in patches.items():
        setattr(ew, name, value)
    try:
        with torch.compiler.set_stance("force_eager"):  # select_top_k_tokens' later step, as Python
            yield
    finally:
        for name, value in saved.items():
            setattr(ew, name, value)


# --- one round and one prefill --------------------------------------------------------------------


class Round:
    """The phases of one decode round on a stack: ``draft()``, ``verify()``, ``extend()``, ``prefill()``,
    each at the worker's current step count and draft tokens."""

    def __init__(self, stack: Stack, inputs: Inputs) -> None:
        self.stack, self.inputs = stack, inputs
        bs, k = inputs.shape.bs, inputs.shape.topk
        self.topk_p = torch.full((bs, k), 1.0 / k)
        self.topk_index = inputs.first_ids
        self.result = None

    @property
    def steps(self) -> int:
        return self.stack.worker.speculative_num_steps

    @property
    def nd(self) -> int:
        return self.stack.worker.speculative_num_draft_tokens

    def draft(self):
        fb = self.inputs.draft_batch(self.topk_p, self.topk_index, self.steps)
        return self.stack.draft_worker.draft_forward(fb)

    def verify(self):
        self.result = self.stack.worker.verify(self.inputs.verify_batch(self.steps, self.nd))
        return self.result

    def extend(self):
        res = self.result if self.result is not None else self.inputs.verify_result(self.steps, self.nd)
        res.next_draft_input = SimpleNamespace()
        self.stack.draft_worker._draft_extend_for_decode(self.inputs.verify_batch(self.steps, self.nd), res)
        return res.next_draft_input

    def round(self):
        out = self.draft()
        self.verify()
        nxt = self.extend()
        return out, nxt

    def prefill(self):
        self.stack.target.output = self.inputs.prefill_output()
        batch = self.inputs.prefill_batch()
        w = self.stack.worker
        if getattr(w, "_dv_seen", None) is not None:
            w._dv_seen.fill_(-1)  # every prefill is a fresh request in its slot (reset + seed)
        return w._forward_prefill_batch(batch)


def build(shape: Shape, names: tuple[str, ...] = ("EAGLE3", "DYNVOCAB")) -> tuple[Round, ...]:
    """One ``Round`` per stack in ``names``, over one toy draft and one set of inputs (EAGLE3's head is
    SGLang's ``LogitsProcessor``: it needs ``init_dist`` first)."""
    toy = ToyDraft(shape)
    target_weight = torch.randn(shape.vocab, shape.target_d, generator=torch.Generator().manual_seed(shape.seed + 2))
    inputs = Inputs(shape)
    return tuple(Round(Stack(name, shape, toy, target_weight), inputs) for name in names)


__all__ = ["Inputs", "Round", "Shape", "Stack", "ToyDraft", "build", "init_dist", "stand_ins"]
