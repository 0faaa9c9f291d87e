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


def test_doubtful_boxes_go_to_the_tiles_flagged_and_training_ignores_them(tmp_path: Path) -> None:
    import json

    from trn.detect.evaluate import summarise
    from trn.detect.boxes import Detections
    from trn.detect.run import _matched
    from trn.train.detector import load_frames

    png = tmp_path / "M1_x.png"
    cv2.imwrite(str(png), np.full((128, 128), 100, np.uint8))  # one tile of 256 px at factor 2
    sure = np.array([[10, 30, 20, 40]], np.float32)
    unsure = np.array([[60, 80, 60, 80]], np.float32)
    write_tile_frames([RealImage(png, "M1", "train", sure, unsure)], tmp_path / "d", factor=2.0, size=256)
    (f,) = read_labels(tmp_path / "d").split("train")
    assert [(b.box, b.doubtful) for b in f.boxes] == [((20, 60, 40, 80), False), ((120, 160, 120, 160), True)]
    assert json.loads((tmp_path / "d" / "detection_labels.json").read_text())["settings"]["doubtful_boxes"] == 1
    fs = load_frames([str(tmp_path / "d")], "train", 256)
    assert fs.ignore[0].tolist() == [False, True]  # no peak and no negative loss inside it
    # a detection on the doubtful box is neither a hit nor a false detection
    m = _matched(Detections(np.array([[20, 60, 40, 80], [120, 160, 120, 160]], np.float32),
                            np.array([0.9, 0.8], np.float32)), f)
    assert (summarise([m], 0.5).precision, summarise([m], 0.5).recall) == (1.0, 1.0)
    # without doubtful boxes the labels are written as before: no flag in the file
    write_tile_frames([RealImage(png, "M1", "train", sure)], tmp_path / "p", factor=2.0, size=256)
    doc = json.loads((tmp_path / "p" / "detection_labels.json").read_text())
    assert "doubtful" not in doc["frames"][0]["boxes"][0] and "doubtful_boxes" not in doc["settings"]
    # a flag that is not true or false is refused by name
    doc["frames"][0]["boxes"][0]["doubtful"] = "yes"
    (tmp_path / "p" / "detection_labels.json").write_text(json.dumps(doc))
    with pytest.raises(DataError, match="doubtful"):
        read_labels(tmp_path / "p")


def test_the_score_counts_false_detections_on_a_doubtful_box_only_where_there_are_any(tmp_path: Path) -> None:
    from trn.detect.boxes import Detections
    from trn.detect.evaluate import match_frame

    label, unsure = np.array([[0, 10, 0, 10]], np.float32), np.array([[50, 70, 50, 70]], np.float32)
    d = Detections(np.array([[0, 10, 0, 10], [50, 70, 51, 70], [100, 110, 100, 110]], np.float32),
                   np.array([0.9, 0.8, 0.7], np.float32))
    m = match_frame(d.boxes, d.scores, label)
    e = _real_nac().errors([RealImage(tmp_path / "a.png", "a", "val", label, unsure)], [m], [d], 0.5)
    assert e["false_on_a_doubtful_box"] == 1  # of the two false detections, one lies on the doubtful box
    assert "false_on_a_doubtful_box" not in _real_nac().errors([RealImage(tmp_path / "a.png", "a", "val", label)],
                                                               [m], [d], 0.5)


def test_doubtful_boxes_are_refused_for_a_set_whose_labels_carry_no_agreement(tmp_path: Path) -> None:
    from trn.detect.realsets import real_images
    from trn.errors import ConfigError

    with pytest.raises(ConfigError, match="francis-ctx-mars"):
        real_images("craterdanet-nac", tmp_path, "train", doubtful=True)
    with pytest.raises(SystemExit, match="--doubtful"):
        _real_nac().main(["frames", "--set", "themis-dayir-mars", "--root", str(tmp_path), "--factor", "2",
                          "--out", str(tmp_path / "t"), "--doubtful"])
    assert not (tmp_path / "t").exists()


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


def test_voc_files_are_read_with_their_annotators_agreement_and_bad_ones_refused(tmp_path: Path) -> None:
    from trn.detect.realsets import read_voc_boxes

    obj = ("<object><name>crater</name><bndbox><xmin>{}</xmin><ymin>{}</ymin><xmax>{}</xmax><ymax>{}</ymax>"
           "</bndbox>{}</object>")
    (tmp_path / "a.xml").write_text("<annotation>" + obj.format(10, 20, 16, 27, "<confidence>3</confidence>")
                                    + obj.format(1, 2, 4, 6, "<confidence>1</confidence>")
                                    + obj.format(5, 5, 9, 9, "") + "</annotation>")
    np.testing.assert_array_equal(read_voc_boxes(tmp_path / "a.xml"), [[10, 16, 20, 27], [1, 4, 2, 6], [5, 9, 5, 9]])
    # the agreement filter keeps boxes of enough annotators, and boxes that carry no agreement (an expert's)
    np.testing.assert_array_equal(read_voc_boxes(tmp_path / "a.xml", 2), [[10, 16, 20, 27], [5, 9, 5, 9]])
    # the boxes too few annotators drew: an upper bound keeps only boxes that carry an agreement
    np.testing.assert_array_equal(read_voc_boxes(tmp_path / "a.xml", 0, 1), [[1, 4, 2, 6]])
    (tmp_path / "b.xml").write_text("<annotation>" + obj.format(10, 20, 10, 27, "") + "</annotation>")
    with pytest.raises(DataError, match="object 1"):
        read_voc_boxes(tmp_path / "b.xml")
    (tmp_path / "c.xml").write_text("<annotation><object><bndbox><xmin>x</xmin></bndbox></object></annotation>")
    with pytest.raises(DataError, match="numeric bndbox"):
        read_voc_boxes(tmp_path / "c.xml")
    (tmp_path / "d.xml").write_text("<annotation><object>")
    with pytest.raises(DataError, match="not a Pascal VOC"):
        read_voc_boxes(tmp_path / "d.xml")
    (tmp_path / "e.xml").write_text('<!DOCTYPE a [<!ENTITY x "y">]><annotation>&x;</annotation>')
    with pytest.raises(DataError, match="entities"):
        read_voc_boxes(tmp_path / "e.xml")


def test_the_mars_ctx_tiles_are_split_by_tile_with_the_expert_tiles_for_test() -> None:
    from trn.detect.realsets import FRANCIS_SPLIT, FRANCIS_TILE

    tiles = {FRANCIS_TILE.fullmatch(p).group(1) for p in real_set("francis-ctx-mars").files if FRANCIS_TILE.fullmatch(p)}
    assert tiles == set("ABCDEFGHIJKL") == set(FRANCIS_SPLIT)
    experts = {p.rsplit("-", 1)[1][0] for p in real_set("francis-ctx-mars").files if "/expert/" in p}
    assert experts == {t for t, s in FRANCIS_SPLIT.items() if s == "test"}
    assert {s for s in FRANCIS_SPLIT.values()} == {"train", "val", "test"}


def test_the_command_line_names_every_catalogued_set() -> None:
    from trn.cli.detect import REAL_SET_NAMES
    from trn.detect.realsets import LABELLED_SIDE_PX, REAL_SETS, SET_SPLITS

    assert set(REAL_SET_NAMES) == set(REAL_SETS) == set(SET_SPLITS) == set(LABELLED_SIDE_PX)


def test_a_file_whose_hash_is_not_the_catalogued_one_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    """install_set copies a set out of a checkout only file by file against the catalogue: a file
    changed in the checkout is refused by name and never written; verify_set names a copy's
    missing and changed files."""
    from trn.detect.realsets import install_set, verify_set

    s = real_set("francis-ctx-mars")
    checkout = tmp_path / "checkout"
    for rel in s.files:
        (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
        (checkout / rel).write_bytes(b"not the catalogued file")
    out = tmp_path / "out"
    with pytest.raises(DataError, match="SHA-256"):
        install_set("francis-ctx-mars", checkout, out)
    assert not any(p.is_file() for p in out.rglob("*")) if out.exists() else True
    problems = verify_set("francis-ctx-mars", out)
    assert len(problems) == len(s.files) and all(p.endswith("missing") for p in problems)
    first = next(iter(s.files))
    (out / first).parent.mkdir(parents=True, exist_ok=True)
    (out / first).write_bytes(b"changed")
    assert f"{first}: SHA-256 differs from the catalogue" in verify_set("francis-ctx-mars", out)


MIRROR = Path("/work/.mirror/aliFrancis+mars-crater-catalogue/repo")


@pytest.mark.skipif(not MIRROR.is_dir(), reason="no snapshot of aliFrancis/mars-crater-catalogue here (fetch it)")
def test_the_mars_ctx_set_installs_from_its_snapshot_and_reads_its_labels(tmp_path: Path) -> None:
    from trn.detect.realsets import install_set, verify_set

    install_set("francis-ctx-mars", MIRROR, tmp_path)
    assert verify_set("francis-ctx-mars", tmp_path) == []
    counts = {im.observation: len(im.boxes) for im in real_images("francis-ctx-mars", tmp_path)}
    # expert boxes on the test tiles, merged boxes of two or more annotators elsewhere
    assert counts["MC11E-D"] == 52 and counts["MC11E-L"] == 589 and counts["MC11E-A"] == 683
    assert sum(counts.values()) == 3216


def test_yolo_files_are_read_in_pixels_and_bad_lines_refused(tmp_path: Path) -> None:
    from trn.detect.realsets import read_yolo_boxes

    (tmp_path / "a.txt").write_text("0 0.5 0.25 0.125 0.0625\n\n0 0.1 0.9 0.05 0.1\n")
    np.testing.assert_allclose(read_yolo_boxes(tmp_path / "a.txt", 400, 200),
                               [[175, 225, 43.75, 56.25], [30, 50, 170, 190]])
    for bad, what in (("0 0.5 0.5 0 0.1", "line 1"), ("0 1.5 0.5 0.1 0.1", "line 1"), ("0 0.5 0.5 0.1", "line 1"),
                      ("0 0.5 0.5 0.1 0.1\n0 a 0.5 0.1 0.1", "line 2")):
        (tmp_path / "b.txt").write_text(bad)
        with pytest.raises(DataError, match=what):
            read_yolo_boxes(tmp_path / "b.txt", 416, 416)


def test_the_themis_tiles_are_split_by_tile_with_each_duplicate_image_kept_once() -> None:
    from trn.detect.realsets import SET_SPLITS, THEMIS_TILE, themis_split

    files = real_set("themis-dayir-mars").files
    split = SET_SPLITS["themis-dayir-mars"]
    assert split == themis_split()  # the same every time
    tiles = {Path(p).stem for p in files if THEMIS_TILE.fullmatch(p)}
    assert set(split) == tiles and len(tiles) == 777
    assert {f"dataset_generation/416_train_val/train/labels_backup/{t}.txt" for t in tiles} <= set(files)
    by_hash: dict[str, list[str]] = {}
    for p in files:
        if THEMIS_TILE.fullmatch(p):
            by_hash.setdefault(files[p], []).append(Path(p).stem)
    for names in by_hash.values():  # one image: the lowest number is kept, every other is a duplicate
        names.sort(key=lambda n: int(n[len("crater"):]))
        assert split[names[0]] != "duplicate" and all(split[n] == "duplicate" for n in names[1:])
    counts = {s: sum(v == s for v in split.values()) for s in ("train", "val", "test", "duplicate")}
    assert counts["duplicate"] == 65 and counts["test"] > 80 and counts["val"] > 80


THEMIS_MIRROR = Path("/work/.mirror/ACSE-jz1121+Crater_detection_self_training/repo")


@pytest.mark.skipif(not THEMIS_MIRROR.is_dir(), reason="no snapshot of ACSE-jz1121/Crater_detection_self_training here")
def test_the_themis_set_installs_from_its_snapshot_and_reads_its_labels(tmp_path: Path) -> None:
    from trn.detect.realsets import install_set, verify_set

    install_set("themis-dayir-mars", THEMIS_MIRROR, tmp_path)
    assert verify_set("themis-dayir-mars", tmp_path) == []
    images = real_images("themis-dayir-mars", tmp_path)
    assert len(images) == 712 and sum(len(im.boxes) for im in images) == 4441
    assert {im.split for im in images} == {"train", "val", "test"}


def _real_nac():
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "detector" / "real_nac.py"
    spec = importlib.util.spec_from_file_location("real_nac", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_training_frames_are_refused_for_the_set_kept_for_validation(tmp_path: Path) -> None:
    real_nac = _real_nac()
    with pytest.raises(SystemExit, match="kept for validation and never trained on"):
        real_nac.main(["frames", "--set", "robbins-ctx-mars", "--root", str(tmp_path), "--factor", "1",
                       "--out", str(tmp_path / "f")])
    with pytest.raises(SystemExit, match="--val names NAC observations"):
        real_nac.main(["frames", "--set", "themis-dayir-mars", "--root", str(tmp_path), "--factor", "1",
                       "--out", str(tmp_path / "f"), "--val", "M115143943"])
    assert not (tmp_path / "f").exists()


@pytest.mark.skipif(not MIRROR.is_dir(), reason="no snapshot of aliFrancis/mars-crater-catalogue here (fetch it)")
def test_training_frames_of_another_set_hold_its_train_and_validation_tiles_only(tmp_path: Path) -> None:
    import json

    from trn.detect.realsets import install_set

    install_set("francis-ctx-mars", MIRROR, tmp_path / "set")
    assert _real_nac().main(["frames", "--set", "francis-ctx-mars", "--root", str(tmp_path / "set"), "--factor", "0.5",
                             "--out", str(tmp_path / "f")]) == 0
    settings = json.loads(next((tmp_path / "f").glob("*.json")).read_text())
    names = "".join(settings.get("settings", settings).get("images", []))
    assert all(f"MC11E-{t}" not in names for t in "DFKL")  # the test tiles are never written
    assert all(f"MC11E-{t}" in names for t in "ABCEGHIJ")
    # with --doubtful the boxes of one annotator come too, flagged, and the others are unchanged
    from trn.detect.realsets import real_images

    assert _real_nac().main(["frames", "--set", "francis-ctx-mars", "--root", str(tmp_path / "set"), "--factor", "0.5",
                             "--out", str(tmp_path / "g"), "--doubtful"]) == 0
    ims = real_images("francis-ctx-mars", tmp_path / "set", "train", doubtful=True)
    assert sum(len(im.doubtful) for im in ims) == 881 and sum(len(im.boxes) for im in ims) == 1912
    assert real_images("francis-ctx-mars", tmp_path / "set", "test", doubtful=True)[0].doubtful.shape == (0, 4)
    plain, flagged = (read_labels(tmp_path / d).frames for d in ("f", "g"))
    assert [[b for b in f.boxes if not b.doubtful] for f in flagged] == [list(f.boxes) for f in plain]
    assert any(b.doubtful for f in flagged for b in f.boxes)


def test_the_scale_sweep_tries_every_triple_of_scales_only_when_asked() -> None:
    combos = _real_nac()._combos
    scales, edges = [0.5, 2.5, 1, 2], [16, 32]

    def triples(rows):
        return {tuple(b.factor for b in r) for r in rows if len(r) == 3}

    narrow, wide = combos(scales, edges), combos(scales, edges, all_triples=True)
    assert triples(narrow) == {(2.5, 2, 0.5), (2.5, 1, 0.5)}  # the finest and coarsest always
    assert triples(wide) == {(2.5, 2, 1), (2.5, 2, 0.5), (2.5, 1, 0.5), (2, 1, 0.5)}
    assert len(wide) == 4 + 6 * 2 + 4 * 1  # alone, pairs at each edge, triples at each increasing pair
    for r in wide:  # bands tile the sizes: each starts where the one before ends, finest first
        assert r[0].min_px == 0 and r[-1].max_px == float("inf")
        assert all(a.max_px == b.min_px and a.factor > b.factor for a, b in zip(r, r[1:]))


def test_the_shared_fine_sweep_runs_two_fine_scales_over_the_same_small_craters() -> None:
    rows = _real_nac()._shared_fine_combos([0.5, 2.5, 1.5, 1], [24, 48])
    assert len(rows) == 3 * 2  # the pairs of the three fine scales, at each boundary
    for (f, g, c) in rows:
        assert f.factor > g.factor > c.factor == 0.5
        assert f.min_px == g.min_px == 0 and f.max_px == g.max_px == c.min_px and c.max_px == float("inf")


def test_a_sweep_cut_into_parts_is_joined_only_when_every_part_is_there(tmp_path: Path) -> None:
    import json

    real_nac = _real_nac()
    rows = [{"bands": [[f, 0.0, "inf"]], "labelled_range": {"f1": f / 10, "threshold": 0.3}, "every_detection": {}}
            for f in (3.0, 2.0, 1.0)]

    def sweep(name, set_, part, rs, model="m", grid=None):
        path = tmp_path / name
        path.write_text(json.dumps({"set": set_, "floor": 0.1, "model": model, "part": part, "rows": rs,
                                    "grid": grid or {"scales": [3.0, 2.0, 1.0]}}))
        return str(path)

    a0 = sweep("a0.json", "francis-ctx-mars", [0, 2], rows[0::2])
    a1 = sweep("a1.json", "francis-ctx-mars", [1, 2], rows[1::2])
    b = sweep("b.json", "themis-dayir-mars", [0, 1], rows)
    out = tmp_path / "choice.json"
    assert real_nac.main(["choose", a0, a1, b, "--json", str(out)]) == 0
    chosen = json.loads(out.read_text())
    assert chosen["combinations"] == 3 and chosen["rows"][0]["bands"] == [[3.0, 0.0, "inf"]]
    with pytest.raises(SystemExit, match="expected each of 0/2 to 1/2 once"):
        real_nac.main(["choose", a0, b])  # a part left out would rank only half the combinations
    with pytest.raises(SystemExit, match="different models"):
        real_nac.main(["choose", a0, sweep("c.json", "francis-ctx-mars", [1, 2], rows[1::2], model="other"), b])
    with pytest.raises(SystemExit, match="different scales"):
        real_nac.main(["choose", a0, sweep("d.json", "francis-ctx-mars", [1, 2], rows[1::2], grid={"scales": [1.0]}), b])
    with pytest.raises(SystemExit, match="--part"):
        real_nac.main(["sweep", "m", "--root", str(tmp_path), "--scales", "1", "--cache", str(tmp_path), "--part", "2/2"])
