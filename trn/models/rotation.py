"""Rotation behaviour of a descriptor: how much its embedding of a landmark changes when the
image turns about its centre."""

from __future__ import annotations

import cv2
import numpy as np
import torch

from trn.data.views.crops import preprocess
from trn.models.descriptor import Descriptor


def rotate_image(img: np.ndarray, angle_deg: float) -> np.ndarray:
    """Rotate about the image centre (counter-clockwise as displayed), edges replicated."""
    h, w = img.shape
    m = cv2.getRotationMatrix2D((w / 2 - 0.5, h / 2 - 0.5), angle_deg, 1.0)
    return cv2.warpAffine(img, m, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)


@torch.no_grad()
def rotation_similarity(model: Descriptor, images: list[np.ndarray], angles: list[float]) -> np.ndarray:
    """Cosine similarity [len(images), len(angles)] between the embedding of each image and of
    the image rotated by each angle (1 = the embedding did not change)."""
    model.eval()
    s = model.cfg.input_size
    base = torch.from_numpy(np.stack([preprocess(i, s) for i in images])[:, None])
    e0 = model(base)
    out = np.zeros((len(images), len(angles)))
    for k, a in enumerate(angles):
        rot = torch.from_numpy(np.stack([preprocess(rotate_image(i, a), s) for i in images])[:, None])
        out[:, k] = (model(rot) * e0).sum(1).numpy()
    return out
