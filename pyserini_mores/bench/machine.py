"""What the benchmark knows about the machine: cores, CPU, torch, the measured GEMM peak, and peak RSS per
measurement (Linux lets a process reset its own high-water mark)."""
from __future__ import annotations

import ctypes
import gc
import logging
import os
import platform
import resource
import statistics
import sys
import time

logger = logging.getLogger(__name__)

#: CPU flags worth reporting next to bf16 numbers (AMX tiles, AVX-512 bf16 dot products).
INTERESTING_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")
DEFAULT_PEAK_SIZES = (1024, 2048)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("flags"):
                    present = set(line.split(":", 1)[1].split())
                    return [flag for flag in INTERESTING_FLAGS if flag in present]
    except OSError:
        pass
    return []


def measure_gemm_peak(dtype_name: str, sizes=DEFAULT_PEAK_SIZES, repetitions: int = 5, device="cpu") -> dict:
    """GFLOP/s of square ``N×N @ N×N`` matmuls (``2·N³`` FLOPs) in ``dtype_name`` (``fp32``/``bf16``) on ``device``,
    median of ``repetitions`` after one warm-up per size; ``peak_gflops`` is the best size's median."""
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    device = torch.device(device)
    # a GPU runs matmuls asynchronously: wait for each before reading the clock
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    per_size = {}
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for size in sizes:
            a = torch.randn(size, size, generator=generator).to(device, dtype)
            b = torch.randn(size, size, generator=generator).to(device, dtype)
            torch.mm(a, b)
            synchronize()
            times = []
            for _ in range(repetitions):
                start = time.perf_counter()
                torch.mm(a, b)
                synchronize()
                times.append(time.perf_counter() - start)
            per_size[str(size)] = 2 * size ** 3 / statistics.median(times) / 1e9
    return {"peak_gflops": max(per_size.values()), "gflops_by_size": per_size, "repetitions": repetitions}


def capability(device="cpu") -> dict:
    """What decides which kernels run and how fast bf16 is: PyTorch's CPU vector capability (``AVX2``, ``AVX512``,
    ...), whether oneDNN has bf16 kernels, the package's verdict on native bf16 for ``device`` and its reason, and
    the GPU's name when ``device`` is one. The same code gives different speed-ups on different hardware, so every
    report carries this."""
    import torch

    from ..precision import bf16_support

    device = torch.device(device)
    support = bf16_support(device)
    return {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkldnn_bf16_supported": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "bf16_native": support.native,
        "bf16_reason": support.reason,
    }


def machine_info(peaks: dict[str, dict], device="cpu") -> dict:
    """The JSON ``machine`` object (``peaks``: :func:`measure_gemm_peak` results by precision, measured on
    ``device``; its :func:`capability` included)."""
    import torch

    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:
        available = os.cpu_count()
    info = {
        "cores": os.cpu_count(),
        "cores_available": available,
        "cpu_model": cpu_model(),
        "cpu_flags": cpu_flags(),
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "mkldnn": bool(torch.backends.mkldnn.is_available()),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        **capability(device),
    }
    for precision, peak in peaks.items():
        info[f"peak_gflops_{precision}"] = round(peak["peak_gflops"], 2)
        info[f"peak_gemm_{precision}"] = peak
    return info


def release_memory() -> None:
    """Collect garbage and hand freed heap back to the OS, so the next peak-RSS reading starts low."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS to its current RSS (Linux ≥ 4.0: ``echo 5 > /proc/self/clear_refs``).

    Returns whether it worked; when not, later peaks are process-wide."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float:
    """Peak resident set size (MiB) since the last successful :func:`reset_peak_rss`, or since start; includes
    the sidecar pages the memory map touched."""
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return kib / 1024.0


__all__ = ["cpu_model", "cpu_flags", "measure_gemm_peak", "capability", "machine_info", "release_memory",
           "reset_peak_rss", "peak_rss_mb"]
