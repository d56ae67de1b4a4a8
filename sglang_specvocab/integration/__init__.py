"""The only package that imports SGLang (the version in ``copies/upstream.py``): the DYNVOCAB plug-in.

- ``plugin``: the entry point ``register()`` (``sglang.srt.plugins`` group), the
  ``--speculative-dynvocab-config`` flag and ``Engine``'s keyword; it imports SGLang only after its check;
- ``names``: the names DYNVOCAB gives SGLang (algorithm, flag, env var), free of SGLang;
- ``algorithm``: the spec class, EAGLE defaults and every refusal before start;
- ``worker``: the worker subclasses (imported lazily, in the scheduler);
- ``logits``, ``events``: the compact logits processor and the verify/prefill events.

Nothing is imported here, so ``import sglang_specvocab.integration`` stays free of SGLang.
"""
