"""Progress of a long stage (building a world, rendering, annotating).

On a terminal: a tqdm bar. Elsewhere (output redirected to a file, CI, a batch job), where a bar
would be silent or fill the file with carriage returns: a log line when the stage starts, one
every :data:`INTERVAL_S` seconds while it runs (done, total, elapsed, an estimate of what is
left) and one when it ends, so that a redirected run never sits silent for minutes.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterable, Iterator

from tqdm import tqdm

INTERVAL_S = 30.0  # seconds between two progress lines when not on a terminal
PLURALS = {"img": "images", "it": "items"}  # tqdm's units as a log line writes them
log = logging.getLogger(__name__)


def on_terminal() -> bool:
    """Whether stderr (where bars and log lines go) is a terminal."""
    stream = sys.stderr
    return bool(stream is not None and hasattr(stream, "isatty") and stream.isatty())


def _duration(s: float) -> str:
    s = max(0.0, s)
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60)} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60)} min"


class LogProgress:
    """tqdm's ``update`` / ``close`` / iteration, written as log lines at most every
    ``interval_s`` seconds (``clock``: seconds, monotonic; injectable for tests)."""

    def __init__(self, iterable: Iterable | None = None, total: int | None = None, desc: str = "", unit: str = "it",
                 interval_s: float = INTERVAL_S, logger: logging.Logger = log,
                 clock: Callable[[], float] = time.monotonic):
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.iterable, self.total, self.desc = iterable, total, desc
        self.unit = PLURALS.get(unit, unit if unit.endswith("s") else unit + "s")
        self.interval_s, self.log, self.clock = interval_s, logger, clock
        self.n, self.closed = 0, False
        self.start = self.last = clock()
        self.log.info("%s: started, %s %s to do", desc, "?" if total is None else f"{total:,}", self.unit)

    def _count(self) -> str:
        return f"{self.n:,}" if self.total is None else f"{self.n:,}/{self.total:,}"

    def update(self, n: int = 1) -> None:
        self.n += n
        now = self.clock()
        if now - self.last < self.interval_s:
            return
        self.last = now
        elapsed = now - self.start
        left = ""
        if self.total and 0 < self.n < self.total:
            left = f", about {_duration(elapsed * (self.total - self.n) / self.n)} left"
        share = f" ({100.0 * self.n / self.total:.0f} %)" if self.total else ""
        self.log.info("%s: %s %s%s, %s%s", self.desc, self._count(), self.unit, share, _duration(elapsed), left)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.log.info("%s: done, %s %s in %s", self.desc, self._count(), self.unit,
                      _duration(self.clock() - self.start))

    def __iter__(self) -> Iterator:
        try:
            for item in self.iterable or ():
                yield item
                self.update(1)
        finally:
            self.close()


def progress(iterable: Iterable | None = None, *, total: int | None = None, desc: str, unit: str = "it"):
    """A progress bar on a terminal (tqdm), progress log lines elsewhere (:class:`LogProgress`);
    iterate over it, or call ``update(n)`` and ``close()``."""
    if on_terminal():
        return tqdm(iterable, total=total, desc=desc, unit=unit, disable=None, mininterval=2.0)
    return LogProgress(iterable, total=total, desc=desc, unit=unit)
