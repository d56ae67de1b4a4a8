"""Python face of the head ops. Today: the torch reference; faster backends register here."""

from .reference import compact_topk, indexed_logits

__all__ = ["compact_topk", "indexed_logits"]
