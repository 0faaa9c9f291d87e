"""Seeded-random fuzzing of every reader of outside input: annotation and pose parsers, the
training-config loader and the image readers. Each damaged input must either be read correctly
or be refused with a trn error (DataError / ConfigError) — never another exception."""

import numpy as np
import pytest
import yaml

from trn.data.datasets import luna1
from trn.data.worlds.trajectory import read_poses_csv, read_poses_kitti
from trn.errors import ConfigError, DataError, TrnError

RNG_SEEDS = range(3)


TOKENS = [b",", b" ", b"\n", b"-", b"nan", b"1e999", b"\xff", b"0x1", b"nav_images/"]


def mutate(data: bytes, rng: np.random.Generator) -> bytes:
    b = bytearray(data)
    for _ in range(int(rng.integers(1, 6))):
        op = int(rng.integers(5))
        i = int(rng.integers(len(b) + 1)) if b else 0
        if op == 0 and b:
            b[min(i, len(b) - 1)] = int(rng.integers(256))
        elif op == 1:
            b[i:i] = bytes(rng.integers(0, 256, int(rng.integers(1, 8)), dtype=np.uint8))
        elif op == 2 and b:
            del b[i:i + int(rng.integers(1, 12))]
        elif op == 3:
            b[i:i] = TOKENS[int(rng.integers(len(TOKENS)))]
        else:
            b = b[: int(rng.integers(len(b) + 1))]
    return bytes(b)


VALID_ANN = b"nav_images/0.png 1,10,40,12,44 5,50,90,60,99\nnav_images/1.png\nnav_images/2.png 9,0,20,0,20\n"
VALID_CSV = b"1737.0,0.0,100.0,1.0,0.0,0.0,0.0\n1737.5,1.0,100.0,0.7071068,0.7071068,0.0,0.0\n"
VALID_KITTI = b"1 0 0 1737 0 1 0 0 0 0 1 100\n1 0 0 1738 0 1 0 1 0 0 1 100\n"


@pytest.mark.parametrize("seed", RNG_SEEDS)
def test_annotation_and_pose_parsers(tmp_path, seed):
    rng = np.random.default_rng(seed)
    readers = [(VALID_ANN, luna1.read_annotations), (VALID_CSV, read_poses_csv),
               (VALID_KITTI, read_poses_kitti)]
    for valid, reader in readers:
        for _ in range(150):
            p = tmp_path / "f.txt"
            p.write_bytes(mutate(valid, rng))
            try:
                out = reader(p)
            except DataError as e:
                assert str(p) in str(e) and "\n" not in str(e)
                continue
            if isinstance(out, np.ndarray):
                assert np.isfinite(out).all()


@pytest.mark.parametrize("seed", RNG_SEEDS)
def test_config_loader(tmp_path, seed):
    from tests.train.test_training import base_doc
    from trn.train.config import load_config

    rng = np.random.default_rng(seed)
    valid = yaml.safe_dump(base_doc(tmp_path)).encode()
    values = [None, -1, 0, 1.5, "x", "1e-4", [], {}, [1, 2], True, "false", 1e9, float("nan")]
    for _ in range(120):
        p = tmp_path / "c.yaml"
        if rng.random() < 0.5:
            p.write_bytes(mutate(valid, rng))
        else:  # a well-formed document with one field replaced by a value of another type
            doc = base_doc(tmp_path)
            section = [doc] + [v for v in doc.values() if isinstance(v, dict)]
            node = section[int(rng.integers(len(section)))]
            key = list(node)[int(rng.integers(len(node)))]
            node[key] = values[int(rng.integers(len(values)))]
            p.write_text(yaml.safe_dump(doc))
        try:
            load_config(p)
        except ConfigError as e:
            assert "\n" not in str(e).strip() or "YAML" in str(e)
        except DataError:
            pass


@pytest.mark.parametrize("seed", RNG_SEEDS)
def test_image_readers(tmp_path, seed):
    import cv2

    from trn.data.datasets.landmarks import read_luna1_landmarks
    from trn.train.data import ImageBank

    rng = np.random.default_rng(seed)
    (tmp_path / "crater_images").mkdir()
    ok, png = cv2.imencode(".png", rng.integers(0, 255, (32, 32), dtype=np.uint8))
    good = png.tobytes()
    for k in range(40):
        (tmp_path / "crater_images" / "1.png").write_bytes(good)
        (tmp_path / "crater_images" / "2.png").write_bytes(mutate(good, rng))
        ls = read_luna1_landmarks(tmp_path)
        try:
            bank = ImageBank(ls, ["1", "2"], 16)
        except TrnError as e:
            assert "2.png" in str(e)
            continue
        assert bank.images.shape == (2, 1, 16, 16) and np.isfinite(bank.images.numpy()).all()
