"""Progress when output is not a terminal: log lines at the start, every interval and the end."""

import logging

from trn.data import progress as pg
from trn.data.datasets.build import build_luna1

from .datasets.test_build import cfg


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_line_at_the_start_every_interval_and_at_the_end(caplog):
    clock = Clock()
    with caplog.at_level(logging.INFO, logger=pg.__name__):
        bar = pg.LogProgress(total=100, desc="craters", unit="img", interval_s=30.0, clock=clock)
        for _ in range(10):
            clock.t += 2.0
            bar.update(1)  # 20 s: no line yet
        clock.t += 10.0
        bar.update(15)  # 30 s, 25 of 100
        bar.update(5)  # no time passed: no line
        clock.t += 60.0
        bar.update(70)
        bar.close()
        bar.close()  # closing twice says nothing more
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["craters: started, 100 images to do",
                     "craters: 25/100 images (25 %), 30 s, about 1 min 30 s left",
                     "craters: 100/100 images (100 %), 1 min 30 s",
                     "craters: done, 100/100 images in 1 min 30 s"]


def test_iteration_reports_and_closes(caplog):
    clock = Clock()
    with caplog.at_level(logging.INFO, logger=pg.__name__):
        for _ in pg.LogProgress(range(3), desc="annotate", unit="frame", clock=clock):
            clock.t += 31.0
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "annotate: started, 3 frames to do" and lines[-1] == "annotate: done, 3/3 frames in 1 min 33 s"
    assert len(lines) == 5


def test_off_a_terminal_a_build_logs_its_stages_and_progress(tiny_world, tmp_path, caplog, monkeypatch):
    """A build whose output goes to a file (stderr not a terminal) says what it is doing."""
    monkeypatch.setattr(pg, "on_terminal", lambda: False)
    with caplog.at_level(logging.INFO):
        build_luna1(cfg(tiny_world, tmp_path / "a"))
    text = "\n".join(r.getMessage() for r in caplog.records)
    for line in ("reading the trajectory, the catalogue and the surface", "annotating 5 frames",
                 "annotate: started, 5 frames to do", "annotate: done", "craters: started, 4 images to do",
                 "craters: done, 4/4 images", "frames: started", "done in"):
        assert line in text, line
    assert pg.on_terminal() is False


def test_on_a_terminal_a_bar(monkeypatch):
    monkeypatch.setattr(pg, "on_terminal", lambda: True)
    bar = pg.progress(range(2), desc="x")
    assert type(bar).__name__ == "tqdm"
    bar.close()
