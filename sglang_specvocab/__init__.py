"""sglang-specvocab: dynamic draft vocabularies for speculative decoding.

The policies, the candidate table and the head are pure torch; only
``sglang_specvocab.integration`` imports SGLang.
"""

from .errors import ConfigError, SpecVocabError, TraceError

__version__ = "0.1.0"
__all__ = ["ConfigError", "SpecVocabError", "TraceError", "__version__"]
