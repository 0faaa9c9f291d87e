"""Landmark set readers: HiRISE v3 variants grouped as views, generic folders, Luna-1 craters."""

import cv2
import numpy as np
import pytest

from trn.data.landmarks import read_folder, read_hirise, read_luna1_landmarks
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
