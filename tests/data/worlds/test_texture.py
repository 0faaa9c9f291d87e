"""The finer albedo texture: fetched only with its catalogued hash, re-graded to the real data's
map by a fit that a shifted map cannot pass, and written as a source directory that links the
real elevation, catalogues and trajectory."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from trn.data.worlds.texture import MIN_CORRELATION, WAC_8K, install_texture, regrade, shift_correlations
from trn.data.worlds.terrain import load_albedo
from trn.errors import DataError

SHARED = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "moon"
MIRROR = Path("/work/.mirror/azabrod1+Moon/repo")


def test_the_regrade_recovers_a_linear_grade_and_a_shifted_map_fails_it():
    rng = np.random.default_rng(0)
    coarse = cv2.GaussianBlur(rng.uniform(40, 200, (64, 128)), (0, 0), 2.0)
    fine_true = cv2.resize(coarse, (256, 128), interpolation=cv2.INTER_CUBIC)
    graded = 2.5 * fine_true - 20.0  # a repository's own linear re-grade
    out, a, b, corr = regrade(graded, coarse)
    assert abs(a - 0.4) < 0.02 and abs(b - 8.0) < 2.0 and corr > 0.99
    assert np.abs(out - np.clip(fine_true, 0, 255)).mean() < 2.0
    _, _, _, shifted = regrade(np.roll(graded, 40, axis=1), coarse)
    assert shifted < MIN_CORRELATION
    # in place the map correlates best; moved by one coarse pixel (two fine ones) it peaks there instead
    assert max(shift_correlations(graded, coarse).values()) < corr
    moved = np.roll(graded, 2, axis=1)
    near = shift_correlations(moved, coarse)
    assert max(near.values()) > regrade(moved, coarse)[3]
    with pytest.raises(DataError, match="whole multiple"):
        regrade(np.zeros((100, 150)), coarse)


def fake_source(root: Path) -> Path:
    for d in ("dem", "catalogs", "trajectory", "albedo"):
        (root / d).mkdir(parents=True)
    cv2.imwrite(str(root / "albedo" / "a.png"), np.full((64, 128), 100, np.uint8))
    return root


def test_a_file_that_is_not_the_catalogued_one_is_refused_and_nothing_is_written(tmp_path):
    source = fake_source(tmp_path / "moon")
    checkout = tmp_path / "checkout"
    (checkout / WAC_8K.path).parent.mkdir(parents=True)
    (checkout / WAC_8K.path).write_bytes(b"another texture")
    with pytest.raises(DataError, match="SHA-256"):
        install_texture("wac-8k", checkout, source, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(DataError, match="has no dem"):
        install_texture("wac-8k", checkout, tmp_path / "checkout", tmp_path / "out")
    (tmp_path / "file").write_text("x")
    with pytest.raises(DataError, match="not a directory"):
        install_texture("wac-8k", checkout, source, tmp_path / "file")
    (tmp_path / "taken" / "dem").mkdir(parents=True)  # a conflict found before anything is written
    (tmp_path / "taken" / "texture.json").write_text("{}")
    with pytest.raises(DataError, match="not a link"):
        install_texture("wac-8k", checkout, source, tmp_path / "taken")
    assert sorted(f.name for f in (tmp_path / "taken").iterdir()) == ["dem", "texture.json"]


@pytest.mark.skipif(not (MIRROR.is_dir() and SHARED.is_dir()),
                    reason="needs a snapshot of azabrod1/Moon and ../shared/data/moon")
def test_the_wac_texture_installs_as_a_source_with_the_real_elevation(tmp_path):
    out = install_texture("wac-8k", MIRROR, SHARED, tmp_path / "moon-wac8k")
    rec = json.loads((out / "texture.json").read_text())
    assert rec["sha256"] == WAC_8K.sha256 and rec["fit"]["correlation"] >= MIN_CORRELATION
    for d in ("dem", "catalogs", "trajectory"):
        assert (out / d).is_symlink() and (out / d).resolve() == (SHARED / d).resolve()
    albedo = load_albedo(out)
    assert abs(albedo.ppd - 8192 / 360) < 1e-9
    # written again over itself: the same file, the links kept
    install_texture("wac-8k", MIRROR, SHARED, out)
    assert json.loads((out / "texture.json").read_text())["written_sha256"] == rec["written_sha256"]
