"""What every policy implements: react to decoding events by writing the candidate table.

Events carry batched, padded tensors keyed by request slot; negative ids are padding:
- ``rows``: int64 ``[B]`` distinct request slots (SGLang's ``req_pool_indices``);
- ``on_prefill``: ``prompt_ids[B, L]`` (a prompt or one chunk of it), ``prompt_topk[B, L, K]``
  the target's top-K ids after each prompt position (rank order), or None when the policy
  asks for none (``prefill_topk == 0``);
- ``on_verify``: ``draft_tokens[B, T]`` the round's draft-tree tokens (root first),
  ``verify_topk[B, P, K]`` the target's top-K ids at the verified positions (the accepted
  tokens and the bonus token, in order), ``accepted[B, A]`` the tokens the round committed.

Per-round code is tensor code only: no Python loop over tokens or requests, no ``.item()``,
``.cpu()`` or ``.tolist()``, so it runs unchanged on CUDA tensors and inside the decode loop.
"""

from __future__ import annotations

import torch

from ..config import PolicyConfig
from ..table import CandidateTable


class Policy:
    """Base class; context policies override the ``on_*`` events."""

    name = "base"
    #: True when the head must use the whole vocabulary (no table).
    dense = False

    def __init__(self, config: PolicyConfig, table: CandidateTable | None) -> None:
        self.config = config
        self.table = table

    @property
    def prefill_topk(self) -> int:
        """How many target top-K ids per prompt position ``on_prefill`` needs (0: none)."""
        return 0

    @property
    def verify_topk(self) -> int:
        """How many target top-K ids per verified position ``on_verify`` needs (0: none)."""
        return 0

    def on_reset(self, rows: torch.Tensor) -> None:
        if self.table is not None:
            self.table.reset(rows)

    def on_prefill(self, rows: torch.Tensor, prompt_ids: torch.Tensor, prompt_topk: torch.Tensor | None) -> None:
        pass

    def on_verify(
        self,
        rows: torch.Tensor,
        draft_tokens: torch.Tensor,
        verify_topk: torch.Tensor | None,
        accepted: torch.Tensor,
    ) -> None:
        pass
