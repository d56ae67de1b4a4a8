"""The dynamic draft head: logits over each row's candidate set, top-k as token ids.

``DraftHead(weight, table)`` computes compact logits ``[M, W]`` for M hidden rows, row m over
the set of slot ``row_to_slot[m]``; with no table (the ``full`` policy) it is the dense head
over the whole vocabulary, where a column is its token id.

Two modes (``head.mode``): ``fused`` gathers each request's candidate rows of the LM head
inside the logits kernel; ``packed`` (MicroSpec's asynchronous gathering) keeps them in a
per-request buffer ``[R, W, d]`` that ``refresh(rows)`` brings up to date after each set
change, copying only the rows that entered, on a side CUDA stream. The head waits for that
copy just before it runs; a caller that replays the head inside a CUDA graph calls ``wait()``
before the replay instead (a graph cannot wait on an event recorded outside it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import ops
from .table import CandidateTable


@dataclass
class HeadOutput:
    """Logits of one head call and how to read their columns as token ids."""

    logits: torch.Tensor  # fp32 [M, W] (compact) or [M, V] (dense); -inf past a row's count
    ids: torch.Tensor | None  # the column -> token id map [R, W]; None when dense
    row_to_slot: torch.Tensor | None  # int32 [M]; None when dense
    fallback_id: int = 0  # the token of a column past a row's count (packed ids hold -1 there)

    def topk(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(values ``[M, k]``, token ids int64 ``[M, k]``), best first."""
        if self.ids is None:
            return self.logits.topk(k, dim=1)
        values, tokens = ops.compact_topk(self.logits, self.ids, self.row_to_slot, k)
        return values, torch.where(tokens >= 0, tokens, self.fallback_id)


class DraftHead:
    def __init__(
        self,
        weight: torch.Tensor,
        table: CandidateTable | None,
        *,
        logit_softcap: float | None = None,
        kernel: str = "auto",
        mode: str = "fused",
    ):
        if mode not in ("fused", "packed"):
            raise ValueError(f"DraftHead: mode = {mode!r} is invalid: must be 'fused' or 'packed'")
        if mode == "packed" and table is None:
            raise ValueError("DraftHead: mode 'packed' needs a candidate table (the dense head has no sets)")
        self.weight = weight
        self.table = table
        self.logit_softcap = logit_softcap
        self.mode = mode
        if table is None:
            return
        self._logits = ops.implementation(
            kernel, weight.device, "indexed_logits" if mode == "fused" else "packed_logits"
        )
        if mode == "packed":
            R, W, d = table.num_rows, table.capacity, weight.shape[1]
            self.packed = weight.new_zeros((R, W, d))
            self.packed_ids = torch.full((R, W), -1, dtype=torch.int32, device=weight.device)
            self._pack = ops.implementation(ops.update_backend(kernel), weight.device, "pack_update")
            on_gpu = weight.device.type == "cuda"
            self._stream = torch.cuda.Stream(weight.device) if on_gpu else None
            self._ready = torch.cuda.Event() if on_gpu else None
            self.refresh(torch.arange(R, device=weight.device))

    def refresh(self, rows: torch.Tensor) -> None:
        """After the sets of ``rows`` changed: bring their packed rows up to date (packed mode)."""
        if self.mode != "packed":
            return
        t = self.table
        if self._stream is None:
            self._pack(self.packed, self.packed_ids, self.weight, t.ids, t.cnt, rows)
            return
        # The copy starts once the set update queued before it is done, and runs beside the
        # draft's other work; rows stays alive for the side stream until the copy ends.
        self._stream.wait_stream(torch.cuda.current_stream(self.weight.device))
        with torch.cuda.stream(self._stream):
            self._pack(self.packed, self.packed_ids, self.weight, t.ids, t.cnt, rows)
            self._ready.record(self._stream)
        rows.record_stream(self._stream)

    def wait(self) -> None:
        """Order the current stream after the last ``refresh`` (outside CUDA-graph capture)."""
        if self.mode == "packed" and self._ready is not None:
            torch.cuda.current_stream(self.weight.device).wait_event(self._ready)

    def __call__(self, hidden: torch.Tensor, row_to_slot: torch.Tensor) -> HeadOutput:
        hidden = hidden.to(self.weight.dtype)
        if self.table is None:
            out = HeadOutput((hidden @ self.weight.T).float(), None, None)
        else:
            slot = row_to_slot.to(torch.int32)
            t = self.table
            if self.mode == "fused":
                logits = self._logits(hidden, self.weight, t.ids, t.cnt, slot)
                out = HeadOutput(logits, t.ids, slot, t.fallback_id)
            else:
                if not (hidden.is_cuda and torch.cuda.is_current_stream_capturing()):
                    self.wait()
                out = HeadOutput(self._logits(hidden, self.packed, t.cnt, slot), self.packed_ids, slot, t.fallback_id)
        if self.logit_softcap:  # Gemma-2 style soft-capping: monotonic, so top-k is unchanged
            c = self.logit_softcap
            out.logits = torch.tanh(out.logits / c) * c
        return out
