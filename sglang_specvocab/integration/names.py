"""The names DYNVOCAB gives SGLang, importable without SGLang: the plug-in's entry module reads them before it has
checked that the installed SGLang is one it supports (``plugin.register``), so that module imports no SGLang."""

from __future__ import annotations

NAME = "DYNVOCAB"
FLAG = "--speculative-dynvocab-config"
ENV = "SGLANG_DYNVOCAB_CONFIG"
#: Where the flag's value (or the keyword ``speculative_dynvocab_config=`` of ``sglang.Engine``, see
#: ``plugin.EngineServerArgs``) travels inside ``ServerArgs``: a bookkeeping attribute, which SGLang pickles
#: with the record's ``__dict__`` to the scheduler processes.
ATTR = "_dynvocab_config"
DEFAULT_CONFIG = "microspec.yaml"

__all__ = ["ATTR", "DEFAULT_CONFIG", "ENV", "FLAG", "NAME"]
