"""Hardware and software description printed by every benchmark."""

from __future__ import annotations

import os
import platform


def hardware() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            kb = int(f.readline().split()[1])
            mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    import cv2
    import numpy as np

    return (f"{cpu}, {os.cpu_count()} logical cores{mem}; Python {platform.python_version()}, "
            f"numpy {np.__version__}, opencv {cv2.__version__}")
