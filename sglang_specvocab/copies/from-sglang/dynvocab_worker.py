"""Copied-and-trimmed from the pinned SGLang (``copies/upstream.py``), ``sglang/srt/speculative/eagle_worker_v2.py``
(Apache-2.0, Copyright the SGLang Team). Loaded by path through
``sglang_specvocab.copies.load_copy("dynvocab_worker")``; bound to ``DynVocabWorkerV2``.

``forward_prefill_batch`` is ``EAGLEWorkerV2._forward_prefill_batch`` with
- one insertion between the target forward and the draft extend: ``self.dynvocab_prefill(batch,
  batch_output)`` (reset re-used request slots, then ``policy.on_prefill`` with the prompt ids and
  the target's top-K; ``integration/worker.py``), before ``_draft_extend_for_prefill`` rotates
  ``batch.input_ids``, so the policy sees the extended ids and the first draft top-k already
  reads the seeded set;
- the STANDALONE capture-mode branch dropped (DYNVOCAB is EAGLE-3: always ``CaptureHiddenMode.FULL``).
Everything else (the publish fence, the PP early return, the DP coordination plan, the draft
contexts) is upstream's.
"""

from __future__ import annotations

from sglang.srt.speculative import eagle_worker_v2 as ew


def forward_prefill_batch(self, batch, on_publish=None, pp_proxy_tensors=None, coordination_plan=None):
    batch_output = self.target_worker.forward_batch_generation(
        batch,
        pp_proxy_tensors=pp_proxy_tensors,
        capture_hidden_mode=ew.CaptureHiddenMode.FULL,
        return_kv_loc_plan=self._draft_worker is not None,
    )
    kv_loc_plan, batch_output.kv_loc_plan = batch_output.kv_loc_plan, None

    batch_output.new_seq_lens = batch.seq_lens
    if on_publish is not None:
        on_publish(batch_output.new_seq_lens)

    if self._draft_worker is None:
        return batch_output

    if coordination_plan is not None:
        coordination_plan.apply(
            batch,
            "draft_extend",
            ew.get_parallel().attn_dp_rank,
            local_only=(len(batch.global_num_tokens) == 1 or self.draft_worker.parallel_layout.local_dp),
        )

    # DYNVOCAB: slot resets and the prefill event, on the forward stream, before the draft extend.
    self.dynvocab_prefill(batch, batch_output)

    with (
        ew.draft_tp_context(self.draft_worker.parallel_layout),
        ew.speculative_moe_backend_context(),
        ew.speculative_moe_a2a_backend_context(),
        ew.spec_stage_span("draft_extend"),
    ):
        batch_output.next_draft_input = self.draft_worker._draft_extend_for_prefill(
            batch,
            batch_output.logits_output.hidden_states,
            batch_output.next_token_ids,
            batch_output.logits_output.mm_input_embeds,
            kv_loc_plan=kv_loc_plan,
        )
        return batch_output


__all__ = ["forward_prefill_batch"]
