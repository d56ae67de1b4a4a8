"""SGLang 0.5.23: the signatures of every SGLang callable the plug-in subclasses, overrides, wraps or
calls by a private name, as ``inspect.signature`` prints them with annotations removed
(``sglang_specvocab.patches.signature_text``).

``PLUGIN`` is checked when the plug-in loads (these modules are imported by registration anyway);
``WORKER`` is checked the first time the worker classes are needed (``create_worker``, in the
scheduler process, before any weights load), or at plug-in load where the worker modules are
already imported. Regenerate with ``python -m sglang_specvocab.patches`` after reading the new
SGLang source, never blindly.
"""

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
}

WORKER = {
    # integration/worker.py subclasses; the __init__ copy is in eagle_worker_v2.py next to this file
    "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.__init__": (
        "(self, server_args, gpu_id, nccl_port, target_worker)"
    ),
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.__init__": (
        "(self, server_args, gpu_id, nccl_port, target_worker)"
    ),
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.alloc_memory_pool": (
        "(self, memory_pool_config=None, req_to_token_pool=None, token_to_kv_pool_allocator=None)"
    ),
    # overridden by the final wiring (the worker raises NotImplementedError there today)
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.init_lm_head": "(self)",
    "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.verify": (
        "(self, batch, pp_proxy_tensors=None, grammar_barrier=None)"
    ),
    "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2._forward_prefill_batch": (
        "(self, batch, on_publish=None, pp_proxy_tensors=None, coordination_plan=None)"
    ),
    # built by DynVocabAlgo.create_future_map
    "sglang.srt.managers.overlap_utils.FutureMap.__init__": (
        "(self, device, spec_algo, req_to_token_pool, needs_cpu_seq_lens=True, needs_confidence_relay=False)"
    ),
}
