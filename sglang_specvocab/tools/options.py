"""What the commands' typed settings share: a parsed command line read into one dataclass, once."""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Self


class FromArgs:
    """Base of a dataclass of a command's options (``KernelBench``, ``TrainEagle3``, ``FrequencyCount``, ...)."""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Self:
        """The options the command line gave (a field it does not name keeps its default)."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})


__all__ = ["FromArgs"]
