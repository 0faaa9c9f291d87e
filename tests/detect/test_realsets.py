"""The real sets' labels, split and training frames: label files read in both separators, every
file of a set in exactly one split with neighbouring orbits together, and tiles whose boxes are
the labels brought to the tile's scale and place."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from trn.data.datasets.labels import read_labels
from trn.detect.realsets import (CRATERDANET_NAC_SPLIT, CTX_LABEL_SHIFT_PX, CTX_TILE, CTX_TILE_PX, RealImage,
                                 ctx_mosaic, observation_of, read_boxes, read_corner_boxes, real_images, real_set,
                                 write_tile_frames)
from trn.errors import DataError


def test_label_files_are_read_with_commas_or_tabs(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("ID,X,Y,W,H,C_X,CY\n3,10,20,7,9,13,24\n4,1.5,2,8,8,5,6\n")
    (tmp_path / "b.txt").write_text("ID\tX\tY\tW\tH\tC_X\tCY\n3\t10\t20\t7\t9\t13\t24\n")
    np.testing.assert_array_equal(read_boxes(tmp_path / "a.txt"), [[10, 17, 20, 29], [1.5, 9.5, 2, 10]])
    np.testing.assert_array_equal(read_boxes(tmp_path / "b.txt"), [[10, 17, 20, 29]])
    (tmp_path / "c.txt").write_text("ID,X,Y,W,H,C_X,CY\n3,10,20,0,9,13,24\n")
    with pytest.raises(DataError, match="line 2"):
        read_boxes(tmp_path / "c.txt")


def test_every_file_is_in_one_split_and_neighbouring_orbits_share_it() -> None:
    obs = {observation_of(p) for p in real_set("craterdanet-nac").files}
    assert obs == set(CRATERDANET_NAC_SPLIT)
    met = sorted((int(o[1:]), s) for o, s in CRATERDANET_NAC_SPLIT.items())
    for (a, sa), (b, sb) in zip(met, met[1:]):
        if b - a < 86400:
            assert sa == sb, f"M{a} and M{b} are less than a day apart but in {sa} and {sb}"
    assert {s for s in CRATERDANET_NAC_SPLIT.values()} == {"train", "val", "test"}


def test_tiles_carry_the_labels_at_their_scale_and_place(tmp_path: Path) -> None:
    img = np.full((200, 300), 100, np.uint8)
    png = tmp_path / "M1_x.png"
    cv2.imwrite(str(png), img)
    boxes = np.array([[10, 30, 20, 40], [250, 290, 150, 190]], np.float32)
    write_tile_frames([RealImage(png, "M1", "train", boxes)], tmp_path / "out", factor=2.0, size=256, overlap=64)
    labels = read_labels(tmp_path / "out")
    frames = labels.split("train")
    assert all(labels.load(f.frame).shape == (256, 256) for f in frames)
    # the image at factor 2 is 400 x 600: rows start at 0 and 144, columns at 0, 192 and 344
    first = frames[0]
    assert [b.box for b in first.boxes] == [(20, 60, 40, 80)]
    last = frames[-1]
    assert [b.box for b in last.boxes] == [(156, 236, 156, 236)]


def test_corner_label_files_are_read_and_bad_lines_refused(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("10.5 20 30.5 44\n\n1 2 3 4\n")
    np.testing.assert_array_equal(read_corner_boxes(tmp_path / "a.txt"), [[10.5, 30.5, 20, 44], [1, 3, 2, 4]])
    (tmp_path / "b.txt").write_text("1 2 3 4\n1 2 three 4\n")
    with pytest.raises(DataError, match="line 2"):
        read_corner_boxes(tmp_path / "b.txt")
    (tmp_path / "c.txt").write_text("5 2 3 4\n")
    with pytest.raises(DataError, match="no width"):
        read_corner_boxes(tmp_path / "c.txt")


def test_the_mars_mosaic_is_its_tiles_in_place_with_labels_moved_by_the_registration_shift(tmp_path: Path) -> None:
    tiles = [p for p in real_set("robbins-ctx-mars").files if CTX_TILE.fullmatch(p)]
    cells = {tuple(int(v) for v in CTX_TILE.fullmatch(p).groups()) for p in tiles}
    assert len(tiles) == 81 and cells == {(r, c) for r in range(9) for c in range(9)}
    for p in tiles:
        r, c = (int(v) for v in CTX_TILE.fullmatch(p).groups())
        (tmp_path / p).parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(tmp_path / p), np.full((CTX_TILE_PX, CTX_TILE_PX), 10 * r + c, np.uint8))
    (tmp_path / "CTX" / "selected_craters_XY.txt").write_text("100 200 120 230\n")
    [im] = real_images("robbins-ctx-mars", tmp_path, "val")
    a = cv2.imread(str(im.path), cv2.IMREAD_GRAYSCALE)
    assert a.shape == (9 * CTX_TILE_PX,) * 2
    assert a[0, 0] == 0 and a[CTX_TILE_PX * 3 + 5, CTX_TILE_PX * 7 + 9] == 37 and a[-1, -1] == 88
    dx, dy = CTX_LABEL_SHIFT_PX
    np.testing.assert_allclose(im.boxes, [[100 + dx, 120 + dx, 200 + dy, 230 + dy]], atol=1e-4)
    assert real_images("robbins-ctx-mars", tmp_path, "train") == []
    (tmp_path / tiles[5]).unlink()
    with pytest.raises(DataError, match="real-set robbins-ctx-mars"):
        ctx_mosaic(tmp_path)
