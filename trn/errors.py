"""Exception types. Every error names the thing that is wrong and how to fix it."""

from __future__ import annotations

from pathlib import Path


class TrnError(Exception):
    """Base class of every error raised on purpose by trn."""


class ConfigError(TrnError, ValueError):
    """An option or configuration value is out of range or unknown."""


class DataError(TrnError):
    """Input data (a file, a directory, an array) is missing, corrupt or malformed.

    ``path`` and ``line`` (1-based) locate the problem when they are known.
    """

    def __init__(self, message: str, path: str | Path | None = None, line: int | None = None):
        self.path = None if path is None else str(path)
        self.line = line
        where = ""
        if self.path is not None:
            where = self.path if line is None else f"{self.path}:{line}"
            where += ": "
        super().__init__(where + message)
        self.message = message


def differing_digests(a: str, b: str, shown: int = 12) -> tuple[str, str]:
    """Two hex digests as a message shows them: ``shown`` digits each, or, where they agree that
    far, up to 4 digits past the first that differs, so that two different digests never read the
    same; "..." ends a shortened one."""
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    n = max(shown, first + 5)
    return tuple(d if len(d) <= n else d[:n] + "..." for d in (a, b))  # type: ignore[return-value]
