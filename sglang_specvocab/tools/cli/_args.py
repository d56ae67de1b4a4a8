"""The argument types every subcommand shares: refusals end in one ``error:`` line (exit status 2)."""

from __future__ import annotations

import argparse


class Parser(argparse.ArgumentParser):
    """Refused arguments end with one ``error:`` line (exit status 2), like every other refusal."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def at_least(low: float, kind=int):
    """An argparse type: a number ``>= low``."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


def positive_float(text: str) -> float:
    value = at_least(0.0, float)(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def share(text: str) -> float:
    value = at_least(0.0, float)(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {value}")
    return value


def csv_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def int_csv(text: str) -> list[int]:
    try:
        out = [int(float(x)) for x in csv_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be integers separated by commas, got {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"must be positive integers separated by commas, got {text!r}")
    return out


def distinct_positive_csv(text: str) -> list[int]:
    """``int_csv``, strict (``1.5`` is refused, not read as 1) and with no value named twice; order kept."""
    try:
        out = [int(x) for x in csv_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be integers separated by commas, got {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"must be positive integers separated by commas, got {text!r}")
    twice = sorted({x for x in out if out.count(x) > 1})
    if twice:
        raise argparse.ArgumentTypeError(f"{text!r} names {', '.join(map(str, twice))} twice")
    return out


def choices_csv(choices: tuple[str, ...]):
    def parse(text: str) -> list[str]:
        out = csv_list(text)
        bad = [x for x in out if x not in choices]
        if bad or not out:
            raise argparse.ArgumentTypeError(f"{', '.join(bad) or repr(text)}: choose from {', '.join(choices)}")
        return list(dict.fromkeys(out))

    return parse


POSITIVE = at_least(1)


NON_NEGATIVE = at_least(0)


NON_NEGATIVE_FLOAT = at_least(0.0, float)


RAW = argparse.RawDescriptionHelpFormatter
