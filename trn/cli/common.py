"""Shared command-line plumbing: logging set-up and turning trn errors into clear exits."""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

from trn.errors import TrnError


class ProgressAwareHandler(logging.StreamHandler):
    """A stream handler that writes through ``tqdm.write``: a progress bar on the same terminal is
    cleared, the message printed on its own line and the bar redrawn below it, instead of the
    message being written over the bar."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.stream)
            self.flush()
        except Exception:  # noqa: BLE001 - logging's own contract: report and carry on
            self.handleError(record)


def setup_logging(verbose: bool = False) -> None:
    handler = ProgressAwareHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler])
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # it logs which SIMD build it picked


class _Commands(argparse._SubParsersAction):
    """Subcommands that, without a ``metavar`` of their own, are named by their list of commands
    (``{check,repair}``) rather than by their ``dest``: a missing command is then reported as
    "required: {check,repair}", not as "required: cmd"."""

    @property
    def metavar(self) -> str | None:  # type: ignore[override]
        if self._metavar is not None:
            return self._metavar
        return "{" + ",".join(self.choices) + "}" if self.choices else None

    @metavar.setter
    def metavar(self, value: str | None) -> None:
        self._metavar = value


def _limit(name: str, default: int) -> int:
    try:
        return int(os.pathconf("/", name))
    except (OSError, ValueError, AttributeError):
        return default


PATH_MAX, NAME_MAX = _limit("PC_PATH_MAX", 4096), _limit("PC_NAME_MAX", 255)


def path_length_problem(text: str) -> str | None:
    """Why the operating system cannot take ``text`` as a path (longer than PATH_MAX bytes, or a name
    in it longer than NAME_MAX), or None."""
    size = len(text.encode("utf-8", "surrogateescape"))
    longest = max((len(part.encode("utf-8", "surrogateescape")) for part in text.split(os.sep)), default=0)
    if size < PATH_MAX and longest <= NAME_MAX:
        return None
    shown = text if len(text) <= 60 else f"{text[:40]}...{text[-12:]}"
    return (f"the path {shown!r} is too long ({size} bytes, its longest name {longest}); this system takes paths "
            f"under {PATH_MAX} bytes and names of at most {NAME_MAX}: give a shorter path")


def _refusing_empty(convert: Callable[[str], object] | None, action: argparse.Action) -> Callable[[str], object]:
    """``convert`` (str when None), after refusing a value that is empty or only blanks: ``Path("")``
    is the working directory and an empty option value would quietly mean its default, so an empty
    argument is always a mistake (a variable that expanded to nothing)."""
    convert = convert or str
    metavar = action.metavar if isinstance(action.metavar, str) else None
    is_path = convert is Path
    if action.option_strings:
        name = max(action.option_strings, key=len)
        fix = f"give {metavar or action.dest.upper()}" + ("" if action.required else f", or leave {name} out")
    else:
        what = metavar or action.dest
        kind = "path" if is_path else "value"
        fix = f"give a {kind}" if what == kind else f"give the {kind} of {what}"
    if is_path:
        fix = f"an empty path would mean the working directory: {fix}"

    def parse(text: str) -> object:
        if isinstance(text, str) and not text.strip():
            raise argparse.ArgumentTypeError(f"{text!r} is empty (an unset shell variable?); {fix}")
        if is_path and isinstance(text, str):
            problem = path_length_problem(text)
            if problem is not None:
                raise argparse.ArgumentTypeError(problem)
        return convert(text)

    parse.__name__ = getattr(convert, "__name__", "value")
    parse.refuses_empty = True  # type: ignore[attr-defined]
    return parse


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``error: <what> (see <prog> --help)``, exit status 2; a
    missing subcommand is named by the list of commands; an empty or blank value of any argument
    is refused, naming the argument (:func:`_refusing_empty`)."""

    def add_subparsers(self, **kwargs):  # type: ignore[override]
        kwargs.setdefault("action", _Commands)
        return super().add_subparsers(**kwargs)

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        for action in self._actions:  # groups' arguments included; subcommands are Parsers too
            takes_values = action.nargs not in (0, argparse.PARSER, argparse.REMAINDER)  # not flags, not commands
            if takes_values and not getattr(action.type, "refuses_empty", False):
                action.type = _refusing_empty(action.type, action)
        return super().parse_known_args(args, namespace)

    def error(self, message: str):  # type: ignore[override]
        print(f"error: {self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


MAX_SEED = 2**32 - 1  # every seed option: a 32-bit unsigned number


def seed_number(text: str) -> int:
    """An argparse type: a seed, a whole number from 0 to 2**32 - 1."""
    return int_between(0, MAX_SEED)(text)


seed_number.__name__ = "seed"


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


def int_between(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number in [low, high]."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= v <= high:
            raise argparse.ArgumentTypeError(f"{v} is out of range: expected {low} to {high}")
        return v

    parse.__name__ = f"integer in [{low}, {high}]"
    return parse


def float_between(low: float, high: float, low_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in [low, high], or (low, high] with ``low_open``. NaN and
    infinities are refused."""

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{text.strip()} is not a finite number: expected {low} to {high}")
        if not (low < v if low_open else low <= v) or not v <= high:
            span = f"more than {low} and at most {high}" if low_open else f"{low} to {high}"
            raise argparse.ArgumentTypeError(f"{v} is out of range: expected {span}")
        return v

    parse.__name__ = f"number in {'(' if low_open else '['}{low}, {high}]"
    return parse


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that the process unwinds like Ctrl-C: worker pools
    are terminated by their ``with`` blocks and their semaphores released (killed outright, the
    process left them to multiprocessing's resource tracker, which warned of leaked semaphores)."""


def _terminate(signum, frame) -> None:
    raise Terminated()


def run_main(fn: Callable[[], int]) -> int:
    """Run ``fn``; a :class:`TrnError`, or an operating-system error (permissions, a file where a
    directory should be, a full disk), becomes a one-line message on stderr and exit status 2;
    Ctrl-C exits with 130 and SIGTERM with 143, each after a clean unwind."""
    import signal
    import threading

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    try:
        return _run(fn)
    except Terminated:
        print("terminated (SIGTERM); a build can be resumed by running the same command again", file=sys.stderr)
        return 143
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _run(fn: Callable[[], int]) -> int:
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


@contextlib.contextmanager
def naming_the_config(path: Path, overrides: list[str] | tuple[str, ...] = ()):
    """A :class:`ConfigError` raised inside (an unknown key, a value out of range) names the config
    file it is about, and the overrides given with it, when its message does not already."""
    from trn.errors import ConfigError

    try:
        yield
    except ConfigError as exc:
        if str(path) in str(exc):
            raise
        shown = [o if len(o) <= 40 else f"{o[:30]}...{o[-6:]}" for o in overrides]
        given = f" with the overrides {' '.join(shown)}" if overrides else ""
        raise ConfigError(f"config file {path}{given}: {exc}") from None


def parse_settings(cls, items: list[str], option: str) -> dict:
    """``KEY=VALUE`` strings -> checked keyword arguments of the dataclass ``cls``: each value read
    as YAML 1.2 (``1e-4`` is a number, ``[0.6, 1.4]`` a list), each key a field of ``cls`` of its
    type (:func:`trn.yamlio.strict_fields`); the dataclass checks the ranges."""
    from trn.errors import ConfigError
    from trn.yamlio import YamlError, load_yaml, strict_fields

    out = {}
    for item in items:
        key, sep, text = item.partition("=")
        shown = item if len(item) <= 80 else f"{item[:60]}...{item[-8:]}"
        if not sep or not key.strip():
            raise ConfigError(f"{option} {shown!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = load_yaml(text)
        except YamlError as exc:
            raise ConfigError(f"{option} {shown!r}: the value is not readable YAML ({exc})") from None
    return strict_fields(cls, option, out)
