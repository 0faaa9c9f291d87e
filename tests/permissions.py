"""Running code that cannot read a mode-000 file: for tests of permission-denied inputs.

An ordinary user cannot read a file at mode 000; root can (CAP_DAC_OVERRIDE), so as root the code
runs under ``setpriv`` with the DAC capabilities dropped from its bounding set. Tests skip where
neither works.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

NO_DAC = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]


def prefix() -> list[str]:
    """The command prefix under which mode-000 files are unreadable (skips the test if none)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("root without setpriv: mode-000 files stay readable")
    return list(NO_DAC)


def unreadable(path: Path) -> Path:
    """``path`` at mode 000, checked to be unreadable under :func:`prefix` (else the test skips)."""
    path.chmod(0)
    code = f"import os; p = {str(path)!r}; os.listdir(p) if os.path.isdir(p) else open(p, 'rb')"
    probe = subprocess.run(prefix() + [sys.executable, "-c", code], capture_output=True)
    if probe.returncode == 0:
        pytest.skip("cannot make a file unreadable here")
    return path


def run(argv: list[str], cwd: Path | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """``argv`` (a command line) run without the power to read mode-000 files; text output. The
    timeout only catches a hang: a command that imports torch can take minutes to start on a
    machine another CPU-heavy job shares, and a shorter one failed these tests under load."""
    return subprocess.run(prefix() + argv, capture_output=True, text=True, cwd=cwd, timeout=timeout)


def python(code: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Python ``code`` run as :func:`run` does."""
    return run([sys.executable, "-c", code], cwd=cwd)


def cli(name: str, argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    """A trn command line (``trn-data`` ...) run as :func:`run` does."""
    module = f"trn.cli.{name.removeprefix('trn-')}"
    return run([sys.executable, "-c", f"import sys; from {module} import main; sys.exit(main())", *argv], cwd=cwd)
