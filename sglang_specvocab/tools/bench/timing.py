"""Timing one op, the one way every kernel benchmark measures: ``make_timer(device, ...)``.

On a GPU (``CudaTimer``): the calls warm up eagerly on a side stream, then a CUDA graph holds
enough calls for about 50 us and is replayed between CUDA events; a sample is replay time / calls
(launch gaps inside a captured loop are in, host launch cost is out). ``graph=False`` times eager
calls between events instead. On a CPU (``CpuTimer``): ``time.perf_counter`` around each call.
Both rotate over the given calls (one per input set) and stop sampling after about ``max_ms``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Timing:
    samples_us: list[float]
    inner: int  # calls per sample
    graph: bool
    note: str | None = None


class CpuTimer:
    method = "time.perf_counter per call, no CUDA graphs (CPU)"

    def __init__(self, iters: int, warmup: int, max_ms: float) -> None:
        self.iters, self.warmup, self.max_ms = iters, warmup, max_ms

    def __call__(self, fns: list[Callable[[], object]]) -> Timing:
        n = len(fns)
        for i in range(max(self.warmup, n)):
            fns[i % n]()
        samples, spent = [], 0.0
        for i in range(self.iters):
            t0 = time.perf_counter()
            fns[i % n]()
            dt = time.perf_counter() - t0
            samples.append(dt * 1e6)
            spent += dt * 1e3
            if spent > self.max_ms and len(samples) >= min(10, self.iters):
                break
        return Timing(samples, 1, False)


class CudaTimer:
    method = "CUDA graph of several calls, replays between CUDA events; sample = replay time / calls"
    REPLAY_US = 50.0  # calls per graph: enough for about this much work
    MAX_INNER = 64
    MIN_ITERS = 10

    def __init__(self, device: torch.device, iters: int, warmup: int, max_ms: float, graph: bool) -> None:
        self.device, self.iters, self.warmup, self.max_ms, self.graph = device, iters, warmup, max_ms, graph
        if not graph:
            self.method = "eager calls between CUDA events (--no-graph); sample = time / calls"

    def _event(self) -> torch.cuda.Event:
        return torch.cuda.Event(enable_timing=True)

    def __call__(self, fns: list[Callable[[], object]]) -> Timing:
        n = len(fns)
        cur = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(cur)
        with torch.cuda.stream(side):  # compile/autotune and allocate outside any capture
            for i in range(max(self.warmup, n)):
                fns[i % n]()
        cur.wait_stream(side)
        torch.cuda.synchronize(self.device)
        a, b = self._event(), self._event()
        a.record()
        for f in fns:
            f()
        b.record()
        torch.cuda.synchronize(self.device)
        per_call_us = max(a.elapsed_time(b) * 1e3 / n, 1e-3)
        inner = min(self.MAX_INNER, max(1, math.ceil(self.REPLAY_US / per_call_us)))
        inner = n * math.ceil(inner / n)  # every input set equally often

        def eager() -> None:
            for i in range(inner):
                fns[i % n]()

        replay, graph, note = eager, False, None
        if self.graph:
            g = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(g):
                    eager()
                replay, graph = g.replay, True
            except Exception as exc:  # noqa: BLE001 (e.g. an op that syncs with the host: timed eagerly)
                note = f"CUDA graph capture failed, timed eagerly: {type(exc).__name__}: {exc}"[:300]
                torch.cuda.synchronize(self.device)
        for _ in range(2):
            replay()
        a.record()
        replay()
        b.record()
        torch.cuda.synchronize(self.device)
        per_replay_ms = max(a.elapsed_time(b), 1e-4)
        iters = max(min(self.MIN_ITERS, self.iters), min(self.iters, int(self.max_ms / per_replay_ms)))
        events = [(self._event(), self._event()) for _ in range(iters)]
        for start, end in events:
            start.record()
            replay()
            end.record()
        torch.cuda.synchronize(self.device)
        samples = [s.elapsed_time(e) * 1e3 / inner for s, e in events]
        return Timing(samples, inner, graph, note)


def make_timer(device: torch.device, iters: int, warmup: int, max_ms: float, graph: bool = True):
    """The timer for ``device``: ``CudaTimer`` on a GPU (CUDA graphs unless ``graph`` is False), else ``CpuTimer``."""
    if device.type == "cuda":
        return CudaTimer(device, iters, warmup, max_ms, graph=graph)
    return CpuTimer(iters, warmup, max_ms)


def summarize(samples_us: list[float]) -> dict:
    a = np.asarray(samples_us, dtype=np.float64)
    return {
        "median_us": float(np.median(a)),
        "p10_us": float(np.percentile(a, 10)),
        "p90_us": float(np.percentile(a, 90)),
        "n": len(samples_us),
    }
