"""Literal, per-request Python statements of the policies' selection rules (test oracles)."""


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
        self.cap, self.kpre, self.kver, self.sources, self.fallback = capacity, prefill_topk, verify_topk, sources, fallback
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
