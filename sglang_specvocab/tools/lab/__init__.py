"""The policy lab on the CPU: the reference speculative decoder over Hugging Face models and its tools.

``decoder`` (the oracle the SGLang integration is checked against), ``runner`` and ``report`` (the
``lab`` command), ``replay`` (recorded events through a policy), ``align`` (EvoSpec's online LoRA),
``training`` (rankers and routers from recorded draft states), ``frequency`` (the ``build-freq``
command), ``models`` and ``convert_gemma3`` (Gemma-3 270M from its PyPI GGUF). Never imported by the core.
"""
