"""Option types shared by the board program and ``trn-hw`` (argparse only: importing this module
loads nothing else, so the ground side can use it without the agent's thread pinning)."""

from __future__ import annotations

import argparse
from typing import Callable


def ranged_int(low: int, high: int, what: str) -> Callable[[str], int]:
    """An argparse type: a whole number in [low, high], named ``what`` in its errors."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} {text!r} is not a whole number") from None
        if not low <= v <= high:
            raise argparse.ArgumentTypeError(f"{what} {v} is out of range: expected {low} to {high}")
        return v

    parse.__name__ = what
    return parse


def seconds(text: str) -> float:
    """An argparse type: a duration in seconds, more than 0 and at most a day."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < v <= 86400:
        raise argparse.ArgumentTypeError(f"{v} s is out of range: expected more than 0 and at most 86400")
    return v
