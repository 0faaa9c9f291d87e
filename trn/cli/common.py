"""Shared command-line plumbing: logging set-up and turning trn errors into clear exits."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from trn.errors import TrnError


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # it logs which SIMD build it picked


def run_main(fn: Callable[[], int]) -> int:
    """Run ``fn``; a :class:`TrnError` becomes a one-line message on stderr and exit status 2."""
    try:
        return fn()
    except TrnError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; a build can be resumed by running the same command again", file=sys.stderr)
        return 130
