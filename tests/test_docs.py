"""The README and docs/ speak of the product: its use, its results and its design.

Fails when README.md or a docs page names an issue number or speaks of a work session, when the
README grows past one screenful of set-up plus one short section per task, when the set-up
command, the main job and the test command leave its first screen, when a manual grows past
what a maintainer can keep true, or when a study (the dated runs, choices and dropped levers of a
topic, under docs/studies/) is not linked from a manual.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

# Pages left out of the scan; empty, so that every page is scanned.
NOT_YET_SCANNED: set[str] = set()

README_MAX_LINES = 250
MANUAL_MAX_LINES = 400
STUDIES = DOCS / "studies"
FIRST_SCREEN_LINES = 60
SETUP_COMMAND = 'python -m pip install -e ".[dev,export,ray,geo]"'
MAIN_JOB = "trn-sim run luna1"
TEST_COMMAND = "python -m pytest -q"

ISSUE = re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE)
SESSION = re.compile(r"\bsessions?\b", re.IGNORECASE)
# The technical senses of "session" that a page may use; each is removed before the search.
SESSION_ALLOWED = [
    re.compile(r"\bInferenceSession\b"),
    re.compile(r"\b(?:onnx\s*runtime|onnxruntime|ONNX\s+Runtime|ONNX\s+runtime)(?:'s)?\s+(?:inference\s+)?sessions?\b",
               re.IGNORECASE),
    re.compile(r"\bonnx_session\b"),
    re.compile(r"\bscope\s*=\s*[\"']session[\"']"),
    re.compile(r"\bsession[- ]scoped?\b(?=[^.\n]*\bfixture)", re.IGNORECASE),
    re.compile(r"\bpytest(?:'s)?\s+session\b", re.IGNORECASE),
]


def pages() -> list[Path]:
    return [README] + sorted(p for p in [*DOCS.glob("*.md"), *STUDIES.glob("*.md")] if p.name not in NOT_YET_SCANNED)


def manuals() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def findings(text: str, pattern: re.Pattern[str], allowed: list[re.Pattern[str]] = ()) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for a in allowed:
            line = a.sub(" ", line)
        for m in pattern.finditer(line):
            found.append(f"line {number}: {m.group(0)!r}")
    return found


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_names_an_issue_number(page: Path) -> None:
    found = findings(page.read_text(encoding="utf-8"), ISSUE)
    assert not found, f"{page.relative_to(ROOT)} names an issue: {found}"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_speaks_of_a_work_session(page: Path) -> None:
    found = findings(page.read_text(encoding="utf-8"), SESSION, SESSION_ALLOWED)
    assert not found, f"{page.relative_to(ROOT)} speaks of a session: {found}"


def test_the_checks_tell_a_technical_session_from_a_work_session() -> None:
    technical = ("an onnxruntime session", "the ONNX runtime session", "ort.InferenceSession(path)",
                 "onnx_session(path, numerics='reference')", '@pytest.fixture(scope="session")',
                 "a session-scoped fixture")
    for line in technical:
        assert not findings(line, SESSION, SESSION_ALLOWED), line
    for line in ("the eleventh session's machine", "this session", "Sessions of work", "issue 25",
                 "Issue #21", "issues 23"):
        assert findings(line, SESSION, SESSION_ALLOWED) or findings(line, ISSUE), line


def test_the_readme_fits_its_budget() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines, at most {README_MAX_LINES}"


@pytest.mark.parametrize("command", [SETUP_COMMAND, MAIN_JOB, TEST_COMMAND])
def test_the_first_screen_holds_setup_main_job_and_tests(command: str) -> None:
    first = "\n".join(README.read_text(encoding="utf-8").splitlines()[:FIRST_SCREEN_LINES])
    assert command in first, f"{command!r} is not within the first {FIRST_SCREEN_LINES} lines of README.md"


def test_the_index_lists_every_page() -> None:
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.name != "index.md" and f"({p.name})" not in index]
    assert not missing, f"docs/index.md does not list {missing}"


@pytest.mark.parametrize("page", manuals(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_manual_fits_its_budget(page: Path) -> None:
    """A manual gives its topic's use, design and current figures; what was measured on the way
    belongs to its study."""
    lines = page.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MANUAL_MAX_LINES, (f"{page.relative_to(ROOT)} has {len(lines)} lines, at most "
                                            f"{MANUAL_MAX_LINES}: move dated runs and choices to docs/studies/")


def linked_studies(text: str) -> set[str]:
    """The study files a manual's text links to (``studies/NAME.md``, with or without an anchor)."""
    return set(re.findall(r"\(studies/([A-Za-z0-9_.-]+\.md)(?:#[^)]*)?\)", text))


def test_every_study_is_linked_from_a_manual() -> None:
    linked = set().union(*(linked_studies(p.read_text(encoding="utf-8")) for p in manuals()))
    studies = {p.name for p in STUDIES.glob("*.md")}
    assert studies <= linked, f"studies no manual links to: {sorted(studies - linked)}"
    assert linked <= studies, f"manuals link to studies that do not exist: {sorted(linked - studies)}"


def test_the_study_link_check_reads_links() -> None:
    text = "see [the runs](studies/lost_in_space.md) and [x](studies/detector.md#a-b), not studies/x.md"
    assert linked_studies(text) == {"lost_in_space.md", "detector.md"}
