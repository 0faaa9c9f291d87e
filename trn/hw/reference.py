"""Published latencies the latency model is calibrated on and validated against, each with the
exact place it comes from and the host it was measured on.

- **pycoral reference CSVs** (github.com/google-coral/pycoral, ``benchmarks/reference/``, file
  ``inference_reference_<machine>.csv``, one ``<model file> <ms>`` row per network; read at commit
  46f06c8, the files unchanged since 08ad320, 2020-11-05). Each figure is the mean of 200
  ``interpreter.invoke()`` calls timed by ``timeit`` in Python, without warm-up
  (``benchmarks/inference_benchmarks.py``). The hosts are named in that script's docstring:
  ``x86_64`` = Intel Xeon E5-1650 v3 (3.50 GHz) + USB Accelerator over USB 3.0; ``rp3b+`` =
  Raspberry Pi 3 B+ (v1.3) + USB Accelerator over USB 2.0. ``rp4b`` is not in the docstring;
  ``benchmarks/benchmark_utils.py`` ``machine_info()`` gives that name to a "Raspberry Pi 4 Model B"
  on a 32-bit (armv7l) OS, and the port is not stated (USB 3.0 is inferred: its Inception v4 row
  moves 34.6 MiB of streamed parameters in 141 ms, 257 MB/s, which USB 2.0 cannot carry).
- **Coral's benchmark page** (coral.ai/docs/edgetpu/benchmarks, Table 1 "Time per inference",
  column "Desktop CPU + USB Accelerator (USB 3.0) with Edge TPU", and "Desktop CPU" for the CPU
  alone): measured by Coral's C++ benchmarks (the page's note) on the desktop of its footnote 1,
  a host other than pycoral's x86_64 one; its own profile (``x86-xeon6154-coral-usb3``).
- **The MARs paper's supplement, Table 5** (ResNeXt-101 f + g, one crop).

``role`` says whether a figure was used to fit the calibrated numbers of the profiles
(``calibration``) or only to check the predictions (``validation``); ``benchmarks/hardware/latency_model.py``
also predicts every Coral figure from a fit without it (leave-one-out).
"""

from __future__ import annotations

from dataclasses import dataclass

PYCORAL = ("github.com/google-coral/pycoral @ 46f06c8 (file unchanged since 08ad320), "
           "benchmarks/reference/inference_reference_{machine}.csv, line {line}: {model}")
PYCORAL_HOSTS = {"x86_64": "Intel Xeon E5-1650 v3 (3.50 GHz) + USB 3.0",
                 "rp4b": "Raspberry Pi 4 Model B (32-bit OS) + USB (3.0 inferred)",
                 "rp3b+": "Raspberry Pi 3 B+ (v1.3) + USB 2.0"}
CORAL_PAGE = ("coral.ai/docs/edgetpu/benchmarks, Table 1, column 'Desktop CPU + USB Accelerator (USB 3.0) with "
              "Edge TPU', row '{row}'")
PAPER = "MARs paper, supplement Table 5 (ResNeXt-101 f + g, one crop)"

# the model file of each reference network in pycoral's CSVs, and its line (after the header)
PYCORAL_ROWS = {"inception_v4": ("inception_v4_299_quant_edgetpu.tflite", 3),
                "mobilenet_v1": ("mobilenet_v1_1.0_224_quant_edgetpu.tflite", 6),
                "mobilenet_v2": ("mobilenet_v2_1.0_224_quant_edgetpu.tflite", 7)}


def pycoral(network: str, machine: str) -> str:
    model, line = PYCORAL_ROWS[network]
    return PYCORAL.format(machine=machine, line=line, model=model) + f" (host: {PYCORAL_HOSTS[machine]})"


def coral_page(row: str) -> str:
    return CORAL_PAGE.format(row=row)


@dataclass(frozen=True)
class Published:
    network: str  # a name of trn.hw.zoo.ZOO
    profile: str  # a profile of hw/profiles: the host the figure was measured on
    host: str  # that host as the source names it (one host per profile; the profile's title names it too)
    ms: float  # as written at the source
    source: str
    role: str  # calibration or validation
    head: bool = False  # the figure includes the descriptor's head g (on the host)
    precision: str = "int8"  # host arithmetic on a CPU-only profile


E5, GOLD, PI4, PI3 = "Intel Xeon E5-1650 v3", "Intel Xeon Gold 6154", "Raspberry Pi 4", "Raspberry Pi 3 B+"
X86, X6154, RPI4, RPI3 = "x86-coral-usb3", "x86-xeon6154-coral-usb3", "rpi4-coral-usb3", "rpi3bplus-coral-usb2"
CAL, VAL = "calibration", "validation"

PUBLISHED = [
    # pycoral, x86_64 (Xeon E5-1650 v3)
    Published("mobilenet_v1", X86, E5, 2.17, pycoral("mobilenet_v1", "x86_64"), CAL),
    Published("mobilenet_v2", X86, E5, 2.29, pycoral("mobilenet_v2", "x86_64"), CAL),
    Published("inception_v4", X86, E5, 84.25, pycoral("inception_v4", "x86_64"), CAL),
    # Coral's page, its desktop (Xeon Gold 6154)
    Published("mobilenet_v1", X6154, GOLD, 2.4, coral_page("MobileNet v1 (224x224)"), CAL),
    Published("mobilenet_v2", X6154, GOLD, 2.6, coral_page("MobileNet v2 (224x224)"), CAL),
    Published("inception_v4", X6154, GOLD, 85.0, coral_page("Inception v4 (299x299)"), CAL),
    Published("resnet50", X6154, GOLD, 49.0, coral_page("ResNet-50 V1 (299x299)"), CAL),
    # pycoral, rp4b (the figures as the file writes them)
    Published("mobilenet_v1", RPI4, PI4, 4.203926894997494, pycoral("mobilenet_v1", "rp4b"), CAL),
    Published("mobilenet_v2", RPI4, PI4, 4.548063964998619, pycoral("mobilenet_v2", "rp4b"), VAL),
    Published("inception_v4", RPI4, PI4, 141.1971434499992, pycoral("inception_v4", "rp4b"), CAL),
    # pycoral, rp3b+
    Published("mobilenet_v1", RPI3, PI3, 9.0, pycoral("mobilenet_v1", "rp3b+"), CAL),
    Published("mobilenet_v2", RPI3, PI3, 10.61, pycoral("mobilenet_v2", "rp3b+"), VAL),
    Published("inception_v4", RPI3, PI3, 1054.94, pycoral("inception_v4", "rp3b+"), CAL),
    # the paper
    Published("resnext101", "laptop-i9-12900hk", "Intel Core i9-12900HK", 37.31, PAPER, CAL, head=True,
              precision="fp32"),
    Published("resnext101", "kcu105-microblaze-sclearn", "KCU105 (Kintex UltraScale) with a MicroBlaze", 12076.0,
              PAPER, CAL, head=True),
    Published("resnext101", "kcu105-rocket-sclearn", "KCU105 (Kintex UltraScale) with a RISC-V Rocket", 846.0, PAPER,
              CAL, head=True),
    Published("resnext101", "pynq-z2-coral-usb2", "PYNQ-Z2", 622.0, PAPER, VAL, head=True),
]
EMBED_DIM = 512  # the head g of the paper's descriptor and of ours
