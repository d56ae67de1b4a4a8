"""Adaptive Replacement Cache (Megiddo & Modha, FAST 2003) over token ids, one cache per request slot.

``BatchedARC(num_rows, capacity)`` keeps, for every request slot (row), an independent ARC(c)
with c = ``capacity``: resident lists T1 (seen once recently), T2 (seen at least twice), ghost
lists B1, B2 (ids recently evicted from T1, T2), and the adaptation target p in [0, c] for |T1|.
``access`` feeds each row its reference string column by column, exactly as the paper's
sequential algorithm would; rows advance in parallel.

Representation. Per row there are 2c entry slots (ARC never tracks more than 2c ids, since
|T1|+|T2| <= c and |T1|+|B1| <= c, so |T1|+|T2|+|B1|+|B2| <= 2c) with
- ``ids[r, s]`` the token id held by the slot (-1 if empty),
- ``key[r, s]`` = ``code << 56 | stamp``: ``code`` is the slot's list (EMPTY, T1, T2, B1, B2) and
  ``stamp`` the time of its last move. A list's LRU entry has the smallest stamp; moving an entry
  to a list's MRU end gives it a fresh, larger stamp. Packing both in one int64 makes "LRU of
  list L" a single ``argmin(key ^ (L << 56))``: entries of L keep just their stamp, every other
  entry (empty ones included) gets a nonzero code field and so a larger value;
and per row ``cnt[r, code]`` = each list's size (kept incrementally: recounting would cost four
passes over the slots per reference) and ``p``.
An id is in at most one list, so "x in L" is one equality scan of the row's ids. Slots only empty
in Case IV, which refills the freed slot with x at once, so the occupied slots of a row are
always exactly the first |T1|+|T2|+|B1|+|B2|: a miss that deletes nothing takes slot ``total``.
Each column of ``access`` is thus a fixed sequence of batched ops: one scan for x, one argmin for
the two LRUs a reference may need (the one REPLACE demotes, the one Case IV deletes), and
O(1)-per-row gathers/scatters for the moves. No host sync, no data-dependent shape, memory
O(num_rows x capacity) independent of the vocabulary size. Stamps come from a device-side clock
that advances one per column (2**56 columns before it could overflow into the code field).

Points where the paper leaves a choice, and what is done here:
- p is real-valued (delta1 = |B2|/|B1|, delta2 = |B1|/|B2| need not be integers). It is kept as
  float64 and ``|T1| == p`` in REPLACE is exact float equality, i.e. true only when p happens to be
  a whole number equal to |T1|; ``|T1| > p`` likewise compares with the unrounded p. p is never
  rounded or floored. float64 division and addition are correctly rounded (IEEE 754), so a
  Python-float reference reproduces p bit for bit.
- delta1 = max(|B2|/|B1|, 1) and delta2 = max(|B1|/|B2|, 1), i.e. the paper's "1 if |B1| >= |B2|
  else |B2|/|B1|" (and symmetric); the divisor is >= 1 in the case that uses it (x is in that list).
- REPLACE uses p after the case's update (the paper updates p first, then calls REPLACE), and in
  Case III "x in B2" is true at REPLACE time (x leaves B2 only afterwards).
- Case IV(A) with |T1| == c deletes the LRU of T1 outright (it does not become a B1 ghost).
- REPLACE on an empty list cannot happen under ARC's invariants (once |T1|+|T2|+|B1|+|B2| >= c the
  cache T1 u T2 stays full); should it, the batched code skips the move instead of corrupting a slot.
- All rows share one stamp per ``access`` column, and the entry REPLACE demotes gets the same stamp
  as x; they land in different lists (B* vs T*), and recency is only compared within one list.
- Rows passed to one call must be distinct (as for ``index_copy_``); a negative token is a no-op
  for its row in that column (no list, p or stamp changes).
"""

from __future__ import annotations

import torch

EMPTY, T1, T2, B1, B2 = 0, 1, 2, 3, 4
_LIST_NAMES = {T1: "T1", T2: "T2", B1: "B1", B2: "B2"}
_SHIFT = 56  # key = code << _SHIFT | stamp
_STAMP_MASK = (1 << _SHIFT) - 1
_NEVER = torch.iinfo(torch.int64).max  # sort key after every id


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"BatchedARC: {name} = {value!r} is invalid: must be an integer >= 1")
    return value


class BatchedARC:
    """``num_rows`` independent ARC caches of ``capacity`` token ids each, updated in batches."""

    def __init__(self, num_rows: int, capacity: int, *, device: torch.device | str | None = None) -> None:
        num_rows = _positive_int("num_rows", num_rows)
        self.capacity = c = _positive_int("capacity", capacity)
        self.ids = torch.full((num_rows, 2 * c), -1, dtype=torch.int64, device=device)
        self.key = torch.zeros((num_rows, 2 * c), dtype=torch.int64, device=device)  # all EMPTY
        self.cnt = torch.zeros((num_rows, 5), dtype=torch.int64, device=device)  # list sizes, by code
        self.p = torch.zeros(num_rows, dtype=torch.float64, device=device)
        # Device-side, so stamps keep increasing across calls without a host counter (which a
        # captured CUDA graph would also freeze).
        self.clock = torch.zeros((), dtype=torch.int64, device=device)

    @property
    def num_rows(self) -> int:
        return self.ids.shape[0]

    @property
    def device(self) -> torch.device:
        return self.ids.device

    # -- public API --------------------------------------------------------------------------

    def reset(self, rows: torch.Tensor) -> None:
        """Empty the caches of ``rows`` (all four lists) and set their p to 0."""
        rows = self._rows(rows)
        self.ids.index_fill_(0, rows, -1)
        self.key.index_fill_(0, rows, EMPTY)
        self.cnt.index_fill_(0, rows, 0)
        self.p.index_fill_(0, rows, 0.0)

    def access(self, rows: torch.Tensor, tokens: torch.Tensor) -> None:
        """Reference ``tokens[i, j]`` in row ``rows[i]``, columns in order; negative ids are no-ops."""
        rows = self._rows(rows)
        tokens = self._tokens(rows, tokens, "access")
        if tokens.shape[1] == 0:
            return
        # Work on gathered copies of the rows for all columns, then write back once.
        ids = self.ids.index_select(0, rows)
        key = self.key.index_select(0, rows)
        cnt = self.cnt.index_select(0, rows)
        p = self.p.index_select(0, rows)
        for j in range(tokens.shape[1]):
            # One fresh stamp per column, larger than every stamp given before.
            p = self._step(ids, key, cnt, p, tokens[:, j], self.clock + (j + 1))
        self.clock += tokens.shape[1]
        self.ids.index_copy_(0, rows, ids)
        self.key.index_copy_(0, rows, key)
        self.cnt.index_copy_(0, rows, cnt)
        self.p.index_copy_(0, rows, p)

    def members(self, rows: torch.Tensor) -> torch.Tensor:
        """int64 [B, capacity]: the ids resident in T1 u T2 of each row, ascending, then -1 padding."""
        srt = self._resident_sorted(self._rows(rows))[:, : self.capacity]
        return torch.where(srt == _NEVER, -1, srt)

    def contains(self, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """bool [B, n]: whether ``tokens[i, j]`` is resident (T1 u T2) in row ``rows[i]``; negatives False."""
        rows = self._rows(rows)
        tokens = self._tokens(rows, tokens, "contains").long()
        srt = self._resident_sorted(rows)
        # Binary search in the sorted resident ids: O(n log c) per row instead of an n x 2c compare.
        pos = torch.searchsorted(srt, tokens.clamp(min=0).contiguous()).clamp(max=srt.shape[1] - 1)
        return (srt.gather(1, pos) == tokens) & (tokens >= 0)

    def lists(self, row: int) -> dict[str, list[int]]:
        """Debug/test helper (host sync): row's lists T1, T2, B1, B2 as id lists, LRU -> MRU."""
        out: dict[str, list[int]] = {name: [] for name in _LIST_NAMES.values()}
        for k, t in sorted(zip(self.key[row].tolist(), self.ids[row].tolist(), strict=True)):
            if k >> _SHIFT != EMPTY:
                out[_LIST_NAMES[k >> _SHIFT]].append(t)
        return out

    # -- internals ---------------------------------------------------------------------------

    def _rows(self, rows: torch.Tensor) -> torch.Tensor:
        if not isinstance(rows, torch.Tensor) or rows.dim() != 1 or rows.dtype.is_floating_point:
            raise ValueError(f"BatchedARC: rows must be a 1-D integer tensor, got {rows!r}")
        return rows.to(device=self.device, dtype=torch.int64)

    def _tokens(self, rows: torch.Tensor, tokens: torch.Tensor, what: str) -> torch.Tensor:
        if (
            not isinstance(tokens, torch.Tensor)
            or tokens.dim() != 2
            or tokens.shape[0] != rows.shape[0]
            or tokens.dtype.is_floating_point
            or tokens.dtype == torch.bool
        ):
            shape = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
            raise ValueError(f"BatchedARC.{what}: tokens must be an integer tensor [{rows.shape[0]}, n], got {shape}")
        return tokens.to(self.device)

    def _resident_sorted(self, rows: torch.Tensor) -> torch.Tensor:
        """[B, 2c] int64: resident ids ascending, then _NEVER (at most c entries are resident)."""
        key = self.key.index_select(0, rows)
        resident = (key >= T1 << _SHIFT) & (key < (T2 + 1) << _SHIFT)
        return torch.sort(torch.where(resident, self.ids.index_select(0, rows), _NEVER), dim=1).values

    def _step(self, ids, key, cnt, p, x, now):
        """One column: row i references ``x[i]`` (no-op where negative).

        Updates the row copies ``ids``, ``key``, ``cnt`` in place; returns the new p.
        """
        c = self.capacity
        x = x.long()
        act = x >= 0

        # Where is x? Empty slots hold -1 and an id is in at most one list: at most one match.
        # (argmax of the uint8 view, then a gather to confirm: bool max(dim) enters a parallel
        # region even on tiny inputs, which costs milliseconds on a busy CPU.)
        hit_slot = (ids == x[:, None]).view(torch.uint8).argmax(1)
        found = act & (ids.gather(1, hit_slot[:, None]).squeeze(1) == x)
        hit_list = torch.where(found, key.gather(1, hit_slot[:, None]).squeeze(1) >> _SHIFT, EMPTY)

        n1, n2, nb1, nb2 = cnt[:, T1], cnt[:, T2], cnt[:, B1], cnt[:, B2]
        total = n1 + n2 + nb1 + nb2

        # Case I (hit in T1 u T2) needs no mask of its own: x just moves to T2's MRU below.
        case2 = found & (hit_list == B1)
        case3 = found & (hit_list == B2)
        case4 = act & ~found

        # Adaptation (Cases II, III); the divisor is >= 1 wherever the value is used.
        delta1 = torch.clamp(nb2.double() / nb1.clamp(min=1).double(), min=1.0)
        delta2 = torch.clamp(nb1.double() / nb2.clamp(min=1).double(), min=1.0)
        p = torch.where(case2, torch.clamp(p + delta1, max=float(c)), p)
        p = torch.where(case3, torch.clamp(p - delta2, min=0.0), p)

        # Case IV: (A) |T1|+|B1| == c, (B) otherwise with total >= c.
        case4a = case4 & (n1 + nb1 == c)
        del_b1 = case4a & (n1 < c)
        del_t1 = case4a & (n1 == c)
        case4b = case4 & ~case4a & (total >= c)
        del_b2 = case4b & (total == 2 * c)
        dele = del_b1 | del_t1 | del_b2
        del_list = torch.where(del_b1, B1, torch.where(del_t1, T1, B2))

        # REPLACE(x, p), with p after this reference's update: LRU of T1 -> MRU of B1, or LRU of
        # T2 -> MRU of B2. Deleting a ghost first changes neither |T1| nor the T-lists' LRUs.
        n1f = n1.double()
        from_t1 = (n1 > 0) & ((case3 & (n1f == p)) | (n1f > p))
        src = torch.where(from_t1, T1, T2)
        dst = torch.where(from_t1, B1, B2)
        # (the source is never empty under ARC's invariants; the guard keeps a slot uncorrupted)
        do_rep = (case2 | case3 | del_b1 | case4b) & (cnt.gather(1, src[:, None]).squeeze(1) > 0)

        # Both LRUs in one pass over the slots: [B, 2, 2c] -> [B, 2].
        codes = torch.stack([src, del_list], 1) << _SHIFT
        lru = (key[:, None, :] ^ codes[:, :, None]).argmin(2)
        rep_slot, del_slot = lru[:, 0], lru[:, 1]

        # REPLACE's move first; its slot is a T-list LRU, never x's slot.
        self._put(key, rep_slot, dst << _SHIFT | now, do_rep)

        # x -> MRU of T1 on a miss, of T2 otherwise. A miss takes the deleted entry's slot (so the
        # deletion needs no write of its own), else the first never-used one: slots 0 .. total-1
        # are occupied, and a miss without deletion has total < 2c.
        free_slot = torch.where(dele, del_slot, total.clamp(max=2 * c - 1))
        x_slot = torch.where(found, hit_slot, free_slot)
        x_list = torch.where(case4, T1, T2)
        self._put(ids, x_slot, x, act)
        self._put(key, x_slot, x_list << _SHIFT | now, act)

        # List sizes: x leaves its list (if any) and joins x_list; REPLACE moves one from src to dst;
        # a deletion removes one from del_list. Masked-out moves add 0.
        idx = torch.stack([hit_list, x_list, src, dst, del_list], 1)
        val = torch.stack([-found.long(), act.long(), -do_rep.long(), do_rep.long(), -dele.long()], 1)
        cnt.scatter_add_(1, idx, val)
        return p

    @staticmethod
    def _put(t: torch.Tensor, slot: torch.Tensor, value: torch.Tensor, mask: torch.Tensor) -> None:
        """``t[i, slot[i]] = value[i]`` where ``mask[i]``, in O(rows): masked-out rows rewrite their old value."""
        slot = slot[:, None]
        t.scatter_(1, slot, torch.where(mask[:, None], value[:, None], t.gather(1, slot)))


__all__ = ["BatchedARC"]
