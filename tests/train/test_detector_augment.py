"""Each augmentation's effect on a constructed image: a turn keeps a crater's box on the crater and
returns only filled pixels; relief contrast scales the shading and keeps the albedo; filled
shadows lift the darkest levels only; an inverted response and the ranges are configured
strictly; and with every new augmentation off a sample draws what it drew before."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest

from trn.errors import ConfigError
from trn.train.detector import DetectTrainConfig, augment
from trn.train.detector_augment import AugmentConfig, fill_shadows, relief_contrast, rotate, turned_boxes


def crater_image(n: int = 256, centre=(70.0, 90.0), radius: float = 18.0) -> np.ndarray:
    """A flat grey plain with one shaded bowl: its sunward wall dark, the far wall bright."""
    yy, xx = np.mgrid[0:n, 0:n].astype(np.float64)
    dx, dy = xx - centre[0], yy - centre[1]
    r = np.hypot(dx, dy)
    img = np.full((n, n), 0.5)
    inside = r < radius
    img[inside] = 0.5 + 0.35 * (dx[inside] / radius)  # lit from +x: the -x wall in shade
    return img


def bright_disk(n: int, centre, radius: float) -> np.ndarray:
    yy, xx = np.mgrid[0:n, 0:n]
    return ((xx - centre[0]) ** 2 + (yy - centre[1]) ** 2 <= radius ** 2).astype(np.float32)


@pytest.mark.parametrize("angle", [0.0, 30.0, 90.0, 135.0, 200.0, 333.0])
def test_a_turned_crater_keeps_its_box(angle):
    """A disk drawn at a known place, turned: the returned box bounds the turned disk within a
    pixel, and the returned square is the one the turn keeps filled."""
    n, c, rad = 256, (150.0, 110.0), 14.0
    img = bright_disk(n, c, rad)
    box = np.array([[c[0] - rad, c[0] + rad, c[1] - rad, c[1] + rad]], np.float32)
    out, boxes, keep = rotate(img, box, angle)
    t = math.radians(angle)
    assert out.shape[0] == out.shape[1] == int(math.floor(n / (abs(math.cos(t)) + abs(math.sin(t)))))
    assert keep.tolist() == [True] and len(boxes) == 1
    ys, xs = np.nonzero(out > 0.5)
    l, r, top, b = boxes[0]
    assert abs(xs.min() - l) <= 1.5 and abs(xs.max() - r) <= 1.5 and abs(ys.min() - top) <= 1.5 and abs(ys.max() - b) <= 1.5


def test_a_turn_returns_only_pixels_that_came_from_the_image():
    """Every corner of the returned square maps back inside the source image (no filled corner,
    no mirrored crater)."""
    n = 300
    for angle in (17.0, 45.0, 100.0):
        out, _, _ = rotate(np.zeros((n, n), np.float32), np.zeros((0, 4), np.float32), angle)
        inner = out.shape[0]
        x0 = (n - inner) // 2
        c = (n - 1) / 2
        m = cv2.invertAffineTransform(cv2.getRotationMatrix2D((c, c), angle, 1.0))
        for x, y in ((x0, x0), (x0 + inner - 1, x0), (x0, x0 + inner - 1), (x0 + inner - 1, x0 + inner - 1)):
            sx, sy = m @ np.array([x, y, 1.0])
            assert -0.5 <= sx <= n - 0.5 and -0.5 <= sy <= n - 0.5, (angle, x, y, sx, sy)


def test_boxes_turned_off_the_kept_square_are_dropped_and_an_ellipse_box_is_turned():
    n = 256
    box = np.array([[2, 12, 2, 12], [100, 160, 120, 140]], np.float32)  # a corner crater; a 60 x 20 ellipse
    _, boxes, keep = rotate(np.zeros((n, n), np.float32), box, 45.0)
    assert keep.tolist() == [False, True]
    w, h = boxes[0, 1] - boxes[0, 0], boxes[0, 3] - boxes[0, 2]
    expect = 2 * math.sqrt((30 * math.cos(math.pi / 4)) ** 2 + (10 * math.sin(math.pi / 4)) ** 2)
    assert abs(w - expect) < 1e-3 and abs(h - expect) < 1e-3
    np.testing.assert_allclose(turned_boxes(box, 0.0, (128.0, 128.0)), box, atol=1e-4)


def test_relief_contrast_scales_the_shading_and_keeps_the_plain():
    img = crater_image()
    same = relief_contrast(img, 1.0, 8.0)
    np.testing.assert_allclose(same, img, atol=1e-6)
    strong = relief_contrast(img, 2.0, 8.0)
    bowl = np.s_[80:100, 55:85]
    base = cv2.GaussianBlur(img, (0, 0), 8.0)
    np.testing.assert_allclose((strong - base)[bowl], np.clip(2 * (img - base), -base, 1 - base)[bowl], atol=1e-6)
    assert (strong[bowl].max() - strong[bowl].min()) > 1.6 * (img[bowl].max() - img[bowl].min())
    assert abs(strong[200:, 200:].mean() - 0.5) < 1e-6  # far from the crater, the plain is unchanged


def test_filled_shadows_lift_the_darkest_levels_only():
    img = crater_image() + np.linspace(-0.2, 0.2, 256)[None, :]  # an albedo gradient across the plain
    out = fill_shadows(img, 0.3)
    lo, hi = np.percentile(img, [2, 98])
    floor = lo + 0.3 * (hi - lo)
    dark = img < floor
    assert dark.any() and (out[dark] > img[dark]).all() and (out[dark] <= floor).all()
    np.testing.assert_array_equal(out[~dark], img[~dark])
    np.testing.assert_array_equal(fill_shadows(np.full((8, 8), 0.5), 0.3), np.full((8, 8), 0.5))  # flat: unchanged


def test_every_new_augmentation_runs_when_asked_and_the_flags_follow_their_boxes():
    """Turned, relit, shadow-filled and inverted samples: a turned round crater keeps its size, so
    with each crater's flag set by its size (large or small) every whole box returned carries the
    flag of a crater of its own size."""
    rng0 = np.random.default_rng(0)
    img = (np.clip(crater_image() + rng0.normal(0, 0.02, (256, 256)), 0, 1) * 255).astype(np.uint8)
    sides = np.array([12.0, 20.0, 34.0, 44.0])
    centres = np.array([[100, 100], [150, 105], [105, 150], [150, 150]], np.float64)
    boxes = np.hstack([centres[:, :1] - sides[:, None] / 2, centres[:, :1] + sides[:, None] / 2,
                       centres[:, 1:] - sides[:, None] / 2, centres[:, 1:] + sides[:, None] / 2]).astype(np.float32)
    flags = sides > 27.0
    aug = AugmentConfig(rotate=1.0, relief=(0.5, 2.0), fill_shadows=1.0, invert=1.0, scale=(1.0, 1.0))
    checked, turned = 0, 0
    for seed in range(30):
        x, b, f = augment(img, boxes, 128, 6, np.random.default_rng(seed), flags, aug)
        assert x.shape == (128, 128) and np.isfinite(x).all() and len(b) == len(f)
        for q, g in zip(b, f):
            if q[0] > 0 and q[2] > 0 and q[1] < 128 and q[3] < 128:  # whole in the sample
                # the turn's inner square (>= 181 px) is never resized to reach the crop: sizes are kept
                side = float(np.sqrt((q[1] - q[0]) * (q[3] - q[2])))
                assert min(abs(side - sides)) < 0.5, (seed, side)
                assert bool(g) == (side > 27.0), (seed, side, g)
                checked += 1
        turned += not np.allclose(x, augment(img, boxes, 128, 6, np.random.default_rng(seed), flags,
                                             AugmentConfig(scale=(1.0, 1.0)))[0])
    assert checked > 20 and turned == 30


class Recorder:
    """A Generator that records every draw: (method, its positional arguments)."""

    def __init__(self, seed: int):
        self.rng, self.draws = np.random.default_rng(seed), []

    def __getattr__(self, name):
        method = getattr(self.rng, name)

        def draw(*args, **kwargs):
            self.draws.append((name, tuple(round(a, 9) if isinstance(a, float) else a for a in args
                                           if not isinstance(a, tuple))))
            return method(*args, **kwargs)
        return draw


def test_with_every_new_augmentation_off_the_draws_are_the_earlier_ones():
    """With the defaults a sample draws exactly what the shipped detectors' recipe drew, in order:
    the scale, the crop's corner, three symmetries, gain, gamma, then the ramp, blur and noise
    coins with their own draws. An augmentation that is off draws nothing."""
    img = (crater_image() * 255).astype(np.uint8)
    boxes = np.array([[52, 88, 72, 108]], np.float32)
    for seed in range(12):
        r = Recorder(seed)
        augment(img, boxes, 192, 6, r)
        names = [d[0] for d in r.draws]
        assert r.draws[0] == ("uniform", (round(math.log(0.75), 9), round(math.log(4 / 3), 9)))
        assert names[1:6] == ["integers", "integers", "random", "random", "random"]
        assert r.draws[6:8] == [("uniform", (0.5, 1.6)), ("uniform", (0.6, 1.6))]
        rest = names[8:]
        # ramp coin (+ angle and strength), blur coin (+ sigma), noise coin (+ sigma and the noise)
        i = 1 + 2 * (rest[1] == "uniform")
        assert rest[0] == "random" and rest[i] == "random"
        j = i + 1 + (rest[i + 1] == "uniform")
        assert rest[j] == "random" and rest[j + 1:] in ([], ["uniform", "normal"])
    a = augment(img, boxes, 192, 6, np.random.default_rng(3))
    b = augment(img, boxes, 192, 6, np.random.default_rng(3), aug=AugmentConfig(relief_sigma_px=20.0))
    assert all(np.array_equal(u, v) for u, v in zip(a, b))


def test_the_augment_section_is_read_strictly():
    cfg = DetectTrainConfig.from_dict({"data": ["d"], "augment": {"rotate": 0.5, "relief": [0.5, 2.0]}})
    assert cfg.augment.rotate == 0.5 and cfg.augment.relief == (0.5, 2.0)
    assert DetectTrainConfig.from_dict(cfg.to_dict()).augment == cfg.augment
    assert DetectTrainConfig.from_dict({"data": ["d"]}).augment == AugmentConfig()
    with pytest.raises(ConfigError, match="unknown key"):
        DetectTrainConfig.from_dict({"data": ["d"], "augment": {"rotation": 0.5}})
    for bad in ({"rotate": 1.5}, {"relief": [2.0, 1.0]}, {"gain": [0.0, 1.0]}, {"noise": 0.9}, {"scale": [1.0]}):
        with pytest.raises(ConfigError, match="augment"):
            AugmentConfig.from_dict(bad)
