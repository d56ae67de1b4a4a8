"""Literal, per-request Python statements of the policies' selection rules (test oracles)."""

from collections import OrderedDict


def unique_first(ids):
    seen, out = set(), []
    for t in ids:
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


class LiteralWindow:
    """MicroSpec's window for one request: a Python list stream and a set of its suffix."""

    def __init__(self, capacity, prefill_topk, verify_topk, sources, fallback=0):
        self.cap, self.kpre, self.kver, self.sources, self.fallback = (
            capacity,
            prefill_topk,
            verify_topk,
            sources,
            fallback,
        )
        self.stream = []

    def prefill(self, prompt_ids, prompt_topk):
        if "context" in self.sources:
            self.stream += list(prompt_ids)
        if "extension" in self.sources and self.kpre:
            self.stream += unique_first([t for pos in prompt_topk for t in pos[: self.kpre]])

    def verify(self, draft_tokens, verify_topk):
        if "context" in self.sources:
            self.stream += unique_first(draft_tokens)
        if "extension" in self.sources and self.kver:
            self.stream += unique_first([t for pos in verify_topk for t in pos[: self.kver]])

    def active(self):
        return sorted(set(self.stream[-self.cap :])) or [self.fallback]


def frequent_set(freq_ids, size, eos):
    """FR-Spec: the ``size`` most frequent ids; missing EOS ids replace the rarest of them."""
    eos = list(dict.fromkeys(eos))[:size]
    top = list(freq_ids[:size])
    if all(e in top for e in eos):
        return sorted(top)
    others = [t for t in top if t not in eos]
    return sorted(others[: size - len(eos)] + eos)


def lowrank_set(approx_rows, topk):
    """SpecVocab, rows of one request share a set: top-k ids of the per-id maximum over rows."""
    best = [max(row[v] for row in approx_rows) for v in range(len(approx_rows[0]))]
    return sorted(sorted(range(len(best)), key=lambda v: -best[v])[:topk])


def cluster_budget(k0, k1, t):
    return k0 if t == 0 else k1 if t == 1 else max(1, (k1 + t) // (2 * t))


def cluster_set(score_rows, members, budget, capacity):
    """DynaSpec: the best ``budget`` clusters by the rows' maximum score, members in that order, cut at capacity."""
    best = [max(row[c] for row in score_rows) for c in range(len(members))]
    chosen = sorted(range(len(best)), key=lambda c: -best[c])[:budget]
    ids = [t for c in chosen for t in members[c]]
    return sorted(ids[:capacity])


def union_set(member_sets, capacity):
    return sorted(unique_first([t for s in member_sets for t in s])[:capacity])


class LiteralRetrieval:
    """EvoSpec for one request: static core + ARC-held retrieved ids (``arc`` is a LiteralARC)."""

    def __init__(self, core, arc, neighbours, successors):
        self.core, self.arc, self.nn, self.succ = set(core), arc, neighbours, successors

    def active(self):
        return sorted(self.core | set(self.arc.members()))

    def verify(self, verify_topk, accepted):
        active = set(self.active())
        for j, tok in enumerate(accepted):
            if tok < 0:  # a hole (an id the draft vocabulary lacks): no reference, no retrieval
                continue
            refs = [tok]
            if tok not in active:  # a miss: the token, its nearest rows, its successors
                refs += list(verify_topk[j][: self.nn]) if j < len(verify_topk) else []
                refs += [s for s in self.succ.get(tok, [])]
            for r in unique_first([r for r in refs if r >= 0 and r not in self.core]):
                self.arc.access(r)


class LiteralARC:
    """ARC(c) of Megiddo & Modha (FAST 2003), Fig. 4, for one request. Lists are LRU -> MRU."""

    def __init__(self, c):
        self.c = c
        self.p = 0.0
        self.T1, self.T2, self.B1, self.B2 = OrderedDict(), OrderedDict(), OrderedDict(), OrderedDict()

    def replace(self, x):
        if self.T1 and ((x in self.B2 and len(self.T1) == self.p) or len(self.T1) > self.p):
            old, _ = self.T1.popitem(last=False)
            self.B1[old] = None
        else:
            old, _ = self.T2.popitem(last=False)
            self.B2[old] = None

    def access(self, x):
        c = self.c
        if x in self.T1 or x in self.T2:  # Case I
            (self.T1 if x in self.T1 else self.T2).pop(x)
            self.T2[x] = None
        elif x in self.B1:  # Case II
            self.p = min(self.p + max(len(self.B2) / len(self.B1), 1), c)
            self.replace(x)
            self.B1.pop(x)
            self.T2[x] = None
        elif x in self.B2:  # Case III
            self.p = max(self.p - max(len(self.B1) / len(self.B2), 1), 0)
            self.replace(x)
            self.B2.pop(x)
            self.T2[x] = None
        else:  # Case IV
            l1 = len(self.T1) + len(self.B1)
            total = l1 + len(self.T2) + len(self.B2)
            if l1 == c:  # (A)
                if len(self.T1) < c:
                    self.B1.popitem(last=False)
                    self.replace(x)
                else:
                    self.T1.popitem(last=False)
            elif total >= c:  # (B)
                if total == 2 * c:
                    self.B2.popitem(last=False)
                self.replace(x)
            self.T1[x] = None

    def lists(self):
        return {"T1": list(self.T1), "T2": list(self.T2), "B1": list(self.B1), "B2": list(self.B2)}

    def members(self):
        return set(self.T1) | set(self.T2)


def literal_pack_update(packed, packed_ids, weight, ids, cnt, rows):
    """MicroSpec's asynchronous gathering, one slot at a time, in place on the tensors (rules as stated)."""
    W = packed_ids.shape[1]
    for s in [int(r) for r in rows]:
        slot_ids = packed_ids[s].tolist()
        c_old = sum(1 for t in slot_ids if t >= 0)
        assert all(t >= 0 for t in slot_ids[:c_old]), "live slots are a prefix"
        c = int(cnt[s])
        N = set(ids[s, :c].tolist())
        old = set(slot_ids[:c_old])
        leaving = [j for j in range(c_old) if slot_ids[j] not in N]
        survivors = [j for j in range(c_old) if slot_ids[j] in N]
        entering = [t for t in ids[s, :c].tolist() if t not in old]
        free = [j for j in range(c) if j in leaving or j >= c_old]
        fillers = [("weight", t) for t in entering] + [("slot", j) for j in survivors if j >= c]
        # |N| = c = survivors + entering; the free slots are the c slots below c minus the survivors there.
        assert len(free) == len(fillers)
        for slot, (kind, x) in zip(free, fillers, strict=True):
            if kind == "weight":
                packed_ids[s, slot] = x
                packed[s, slot] = weight[x]
            else:  # a survivor at x >= c moves down; x is above every free slot, so nothing it reads is overwritten
                packed_ids[s, slot] = slot_ids[x]
                packed[s, slot] = packed[s, x]
        for j in range(c, W):
            packed_ids[s, j] = -1


def literal_logits(hidden, weight, ids, cnt, row_to_slot, row_map=None):
    """The head's compact logits as stated, one element at a time in fp64: row m over its slot s's set (one slot per
    ``M // len(row_to_slot)`` consecutive rows); column j is -inf past cnt[s] or where its head row (the id, or
    ``row_map[id]``) is negative (a dead column), else the dot product."""
    import torch

    M, W = hidden.shape[0], ids.shape[1]
    per = M // len(row_to_slot)
    out = torch.full((M, W), float("-inf"), dtype=torch.float64)
    for m in range(M):
        s = int(row_to_slot[m // per])
        for j in range(int(cnt[s])):
            t = int(ids[s, j])
            if t >= 0 and row_map is not None:
                t = int(row_map[t])
            if t >= 0:
                out[m, j] = float(weight[t].double() @ hidden[m].double())
    return out


def mapped_case(seed, dtype, bs, n, R=5, W=9, d=16, V=40, H=24):
    """A d2t-like head: table ids are target ids in [0, V), the head has H rows, row_map [V] sends an id to its row
    (-1 for the ids the head lacks); request-major rows, n per request, one slot per request (int64, SGLang's)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(bs * n, d, generator=g).to(dtype)
    weight = torch.randn(H, d, generator=g).to(dtype)
    row_map = torch.full((V,), -1, dtype=torch.int32)
    row_map[torch.randperm(V, generator=g)[:H]] = torch.arange(H, dtype=torch.int32)
    ids = torch.randint(0, V, (R, W), generator=g, dtype=torch.int32)
    ids[torch.rand(R, W, generator=g) < 0.1] = -1
    cnt = torch.randint(1, W + 1, (R,), generator=g, dtype=torch.int32)
    rows = torch.randint(0, R, (bs,), generator=g, dtype=torch.int64)
    return hidden, weight, ids, cnt, rows, row_map


def runs_to_slots(lengths, num_slots, seed=0):
    """row_to_slot for consecutive runs of the given lengths: each run one slot, neighbours different
    (so the runs stay separate), slots reused by runs further apart."""
    import random

    rng = random.Random(seed)
    slots, prev = [], -1
    for n in lengths:
        s = rng.choice([x for x in range(num_slots) if x != prev] or [prev])
        slots += [s] * n
        prev = s
    return slots


def literal_head_topk(hidden, weight, sets, rows, k, fallback, *, batch="per-request", tokens_of=None, keep=None):
    """The head's top-k as stated, one row at a time in fp64: ``[(value, token)] * k`` per hidden row.

    ``sets[s]``: the token ids of slot s's set; ``rows``: the requests' slots, request-major (len(hidden) // len(rows)
    rows each). The row's candidates: its request's set (``per-request``, a union seen ``own``), the batch's union
    (``union-all``) or every head row (``stock``). ``tokens_of[r]``: the token of head row r (default: r), and the
    head row of a token is its index there (a token with none has no score). ``keep``: the tokens the union kept
    (overflow drops the rest). Order: value descending, then token id ascending; past the candidates, (-inf, fallback).
    """
    tokens_of = list(range(len(weight))) if tokens_of is None else list(tokens_of)
    row_of = {t: r for r, t in enumerate(tokens_of)}
    n = len(hidden) // len(rows)
    union = sorted(set().union(*(sets[int(s)] for s in rows)))
    out = []
    for m in range(len(hidden)):
        own = sets[int(rows[m // n])]
        cand = {"per-request": own, "union-own": own, "union-all": union, "stock": tokens_of}[batch]
        if keep is not None and batch.startswith("union"):
            cand = [t for t in cand if t in keep]
        scored = []
        for t in sorted(set(cand)):
            if t in row_of:
                scored.append((float(weight[row_of[t]].double() @ hidden[m].double()), t))
        scored.sort(key=lambda p: (-p[0], p[1]))
        scored += [(float("-inf"), fallback)] * max(0, k - len(scored))
        out.append(scored[:k])
    return out


def literal_table_reads(hidden, rows_of, cnt, row_to_slot, W):
    """The logits ops over a table that may break its contract, one element at a time in fp64: ``(out, bad)``.

    ``rows_of(s, j)`` is column j's head row of slot s (a tensor), None for a dead column (a negative id), or
    "bad" (an id >= V). Row m with slot s outside [0, R) reads nothing and counts 1; else a count c outside
    [1, W] counts 1 and reads min(max(c, 0), W) columns; each bad column within them counts 1; -inf wherever
    nothing is read."""
    import torch

    M, R = hidden.shape[0], cnt.shape[0]
    out = torch.full((M, W), float("-inf"), dtype=torch.float64)
    bad = 0
    for m in range(M):
        s = int(row_to_slot[m])
        if not 0 <= s < R:
            bad += 1
            continue
        c = int(cnt[s])
        if not 1 <= c <= W:
            bad += 1
        for j in range(min(max(c, 0), W)):
            row = rows_of(s, j)
            if isinstance(row, str):
                bad += 1
            elif row is not None:
                out[m, j] = float(row.double() @ hidden[m].double())
    return out, bad
