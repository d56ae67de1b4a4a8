"""``full``: the EAGLE baseline, the draft head over the whole vocabulary."""

from __future__ import annotations

from typing import Literal

from ..config import PolicyConfig
from .base import Policy


class FullConfig(PolicyConfig):
    policy: Literal["full"]


class FullPolicy(Policy):
    name = "full"
    dense = True
