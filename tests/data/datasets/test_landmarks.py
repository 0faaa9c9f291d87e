"""Landmark set readers: HiRISE v3 variants grouped as views, generic folders, Luna-1 craters."""

import json
import cv2
import numpy as np
import pytest

from trn.data.datasets.landmarks import read_folder, read_hirise, read_luna1_landmarks
from trn.errors import DataError


def img(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), np.zeros((8, 8), np.uint8))


def test_hirise_groups_variants_and_keeps_craters(tmp_path):
    names = ["ESP_1_RED-0001", "ESP_1_RED-0002"]
    lines = []
    for n in names:
        for suffix in ["", "-r90", "-r180", "-r270", "-fh", "-fv", "-brt"]:
            img(tmp_path / "map-proj-v3_2" / f"{n}{suffix}.jpg")
            lines.append(f"{n}{suffix}.jpg 1")
    img(tmp_path / "map-proj-v3_2" / "ESP_9_RED-0003.jpg")
    lines.append("ESP_9_RED-0003.jpg 2")
    (tmp_path / "labels-map-proj_v3_2.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "landmarks_map-proj-v3_2_classmap.csv").write_text("0,other\n1,crater\n2,dark dune\n")
    s = read_hirise(tmp_path)
    assert s.instances == names
    assert s.views_per_instance() == {names[0]: 7, names[1]: 7}
    assert {i.view for i in s.items} == {"orig", "r90", "r180", "r270", "fh", "fv", "brt"}


def test_hirise_errors(tmp_path):
    with pytest.raises(DataError, match="labels"):
        read_hirise(tmp_path)
    (tmp_path / "labels-map-proj_v3_2.txt").write_text("a.jpg 1\n")
    with pytest.raises(DataError, match="not found") as e:
        read_hirise(tmp_path)
    assert e.value.line == 1
    (tmp_path / "labels-map-proj_v3_2.txt").write_text("a.jpg crater\n")
    with pytest.raises(DataError, match="class id"):
        read_hirise(tmp_path)


def test_folder_formats(tmp_path):
    img(tmp_path / "stadium_a_0.png")
    img(tmp_path / "stadium_a_1.png")
    img(tmp_path / "lone_name.png")
    img(tmp_path / "x.jpg")
    img(tmp_path / "nested" / "v1.png")
    img(tmp_path / "nested" / "v2.png")
    s = read_folder(tmp_path)
    vpi = s.views_per_instance()
    assert vpi == {"stadium_a": 2, "lone_name": 1, "x": 1, "nested": 2}


def test_folder_and_luna1_errors(tmp_path):
    with pytest.raises(DataError, match="no images"):
        read_folder(tmp_path)
    with pytest.raises(DataError, match="not a Luna-1"):
        read_luna1_landmarks(tmp_path)
    img(tmp_path / "crater_images" / "3.png")
    img(tmp_path / "crater_images" / "12.png")
    assert read_luna1_landmarks(tmp_path).instances == ["3", "12"]


def _hirise(root, names=("ESP_1_RED-0001", "ESP_1_RED-0002")):
    lines = []
    for n in names:
        for suffix in ["", "-r90"]:
            img(root / "map-proj-v3_2" / f"{n}{suffix}.jpg")
            lines.append(f"{n}{suffix}.jpg 1")
    (root / "labels-map-proj_v3_2.txt").write_text("\n".join(lines) + "\n")
    (root / "landmarks_map-proj-v3_2_classmap.csv").write_text("0,other\n1,crater\n")


def test_kinds_are_detected_and_too_few_identities_refused(tmp_path, capsys):
    from trn.cli import sim as sim_cli
    from trn.data.datasets.landmarks import detect_kind, read_landmarks

    _hirise(tmp_path / "hirise")
    for i in range(3):
        img(tmp_path / "folder" / f"lm{i}.png")
    for i in (1, 2, 3):
        img(tmp_path / "luna" / "crater_images" / f"{i}.png")
    assert [detect_kind(tmp_path / k) for k in ("hirise", "folder", "luna")] == ["hirise", "folder", "luna1"]
    ls, kind = read_landmarks(tmp_path / "hirise")
    assert kind == "hirise" and len(ls.instances) == 2 and len(ls.items) == 4
    _hirise(tmp_path / "one", names=("ESP_1_RED-0001",))
    with pytest.raises(DataError, match="HiRISE v3 layout .*detected kind 'hirise'.* holds 1 landmark identity"):
        read_landmarks(tmp_path / "one")
    with pytest.raises(DataError, match="generic folder .*given kind 'folder'.* holds 1"):
        read_landmarks(tmp_path / "one", "folder")  # the one labels file's folder holds a single image set
    rc = sim_cli.main(["run", "landmarks", "--data", str(tmp_path / "one"), "--model", "ncc", "--no-progress",
                       "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 2 and "HiRISE v3 layout" in err and "training" not in err


def test_trn_train_detects_the_kind(tmp_path):
    from trn.train.config import from_dict, resolve_kind

    _hirise(tmp_path / "h")
    doc = {"data": {"kind": "auto", "path": str(tmp_path / "h")}, "model": {"preset": "flight"}}
    assert resolve_kind(from_dict(doc)).data.kind == "hirise"
    assert from_dict({**doc, "data": {"path": str(tmp_path / "h")}}).data.kind == "auto"  # the default


def test_a_missing_root_and_a_file_are_named_as_such(tmp_path):
    from trn.data.datasets.landmarks import detect_kind

    (tmp_path / "f").write_text("x")
    for reader in (read_folder, read_hirise, read_luna1_landmarks, detect_kind):
        with pytest.raises(DataError, match="directory does not exist"):
            reader(tmp_path / "nope")
        with pytest.raises(DataError, match="directory is a file, not a directory"):
            reader(tmp_path / "f")


def test_verify_images_names_every_unusable_image_and_its_cause(tmp_path):
    from trn.data.datasets.landmarks import refuse_bad_images, verify_images

    for i in range(6):
        img(tmp_path / f"lm{i}.png")
    img(tmp_path / "lm6.jpg")
    ls = read_folder(tmp_path)
    assert verify_images(ls) == []
    refuse_bad_images(ls)
    b = bytearray((tmp_path / "lm1.png").read_bytes())
    b[len(b) // 2] ^= 4
    (tmp_path / "lm1.png").write_bytes(bytes(b))
    (tmp_path / "lm2.png").write_bytes((tmp_path / "lm2.png").read_bytes()[:60])
    (tmp_path / "lm3.png").write_bytes(b"")
    (tmp_path / "lm6.jpg").write_bytes(b"not a jpeg")
    (tmp_path / "lm4.png").unlink()
    (tmp_path / "lm4.png").mkdir()
    msgs = [str(e) for e in verify_images(ls)]
    assert msgs == [f"{tmp_path / 'lm1.png'}: landmark image is corrupt (the checksum of its 'IDAT' chunk does not "
                    "match); replace it or rebuild the dataset",
                    f"{tmp_path / 'lm2.png'}: landmark image is truncated (its 'IDAT' chunk runs past the end of the "
                    "file); replace it or rebuild the dataset",
                    f"{tmp_path / 'lm3.png'}: landmark image is empty (0 bytes); replace it or rebuild the dataset",
                    f"{tmp_path / 'lm4.png'}: landmark image is a directory, not a file",
                    f"{tmp_path / 'lm6.jpg'}: landmark image cannot be decoded (corrupt or not an image); replace "
                    "or re-render it"]
    with pytest.raises(DataError, match=r"lm1.png: landmark image is corrupt .* \(and 4 more of 7 images\)"):
        refuse_bad_images(ls)


def test_the_split_refuses_a_navigation_sequence_without_readable_annotations(tmp_path):
    from trn.data.datasets.landmarks import split_identities

    for i in range(8):
        img(tmp_path / "crater_images" / f"{i}.png")
    ls = read_luna1_landmarks(tmp_path)
    assert len(split_identities(ls, tmp_path, "luna1").test) == 4  # no navigation sequence: nothing forced
    (tmp_path / "lro_navigation").mkdir()
    with pytest.raises(DataError, match="annotations file is missing"):
        split_identities(ls, tmp_path, "luna1")
    (tmp_path / "lro_navigation" / "annotations.txt").mkdir()
    with pytest.raises(DataError, match="annotations file is a directory"):
        split_identities(ls, tmp_path, "luna1")
    (tmp_path / "lro_navigation" / "annotations.txt").rmdir()
    (tmp_path / "lro_navigation" / "annotations.txt").write_text("nav_images/0.png 5,1,9,1,9 6,1,9,1,9 7,1,9,1,9\n")
    split = split_identities(ls, tmp_path, "luna1")
    assert {"5", "6", "7"} <= set(split.test)


def test_the_split_forces_every_scenes_navigation_craters_into_the_test_half(tmp_path):
    from trn.data.datasets.landmarks import forced_craters, split_identities
    from trn.data.datasets.luna1 import Luna1Metadata

    for i in range(1, 41):
        img(tmp_path / "crater_images" / f"{i}.png")
    (tmp_path / "lro_navigation").mkdir()
    (tmp_path / "lro_navigation" / "annotations.txt").write_text("nav_images/0.png 5,1,9,1,9\n")
    meta = Luna1Metadata(craters={i: {} for i in range(1, 41)},
                         navigation_craters={"physical": [5, 6], "authors": [7, 30, 31, 32]})
    (tmp_path / "metadata.json").write_text(meta.to_json())
    assert forced_craters(tmp_path) == {"5", "6", "7", "30", "31", "32"}
    ls = read_luna1_landmarks(tmp_path)
    split = split_identities(ls, tmp_path, "luna1")
    assert {"5", "6", "7", "30", "31", "32"} <= set(split.test) and len(split.test) == 20
    assert not {"5", "6", "7", "30", "31", "32"} & set(split.train + split.val)
    # a build of the other scene (another annotations file, the same metadata lists) splits alike
    (tmp_path / "lro_navigation" / "annotations.txt").write_text("nav_images/0.png 31,1,9,1,9 7,1,9,1,9\n")
    assert split_identities(ls, tmp_path, "luna1") == split
    # a hostile list is refused, naming the file and the fix
    doc = json.loads(meta.to_json())
    doc["navigation_craters"] = {"authors": ["7", 1.5]}
    (tmp_path / "metadata.json").write_text(json.dumps(doc))
    with pytest.raises(DataError, match="navigation_craters.*run its trn-data build command again"):
        forced_craters(tmp_path)
