"""Resource metering of a training job: wall-clock, peak RSS, peak GPU memory, energy.

Energy is measured with NVML's total-energy counter (read through ctypes from
libnvidia-ml, no extra package) when a CUDA device is in use; otherwise it is an estimate,
process CPU seconds × `CPU_WATTS_PER_CORE`, and `energy_method` says so next to the number.
Totals accumulate over resumed attempts (the checkpoint carries them).
"""

from __future__ import annotations

import ctypes
import resource
import time
from dataclasses import asdict, dataclass

import torch

from dpmed.peak_memory import peak_rss_bytes

CPU_WATTS_PER_CORE = 10.0  # assumed draw of one busy core (typical server core, W)


class _NVML:
    """Minimal NVML binding: total energy (mJ) of device 0 since driver load, or None."""

    def __init__(self, index: int) -> None:
        self.lib, self.handle = None, ctypes.c_void_p()
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                return
            if lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.handle)) != 0:
                return
            self.lib = lib
        except OSError:
            self.lib = None

    def energy_mj(self) -> float | None:
        if self.lib is None:
            return None
        value = ctypes.c_ulonglong()
        if self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle, ctypes.byref(value)) != 0:
            return None
        return float(value.value)


@dataclass
class Totals:
    """Accumulated over attempts (stored in the checkpoint)."""

    wall_clock_s: float = 0.0
    energy_wh: float = 0.0
    peak_rss_mb: float = 0.0
    peak_gpu_mem_mb: float | None = None
    attempts: int = 0


class ResourceMeter:
    """Meter one attempt on `device`; `snapshot()` gives the totals so far including it."""

    def __init__(self, device: torch.device, previous: Totals | None = None) -> None:
        self.device = device
        self.previous = previous or Totals()
        self._t0 = time.perf_counter()
        self._cpu0 = self._cpu_seconds()
        self._nvml = None
        self._energy0 = None
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            self._nvml = _NVML(index)
            self._energy0 = self._nvml.energy_mj()
            torch.cuda.reset_peak_memory_stats(device)

    @staticmethod
    def _cpu_seconds() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    def energy_method(self) -> str:
        if self._energy0 is not None:
            return "measured: NVML total energy counter of the GPU (GPU only, not CPU/RAM)"
        return (
            f"estimate: process CPU seconds x {CPU_WATTS_PER_CORE:g} W per busy core "
            "(no power sensor read)"
        )

    def snapshot(self) -> Totals:
        """Totals of previous attempts plus this one up to now."""
        wall = time.perf_counter() - self._t0
        if self._energy0 is not None and self._nvml is not None:
            now = self._nvml.energy_mj()
            energy = ((now or self._energy0) - self._energy0) / 3.6e6
        else:
            energy = (self._cpu_seconds() - self._cpu0) * CPU_WATTS_PER_CORE / 3600.0
        rss = peak_rss_bytes() / 2**20
        gpu = None
        if self.device.type == "cuda":
            gpu = torch.cuda.max_memory_allocated(self.device) / 2**20
            if self.previous.peak_gpu_mem_mb is not None:
                gpu = max(gpu, self.previous.peak_gpu_mem_mb)
        return Totals(
            wall_clock_s=self.previous.wall_clock_s + wall,
            energy_wh=self.previous.energy_wh + energy,
            peak_rss_mb=max(self.previous.peak_rss_mb, rss),
            peak_gpu_mem_mb=gpu,
            attempts=self.previous.attempts + 1,
        )

    def report(self, simulated_time_s: float) -> dict:
        """resources.json content."""
        totals = self.snapshot()
        s = int(round(totals.wall_clock_s))
        out = asdict(totals)
        out.update(
            device=str(self.device),
            energy_method=self.energy_method(),
            simulated_time_s=simulated_time_s,
            simulated_time_min=simulated_time_s / 60.0,
            wall_clock_hms=f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}",
        )
        return out
