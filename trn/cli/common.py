"""Shared command-line plumbing: logging set-up and turning trn errors into clear exits."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

from trn.errors import TrnError


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # it logs which SIMD build it picked


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``error: <what> (see <prog> --help)``, exit status 2."""

    def error(self, message: str):  # type: ignore[override]
        print(f"error: {self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= ``low``."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"{v} is out of range: expected {low} or more")
        return v

    parse.__name__ = f"integer >= {low}"
    return parse


def float_between(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a finite number in [low, high]."""

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not low <= v <= high:
            raise argparse.ArgumentTypeError(f"{v} is out of range: expected {low} to {high}")
        return v

    parse.__name__ = f"number in [{low}, {high}]"
    return parse


def run_main(fn: Callable[[], int]) -> int:
    """Run ``fn``; a :class:`TrnError`, or an operating-system error (permissions, a file where a
    directory should be, a full disk), becomes a one-line message on stderr and exit status 2."""
    try:
        return fn()
    except TrnError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {where}{exc.strerror or exc} (check that the path exists, is of the right kind and is "
              "readable/writable by you)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; a build can be resumed by running the same command again", file=sys.stderr)
        return 130
