"""Every command the README and the manuals show still parses as written.

Each ``trn-*`` command line of README.md and docs/*.md (in code blocks, with its continuation
lines, and in inline code) is read against the command line's own argparse parser, taken from its
``main`` without running anything: every subcommand it names must exist, and every option it
passes must be an option of that subcommand (or of the commands above it). A renamed option or
command fails here with the page and the line. Values, placeholders (``DIR``, ``<model>``) and
``trn-train``'s ``key=value`` overrides are not checked, nor what follows an ellipsis (the configuration's strict loader does
that when the command runs).
"""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MODULES = {"trn-data": "data", "trn-sim": "sim", "trn-train": "train", "trn-db": "db", "trn-export": "export",
           "trn-hw": "hw", "trn-detect": "detect", "trn-train-parts": "train_parts"}
COMMAND = re.compile(r"^(?:\$\s*)?(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(trn-[a-z-]+)(?=\s|$)")
NUMBER = re.compile(r"^-\d")
WORD = re.compile(r"^[a-z][a-z0-9-]*$")


class _Parsed(Exception):
    """Raised in place of parsing: carries the parser a command line's ``main`` built."""


def parser_of(program: str) -> argparse.ArgumentParser:
    """The top-level parser of ``program`` (a ``trn-*`` console script), caught as its ``main``
    starts to parse (nothing runs)."""
    module = importlib.import_module(f"trn.cli.{MODULES[program]}")

    def grab(self, *args, **kwargs):
        raise _Parsed(self)

    saved = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
    argparse.ArgumentParser.parse_args = argparse.ArgumentParser.parse_known_args = grab
    try:
        module.main([])
    except _Parsed as got:
        return got.args[0]
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = saved
    raise AssertionError(f"{program}'s main never parsed its arguments")


def commands(text: str) -> list[tuple[int, str]]:
    """(line number, command) of every ``trn-*`` command in ``text``: code-block lines with their
    ``\\`` continuations, and inline code spans; chained commands (``&&``, ``;``, ``|``) apart."""
    found: list[tuple[int, str]] = []
    lines = text.splitlines()
    in_block = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            in_block = not in_block
            i += 1
            continue
        if in_block:
            start = i
            joined = line
            while joined.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                joined = joined.rstrip()[:-1] + " " + lines[i].strip()
            pieces = [(start + 1, joined)]
        else:
            pieces = [(i + 1, span) for span in re.findall(r"`([^`]+)`", line)]
        for number, piece in pieces:
            piece = re.split(r"\s#", piece)[0]
            for part in re.split(r"&&|;|\|", piece):
                if COMMAND.match(part.strip()):
                    found.append((number, part.strip()))
        i += 1
    return found


def problems(command: str, parsers: dict[str, argparse.ArgumentParser]) -> list[str]:
    """What in ``command`` its parser does not know: an unknown subcommand or option."""
    program = COMMAND.match(command).group(1)
    if program not in MODULES:
        return [f"{program} is not a trn command line"]
    try:
        tokens = shlex.split(command[COMMAND.match(command).start(1):])
    except ValueError:
        tokens = command[COMMAND.match(command).start(1):].split()
    parser = parsers.setdefault(program, parser_of(program))
    options = dict(parser._option_string_actions)
    out = []
    after_option_value = False
    for token in tokens[1:]:
        if token in ("...", "\u2026"):
            break  # an elided command: what follows may belong to any of its subcommands
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if token.startswith("-") and not NUMBER.match(token) and token != "-":
            name = token.split("=", 1)[0]
            if name not in options:
                out.append(f"{' '.join(tokens[:1])}: unknown option {name}")
            action = options.get(name)
            after_option_value = action is not None and action.nargs != 0 and "=" not in token
            continue
        if subs and not after_option_value:
            if token in subs[0].choices:
                parser = subs[0].choices[token]
                options.update(parser._option_string_actions)
            elif WORD.match(token):
                out.append(f"{program}: unknown command {token} (one of {', '.join(subs[0].choices)})")
                break
        after_option_value = False
    return out


@pytest.fixture(scope="module")
def parsers() -> dict[str, argparse.ArgumentParser]:
    return {}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_of_a_page_parses(page: Path, parsers) -> None:
    found = []
    for number, command in commands(page.read_text(encoding="utf-8")):
        found += [f"line {number}: {p}  [{command}]" for p in problems(command, parsers)]
    assert not found, f"{page.relative_to(ROOT)}:\n" + "\n".join(found)


def test_a_renamed_option_or_command_is_caught(parsers) -> None:
    text = ("```\ntrn-sim run luna1 --data data/luna1 \\\n    --no-such-option 3\n```\n"
            "and `trn-data bulid luna1` and `trn-hw bench --port 7000 && trn-sim run luna1 --quik`\n")
    found = [p for _, c in commands(text) for p in problems(c, parsers)]
    assert any("--no-such-option" in p for p in found)
    assert any("unknown command bulid" in p for p in found)
    assert any("--quik" in p for p in found)
    assert not problems("trn-sim run luna1 --data data/luna1 --quick", parsers)
    assert not problems("trn-data build luna1 --source ../shared/data/moon --out data/luna1 --no-frames", parsers)
