"""``bench specbench --time-budget-s S``: which servers to start and which concurrencies to ask in the time left.

The budget runs from the command's start. Concurrency 1 (the first concurrency given) on every server comes
first; each decision is printed in one line and kept in the reports (``budget.decisions``):

- a server is started only if the time left covers its start, its first concurrency and its stop;
  otherwise it is not started, and its concurrencies are missing for "time budget";
- on a running server, a later concurrency is asked only if the time left after it (and after this
  server's stop) still covers, for every remaining server, its start, its first concurrency and its stop;
  otherwise that concurrency is skipped ("time budget");
- while a concurrency is asked, no new turn is asked once the time left is below this server's stop
  (the turns in flight finish); what it left unasked is missing for "time budget".

Estimates, from what this run measured:

- a start (launch to healthy, the prompt tokenizer, the warm-up): the latest start of a server launched the
  same way (by ``args``, or reached at its ``url``), not the longest: the first start on a fresh machine pays
  SGLang's JIT and Triton compiles, which later starts find cached; before any, ``DEFAULT_START_S``
  (launched) or ``DEFAULT_URL_START_S`` (reached);
- (the rest, each the slowest seen: conservative) a turn at a concurrency: the largest wall time per turn (a concurrency's wall time / the turns it asked)
  of any server at that concurrency; before any, the largest at any concurrency (a later concurrency, more
  requests in flight, takes no longer per turn); before any turn at all, ``DEFAULT_TURN_OVERHEAD_S`` +
  max_new_tokens / ``DEFAULT_TOKENS_PER_S`` (128 tokens: 7.1 s);
- a stop (the server stopped, the reports written): the longest so far; before any, ``DEFAULT_STOP_S``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: A launched server's start before one is measured (SGLang with CUDA graphs: 30-60 s for a small model).
DEFAULT_START_S = 120.0
#: A server reached by url: health, model info and the warm-up.
DEFAULT_URL_START_S = 10.0
#: Stopping a server (SIGTERM, at most 30 s before SIGKILL) and writing the reports.
DEFAULT_STOP_S = 20.0
#: A turn before one is measured: this fixed part plus max_new_tokens at DEFAULT_TOKENS_PER_S.
DEFAULT_TURN_OVERHEAD_S = 2.0
DEFAULT_TOKENS_PER_S = 25.0


def _s(seconds: float) -> str:
    text = f"{seconds:.0f}" if abs(seconds) >= 10 else f"{seconds:.1f}"
    return ("0.0" if text == "-0.0" else text) + " s"


class Budget:
    """The time left and the estimates; ``may_start``, ``may_ask`` and ``out_of_time`` decide, and the
    runner reports what it measured (``started``, ``asked``, ``stopped``)."""

    def __init__(
        self,
        budget_s: float,
        started_at: float,
        max_new_tokens: int,
        clock: Callable[[], float] = time.monotonic,
        say: Callable[[str], None] | None = None,
    ):
        self.budget_s, self.started_at, self.clock = budget_s, started_at, clock
        self.default_turn_s = DEFAULT_TURN_OVERHEAD_S + max_new_tokens / DEFAULT_TOKENS_PER_S
        self.starts: dict[bool, list[float]] = {True: [], False: []}  # launched? -> measured starts
        self.turn_times: dict[int, list[float]] = {}  # concurrency -> measured wall seconds per turn
        self.stops: list[float] = []
        self.decisions: list[str] = []
        self.say = say or (lambda line: print(line, flush=True))

    # --- estimates ---------------------------------------------------------------------------------

    def left(self) -> float:
        return self.budget_s - (self.clock() - self.started_at)

    def start_s(self, launched: bool) -> tuple[float, bool]:
        """(the estimate, measured?) of a server's start."""
        seen = self.starts[launched]
        if seen:
            return seen[-1], True
        return (DEFAULT_START_S if launched else DEFAULT_URL_START_S), False

    def turn_s(self, concurrency: int) -> tuple[float, bool]:
        if self.turn_times.get(concurrency):
            return max(self.turn_times[concurrency]), True
        seen = [t for ts in self.turn_times.values() for t in ts]
        return (max(seen), True) if seen else (self.default_turn_s, False)

    def stop_s(self) -> tuple[float, bool]:
        return (max(self.stops), True) if self.stops else (DEFAULT_STOP_S, False)

    def server_cost(self, launched: bool, concurrency: int, turns: int) -> tuple[float, str]:
        """A server's start, ``turns`` at ``concurrency`` and its stop: seconds, and the sum in words."""
        start, m1 = self.start_s(launched)
        turn, m2 = self.turn_s(concurrency)
        stop, m3 = self.stop_s()
        total = start + turns * turn + stop
        how = "" if m1 and m2 and m3 else ("; defaults" if not (m1 or m2 or m3) else "; partly defaults")
        return total, (
            f"start {_s(start)} + concurrency {concurrency}: {turns} turns x {_s(turn)} + stop {_s(stop)} "
            f"= {_s(total)}{how}"
        )

    # --- decisions ---------------------------------------------------------------------------------

    def _decide(self, line: str) -> None:
        line = f"[budget] {line}"
        self.decisions.append(line)
        self.say(line)

    def may_start(self, name: str, launched: bool, concurrency: int, turns: int) -> bool:
        """Start server ``name``, whose first concurrency to ask is ``concurrency`` with ``turns`` turns?"""
        left = self.left()
        cost, how = self.server_cost(launched, concurrency, turns)
        ok = left >= cost
        verdict = "start" if ok else "not started (time budget)"
        self._decide(f"{name}: {verdict}: {_s(left)} left {'>=' if ok else '<'} {how}")
        return ok

    def may_ask(self, name: str, concurrency: int, turns: int, remaining: list[tuple[str, bool, int, int]]) -> bool:
        """Ask running server ``name`` at a later ``concurrency`` (``turns`` turns)? ``remaining``: the servers
        still to run, each (name, launched, first concurrency, its turns)."""
        left = self.left()
        turn, _ = self.turn_s(concurrency)
        stop, _ = self.stop_s()
        after = left - turns * turn - stop
        reserve = sum(self.server_cost(launched, c, n)[0] for _, launched, c, n in remaining)
        ok = after >= reserve
        names = ", ".join(n for n, *_ in remaining) or "none"
        verdict = "asked" if ok else "skipped (time budget)"
        self._decide(
            f"{name} concurrency {concurrency}: {verdict}: {_s(left)} left - {turns} turns x {_s(turn)} - stop "
            f"{_s(stop)} = {_s(after)} {'>=' if ok else '<'} {_s(reserve)} for the first concurrency of the "
            f"remaining servers ({names})"
        )
        return ok

    def out_of_time(self) -> bool:
        """No new turn: the time left is below a server's stop."""
        return self.left() < self.stop_s()[0]

    def cut(self, name: str, concurrency: int, asked: int, turns: int) -> None:
        self._decide(
            f"{name} concurrency {concurrency}: the budget ran out after {asked} of {turns} turns "
            f"({_s(self.left())} left, a stop takes {_s(self.stop_s()[0])}): no more asked"
        )

    # --- measurements ------------------------------------------------------------------------------

    def started(self, launched: bool, seconds: float) -> None:
        self.starts[launched].append(seconds)

    def asked(self, concurrency: int, turns: int, seconds: float) -> None:
        if turns > 0:
            self.turn_times.setdefault(concurrency, []).append(seconds / turns)

    def stopped(self, seconds: float) -> None:
        self.stops.append(seconds)

    def summary(self) -> dict:
        """What the reports record: the budget, the defaults, what was measured and every decision."""
        return {
            "time_budget_s": self.budget_s,
            "defaults": {
                "start_s": DEFAULT_START_S,
                "url_start_s": DEFAULT_URL_START_S,
                "turn_s": self.default_turn_s,
                "stop_s": DEFAULT_STOP_S,
            },
            "measured": {
                "start_s": self.starts[True],
                "url_start_s": self.starts[False],
                "turn_s": {str(c): ts for c, ts in self.turn_times.items()},
                "stop_s": self.stops,
            },
            "decisions": list(self.decisions),
        }
