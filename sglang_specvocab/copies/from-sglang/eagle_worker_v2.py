"""Copied-and-trimmed from the pinned SGLang (``copies/upstream.py``), ``sglang/srt/speculative/eagle_worker_v2.py``
(Apache-2.0, Copyright the SGLang Team). Loaded by path through
``sglang_specvocab.copies.load_copy("eagle_worker_v2")``.

``worker_init`` is ``EAGLEWorkerV2.__init__`` with one change: the draft worker class is a parameter
(``EagleDraftWorker`` is hard-coded upstream), as ``StandaloneWorkerV2.__init__`` does it. Everything
else (names of attributes, order, the pipeline-parallel proxy rule, the adaptive-steps controller
that ``init_cuda_graphs`` fills with one runtime state per candidate step count) is upstream's.
"""

from __future__ import annotations

import torch
from sglang.srt.speculative import eagle_worker_v2 as ew


def worker_init(self, server_args, gpu_id, nccl_port, target_worker, draft_worker_cls) -> None:
    ew.BaseSpecWorker.__init__(self)

    # Parse arguments
    self.server_args = server_args
    self.topk = ew.get_spec().speculative_eagle_topk
    self.speculative_num_steps = ew.get_spec().speculative_num_steps
    self.speculative_num_draft_tokens = ew.get_spec().speculative_num_draft_tokens
    self.gpu_id = gpu_id
    self.device = ew.get_device().device
    self._target_worker = target_worker
    self.page_size = ew.get_schedule().page_size
    self.speculative_algorithm = ew.SpeculativeAlgorithm.from_string(ew.get_spec().speculative_algorithm)

    self.enable_dp_spec_prefill_coordination = ew.envs.SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION.get()

    # Only the last PP stage runs the draft (DYNVOCAB refuses PP, so this is always this rank).
    self._hosts_draft = ew.get_parallel().pp_group.is_last_rank
    self._draft_worker = draft_worker_cls(server_args, gpu_id, nccl_port, target_worker) if self._hosts_draft else None

    # Adaptive speculative
    self.adaptive_controller = None
    if ew.get_spec().speculative_adaptive and self._hosts_draft:
        self.adaptive_controller = ew.AdaptiveController(
            self,
            ew.AdaptiveSpeculativeParams(
                initial_steps=self.speculative_num_steps,
                cfg_path=ew.get_spec().speculative_adaptive_config,
            ),
        )

    # Some dummy tensors
    self.num_new_pages_per_topk = torch.empty((), dtype=torch.int64, device=self.device)
    self.extend_lens = torch.empty((), dtype=torch.int64, device=self.device)

    self.plan_stream, self.plan_stream_ctx = ew.get_plan_stream(self.device)
