"""What a measurement ran on: the CPU, the cores this process may use, the load, the card.

Why this module exists: a benchmark table is only worth reading beside the machine it came
from, and the machine must be named the same way in every table: the offline bench's, the graph
bench's, the chapters' runner and ``make bench``. ``hardware`` gathers the facts as a dict (for
JSON reports); ``describe_hardware`` turns them into the one line a table prints under itself.

```pycon
>>> hw = {"cpu": "Some CPU", "cores": 2, "cpu_count": 4, "loadavg_1m": 0.5,
...       "torch": "2.9.0", "device": "cpu"}
>>> describe_hardware(hw)
'Some CPU, 2 cores usable of 4, load average 0.5 (1 min), torch 2.9.0'

```
"""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model() -> str:
    """The processor's name from ``/proc/cpuinfo``, else what ``platform`` knows."""
    info = Path("/proc/cpuinfo")
    for line in info.read_text().splitlines() if info.is_file() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def hardware(device: str | None = None) -> dict:
    """This machine as a dict: CPU, usable and total cores, 1-minute load, torch, the device and,
    on CUDA, the card and CUDA's version. ``device`` defaults to cuda where present, else cpu."""
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    hw = {"cpu": cpu_model(), "cores": cores, "cpu_count": os.cpu_count(),
          "loadavg_1m": round(os.getloadavg()[0], 2), "torch": torch.__version__,
          "device": device}
    if torch.device(device).type == "cuda":
        hw["gpu"] = torch.cuda.get_device_name()
        hw["cuda"] = torch.version.cuda
    return hw


def describe_hardware(hw: dict | None = None) -> str:
    """One line for a table's caption; without ``hw``, this machine on its default device."""
    hw = hardware() if hw is None else hw
    where = f"{hw['gpu']} (CUDA {hw['cuda']}) on " if "gpu" in hw else ""
    return (f"{where}{hw['cpu']}, {hw['cores']} cores usable of {hw['cpu_count']}, "
            f"load average {hw['loadavg_1m']} (1 min), torch {hw['torch']}")
