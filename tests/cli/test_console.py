"""The console of every CLI: log lines printed above a live progress bar instead of over it, and
SIGTERM to a command running a worker pool unwinding cleanly (exit 143, the pool terminated, no
traceback and no "leaked semaphore" warning from multiprocessing's resource tracker)."""

import io
import logging
import signal
import subprocess
import sys
import time

SCRIPT = """\
import multiprocessing as mp
import sys
import time

from trn.cli.common import run_main


def work(x):
    time.sleep(60)
    return x


def main():
    with mp.get_context("spawn").Pool(2) as pool:
        pool.apply(abs, (1,))  # both workers up
        print("ready", flush=True)
        list(pool.imap_unordered(work, range(4)))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
"""


def test_sigterm_unwinds_a_worker_pool_cleanly(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(1.0)  # the workers are inside work()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    assert "terminated (SIGTERM)" in err
    assert "leaked semaphore" not in err and "Traceback" not in err, err


def test_log_lines_do_not_overwrite_a_progress_bar():
    """With a bar on the terminal, a log record clears the bar's line, is written on a line of its
    own and the bar is redrawn after it (a plain StreamHandler wrote it after the bar's text)."""
    from tqdm import tqdm

    from trn.cli.common import ProgressAwareHandler

    term = io.StringIO()
    bar = tqdm(total=10, file=term, desc="scenarios", ncols=60, mininterval=0)
    bar.update(3)
    handler = ProgressAwareHandler(term)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log = logging.getLogger("tests.console")
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.INFO)
    try:
        log.info("a result")
    finally:
        log.removeHandler(handler)
    bar.close()
    out = term.getvalue()
    before, _, after = out.partition("INFO a result\n")
    assert after, out
    cleared = before.rsplit("\r", 2)
    assert before.endswith("\r") and not cleared[-2].strip(), "the bar's line was not cleared first"
    assert "scenarios:  30%" in after  # redrawn below the message
