"""The seam between this plug-in and SGLang: everything that names the SGLang it was written for.

Supporting another SGLang starts here (then ``pyproject.toml``'s ``[sglang]`` extra and
``scripts/requirements-sglang-light.txt``, which ``tests/test_upstream_seam.py`` holds to this file):

- ``SGLANG_VERSION``: the one SGLang version the plug-in runs on (``check_sglang_version``);
- ``PLUGIN``, ``WORKER``, ``HOOK``: the signature of every SGLang callable the plug-in subclasses,
  overrides, wraps or calls by a private name, as ``inspect.signature`` prints it with annotations
  removed (``sglang_specvocab.copies.signature_text``);
- ``BODIES``, ``KERNEL_BODIES``: for every SGLang function whose body a copy in ``from-sglang/``
  reproduces, a hash of its source (``sglang_specvocab.copies.source_hash``), because a signature
  cannot see a changed body.

``PLUGIN`` is checked when the plug-in loads (these modules are imported by registration anyway);
``WORKER`` and then ``BODIES`` are checked the first time the worker classes are needed
(``create_worker``, in the scheduler process, before any weights load), or at plug-in load where the
worker modules are already imported; ``BODIES`` only where the copies run (no draft top-k hook).
``KERNEL_BODIES`` (the bench's copy of EAGLE3's Triton step, never run by the worker) is checked by
the tests. Regenerate with ``python -m sglang_specvocab.tools.record_sglang`` after porting the copies to
the new SGLang source, never blindly.

Pure data, no imports: ``scripts/device/stage.py`` reads ``SGLANG_VERSION`` with ``ast``.
"""

SGLANG_VERSION = "0.5.23"

PLUGIN = {
    # registration (integration/plugin.py, integration/algorithm.py)
    "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.register": (
        "(name, *, supports_overlap=False, validate_server_args=None, "
        "spec_class=<class 'sglang.srt.speculative.spec_registry.CustomSpecAlgo'>)"
    ),
    "sglang.srt.speculative.spec_registry.CustomSpecAlgo.__init__": (
        "(self, name, factory, *, supports_overlap=False, validate_server_args=None)"
    ),
    "sglang.srt.speculative.spec_registry.CustomSpecAlgo.handle_server_args": "(self, server_args)",
    "sglang.srt.speculative.spec_registry.CustomSpecAlgo.create_worker": "(self, server_args)",
    # duck-typed enum methods DynVocabAlgo re-implements
    "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.create_future_map": (
        "(self, device, req_to_token_pool, needs_cpu_seq_lens=True, needs_confidence_relay=False)"
    ),
    "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.build_disagg_draft_input": (
        "(self, batch, last_tokens_tensor, future_map)"
    ),
    "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.need_topk": "(self)",
    "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.carries_draft_hidden_states": "(self)",
    "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.get_platform_worker_cls": "(self)",
    "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.supports_grammar_overlap": "(self)",
    # EAGLE defaults (a private helper, called with the resolution stand-in)
    "sglang.srt.arg_groups.speculative_hook._handle_eagle_family": "(server_args)",
    # the --speculative-dynvocab-config flag (HookRegistry AFTER hooks)
    "sglang.srt.server_args.ServerArgs.add_cli_args": "(parser)",
    "sglang.srt.server_args.ServerArgs.from_cli_args": "(args)",
    # --speculative-adaptive for DYNVOCAB (an AROUND hook, integration/plugin.py)
    "sglang.srt.speculative.adaptive_spec_params.adaptive_unsupported_reason": "(server_args)",
    # Engine's keyword: an AFTER hook that wraps Engine.server_args_class (the engine module itself is not
    # imported to check it: seconds in processes that never build an Engine)
    "sglang.srt.plugins.load_plugins": "()",
}

WORKER = {
    # integration/worker.py subclasses; the __init__ copy is from-sglang/eagle_worker_v2.py
    "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.__init__": (
        "(self, server_args, gpu_id, nccl_port, target_worker)"
    ),
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.__init__": (
        "(self, server_args, gpu_id, nccl_port, target_worker)"
    ),
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.alloc_memory_pool": (
        "(self, memory_pool_config=None, req_to_token_pool=None, token_to_kv_pool_allocator=None)"
    ),
    # init_lm_head runs inside alloc_memory_pool (hot_token_id is read after it)
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.init_lm_head": "(self)",
    # copied and trimmed in dynvocab_draft.py (the compact top-k) and dynvocab_worker.py (prefill event)
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft_forward": "(self, forward_batch)",
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_prefill": (
        "(self, batch, target_hidden_states, next_token_ids, mm_input_embeds=None, kv_loc_plan=None)"
    ),
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_decode": (
        "(self, batch, batch_result, *, kv_loc_plan=None)"
    ),
    # called by the copies
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_forward_idle": "(self, forward_batch, spec_info)",
    "sglang.srt.speculative.spec_utils.select_top_k_tokens": "(i, topk_p, topk_index, hidden_states, scores, topk)",
    "sglang.srt.speculative.eagle_utils.organize_draft_results": (
        "(score_list, token_list, parents_list, num_draft_token)"
    ),
    "sglang.srt.speculative.eagle_utils.per_step_draft_out_cache_loc": "(out_cache_loc, batch_size, topk, num_steps)",
    "sglang.srt.speculative.eagle_utils._eagle_prefill_tail_tokens": "(batch, next_token_ids)",
    "sglang.srt.speculative.eagle_worker_common.prepare_for_draft_extend": (
        "(draft_extend_input, batch, predict, num_draft_tokens, draft_model_runner, cuda_graph_runner, *, "
        "return_hidden_states_before_norm, widened_out_cache_loc=None, widened_positions=None, kv_loc_plan=None)"
    ),
    "sglang.srt.speculative.eagle_info.EagleDraftInput.__init__": (
        "(self, topk_p=None, topk_index=None, draft_probs=None, hidden_states=None, "
        "capture_hidden_mode=<CaptureHiddenMode.FULL: 2>, dsa_topk_indices=None, bonus_tokens=None, kv_indptr=None, "
        "kv_indices=None, window_kv_indptr=None, window_kv_indices=None, num_tokens_per_req=-1, "
        "num_tokens_for_logprob_per_req=-1, future_indices=None, future_dsa_topk_indices_available=False, "
        "cuda_graph_compatible=True)"
    ),
    "sglang.srt.speculative.eagle_info.EagleDraftExtendInput.__init__": (
        "(self, hidden_states=None, num_correct_drafts=None, num_accept_tokens=None, num_front_tokens=0, "
        "num_accept_tokens_cpu=None, input_ids=None, seq_lens=None, seq_lens_cpu=None, req_pool_indices=None, "
        "positions=None, bonus_tokens=None, capture_hidden_mode=<CaptureHiddenMode.LAST: 1>, num_tokens_per_req=-1, "
        "num_tokens_for_logprob_per_req=1, dsa_seed_topk_capture=None, dsa_seed_topk_select=None, select_index=None, "
        "kv_indptr=None)"
    ),
    "sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new": (
        "(batch, model_runner, *, capture_hidden_mode=None, return_hidden_states_before_norm, "
        "extend_position_info=None, spec_mrope_positions=None, kv_loc_plan=None, write_cols=None)"
    ),
    "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation": (
        "(self, batch, forward_batch=None, pp_proxy_tensors=None, is_verify=False, skip_attn_backend_init=None, *, "
        "capture_hidden_mode=None, return_kv_loc_plan=False)"
    ),
    # the stepwise processor (integration/worker.py) overrides both
    "sglang.srt.layers.logits_processor.LogitsProcessor.forward": (
        "(self, input_ids, hidden_states, lm_head, logits_metadata, aux_hidden_states=None, "
        "hidden_states_before_norm=None)"
    ),
    "sglang.srt.layers.logits_processor.LogitsProcessor._get_logits": (
        "(self, hidden_states, lm_head, logits_metadata, embedding_bias=None, use_logits_buffer=True)"
    ),
    # telemetry (integration/telemetry.py): the finished-request hook and the request-level keys
    "sglang.srt.speculative.base_spec_worker.BaseSpecWorker.note_request_finished": "(self, *, rid, natural_stop)",
    "sglang.srt.managers.scheduler_components.output_streamer.SchedulerOutputStreamer."
    "is_request_level_customized_info_key": "(self, key)",
    "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.verify": (
        "(self, batch, pp_proxy_tensors=None, grammar_barrier=None)"
    ),
    "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2._forward_prefill_batch": (
        "(self, batch, on_publish=None, pp_proxy_tensors=None, coordination_plan=None)"
    ),
    # adaptive steps: built by the __init__ copy; state switches are EAGLEWorkerV2's own, on DYNVOCAB's draft worker
    "sglang.srt.speculative.adaptive_runtime_state.AdaptiveController.__init__": "(self, worker, policy)",
    "sglang.srt.speculative.adaptive_spec_params.AdaptiveSpeculativeParams.__init__": (
        "(self, initial_steps, cfg_path=None)"
    ),
    "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.apply_runtime_state": "(self, state)",
    "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.build_adaptive_runtime_state": (
        "(self, speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs=None)"
    ),
    "sglang.srt.speculative.base_spec_worker.EagleDraftWorkerBase._rebuild_topk1_chain_buffers": "(self)",
    # the prefill event reads a radix-cache hit's ids (integration/worker.py)
    "sglang.srt.managers.schedule_batch.Req.get_fill_ids": "(self)",
    # built by DynVocabAlgo.create_future_map
    "sglang.srt.managers.overlap_utils.FutureMap.__init__": (
        "(self, device, spec_algo, req_to_token_pool, needs_cpu_seq_lens=True, needs_confidence_relay=False)"
    ),
}

# The hooks of patches/sglang-draft-topk-hook.diff (at the repository's top level): checked where the
# installed SGLang has them (``has_draft_topk_hook``), and then the copies above are not used.
HOOK = {
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.set_draft_topk_hook": "(self, hook)",
    "sglang.srt.speculative.eagle_worker_v2.DraftTopKHook.before_draft_forward": "(self, forward_batch, step)",
    "sglang.srt.speculative.eagle_worker_v2.DraftTopKHook.draft_topk": "(self, logits, topk, forward_batch, step, head_shape)",
    "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.on_target_prefill_complete": "(self, batch, batch_output)",
}

# sha256 of each target's dedented source, first 16 hex digits (``source_hash``). The copies that reproduce
# them run only without the hook, so only there does a changed body refuse to start.
BODIES = {
    # from-sglang/eagle_worker_v2.py: worker_init
    "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.__init__": "c2a239d611ea574d",
    # from-sglang/dynvocab_worker.py: forward_prefill_batch
    "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2._forward_prefill_batch": "02f54d97c0583548",
    # from-sglang/dynvocab_draft.py: draft_forward, draft_extend_for_prefill, draft_extend_for_decode
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft_forward": "cb3401a611401763",
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_prefill": "e40d5d998c164b16",
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_decode": "d7858851c429dd62",
}

# from-sglang/eagle3_topk1.py (tools/bench/heads.py's stock EAGLE3 step; the worker never runs it, so no start-up check)
KERNEL_BODIES = {
    "sglang.kernels.ops.speculative.topk1._draft_topk1_partial_argmax_kernel": "5022e764848cebd1",
    "sglang.kernels.ops.speculative.topk1._draft_topk1_finalize_kernel": "0b454a3d45d6c383",
    "sglang.kernels.ops.speculative.topk1.draft_topk1_postprocess": "b6e0dd2a22f40684",
}
