"""Reading images: a PNG's structure checked before decoding, and every failure named by its cause."""

import cv2
import numpy as np
import pytest

from trn.data.files import png_structure, read_gray
from trn.errors import DataError


def _png_bytes(h: int = 12, w: int = 20) -> bytes:
    ok, buf = cv2.imencode(".png", np.arange(h * w, dtype=np.uint8).reshape(h, w))
    assert ok
    return buf.tobytes()


def test_png_structure_catches_every_single_byte_change_and_every_truncation():
    data = _png_bytes()
    assert png_structure(data) == ((12, 20), None)
    for i in range(len(data)):  # brute force: every byte of the file, each changed
        damaged = bytearray(data)
        damaged[i] ^= 0x10
        size, problem = png_structure(bytes(damaged))
        assert problem is not None, f"byte {i} changed, not caught"
    for n in range(len(data)):
        assert png_structure(data[:n])[1] is not None, f"cut at {n} bytes, not caught"
    assert png_structure(b"")[1] == "is empty (0 bytes)"
    assert "signature" in png_structure(b"GIF89a" + data[6:])[1]


def test_read_image_names_the_cause(tmp_path):
    p = tmp_path / "a.png"
    p.write_bytes(_png_bytes())
    assert read_gray(p).shape == (12, 20)
    for content, match in ((b"", "is empty"), (_png_bytes()[:40], "is truncated"), (b"text", "cannot be decoded")):
        p.write_bytes(content)
        with pytest.raises(DataError, match=match) as e:
            read_gray(p)
        assert e.value.path == str(p)
    with pytest.raises(DataError, match="image is a directory, not a file"):
        read_gray(tmp_path)
    with pytest.raises(DataError, match="image is missing"):
        read_gray(tmp_path / "nope.png")
