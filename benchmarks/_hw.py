"""Hardware and software description printed by every benchmark, and the process memory readings
the memory benchmarks take."""

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


def proc_status_mib(key: str) -> float:
    """``VmRSS`` or ``VmHWM`` of this process (Linux ``/proc/self/status``), MiB."""
    with open("/proc/self/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def reset_peak() -> None:
    """Start ``VmHWM`` again from the current resident set (Linux: write 5 to clear_refs)."""
    with open("/proc/self/clear_refs", "w", encoding="utf-8") as f:
        f.write("5")
