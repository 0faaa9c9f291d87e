"""Published latencies the latency model is calibrated on and validated against.

Coral's Edge TPU benchmarks (https://coral.ai/docs/edgetpu/benchmarks/, also
``../shared/notes/edge-tpu-and-export-facts.md``) and the MARs paper's supplement, Table 5
(ResNeXt-101 f + g, one crop). ``role`` says whether a figure was used to fit the calibrated
numbers of the profiles (``calibration``) or only to check the predictions (``validation``);
``benchmarks/latency_model.py`` also reports a leave-one-out check over the Coral figures.
"""

from __future__ import annotations

from dataclasses import dataclass

CORAL = "Coral Edge TPU benchmarks, coral.ai/docs/edgetpu/benchmarks"
CORAL_DOCS = "Coral docs (ResNet-50 V1 299 px on a desktop with the USB Accelerator over USB 3)"
PAPER = "MARs paper, supplement Table 5 (ResNeXt-101 f + g, one crop)"


@dataclass(frozen=True)
class Published:
    network: str  # a name of trn.hw.zoo.ZOO
    profile: str  # a profile of hw/profiles
    ms: float
    source: str
    role: str  # calibration or validation
    head: bool = False  # the figure includes the descriptor's head g (on the host)
    precision: str = "int8"  # host arithmetic on a CPU-only profile


PUBLISHED = [
    Published("mobilenet_v1", "x86-coral-usb3", 2.17, CORAL, "calibration"),
    Published("mobilenet_v2", "x86-coral-usb3", 2.29, CORAL, "calibration"),
    Published("inception_v4", "x86-coral-usb3", 84.0, CORAL, "calibration"),
    Published("resnet50", "x86-coral-usb3", 49.0, CORAL_DOCS, "calibration"),
    Published("mobilenet_v1", "rpi4-coral-usb3", 4.20, CORAL, "calibration"),
    Published("mobilenet_v2", "rpi4-coral-usb3", 4.55, CORAL, "validation"),
    Published("inception_v4", "rpi4-coral-usb3", 141.0, CORAL, "calibration"),
    Published("mobilenet_v1", "rpi3bplus-coral-usb2", 9.0, CORAL, "calibration"),
    Published("mobilenet_v2", "rpi3bplus-coral-usb2", 10.61, CORAL, "validation"),
    Published("inception_v4", "rpi3bplus-coral-usb2", 1055.0, CORAL, "calibration"),
    Published("resnext101", "laptop-i9-12900hk", 37.31, PAPER, "calibration", head=True, precision="fp32"),
    Published("resnext101", "kcu105-microblaze-sclearn", 12076.0, PAPER, "calibration", head=True),
    Published("resnext101", "kcu105-rocket-sclearn", 846.0, PAPER, "calibration", head=True),
    Published("resnext101", "pynq-z2-coral-usb2", 622.0, PAPER, "validation", head=True),
]
EMBED_DIM = 512  # the head g of the paper's descriptor and of ours
