"""Where and in which precision a model computes: on a CUDA GPU where PyTorch sees one, else the CPU; in bf16 only
where the device runs it natively, fp32 elsewhere.

bf16 matmuls are faster than fp32 where the hardware has bf16 instructions — ~10× on CPUs with AMX, ~4.7× on a
2-core AMD EPYC with AVX512-BF16 (a [2048 × 384] · [384 × 1536] GEMM: 950 against 204 GFLOP/s), and on CUDA GPUs
with bf16 support; on CPUs without them (AVX2, plain AVX-512) PyTorch emulates bf16 and it is ~20× *slower* than
fp32. ``auto`` — the default of every command and of the Python API, for the device as for the precision —
therefore picks per machine, and says once per process what it chose and why. The precision depends on the device,
so both are resolved here, by every command and the Python API alike: a GPU asked for where there is none fails the
same way everywhere, before any model is loaded.
"""
from __future__ import annotations

import functools
import logging
import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

PRECISION_CHOICES = ("auto", "fp32", "bf16")
DEVICE_CHOICES = ("auto", "cpu", "cuda", "cuda:N")
_DEVICE_NAME = re.compile(r"auto|cpu|cuda(:\d+)?")
#: CPU flags (as Linux's /proc/cpuinfo names them) of native bf16 matrix instructions.
NATIVE_BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")


class DeviceUnavailableError(ValueError):
    """A device was asked for that this machine, or this PyTorch build, does not have."""


def check_device_name(name: str) -> str:
    """``name`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``) lower-cased, or :class:`ValueError`. Needs no torch, so
    that command lines check ``--device`` while ``--help`` stays instant."""
    normalised = str(name).strip().lower()
    if not _DEVICE_NAME.fullmatch(normalised):
        raise ValueError(f"device must be one of {', '.join(DEVICE_CHOICES)}, not '{name}'")
    return normalised


def resolve_device(requested: str | torch.device | None = "auto") -> torch.device:
    """The device for ``requested``: ``auto`` (or ``None``) is ``cuda`` when ``torch.cuda.is_available()``, else
    ``cpu`` (the choice logged once per process); ``cpu``, ``cuda`` and ``cuda:N`` as asked, once checked to exist.

    Raises:
        DeviceUnavailableError: a CUDA device was asked for where PyTorch sees none (or fewer than ``N + 1``).
        ValueError: not a device this package runs models on.
    """
    import torch

    name = check_device_name("auto" if requested is None else str(requested))
    if name == "auto":
        available = torch.cuda.is_available()
        device = torch.device("cuda" if available else "cpu")
        _log_once(f"device auto: {device} "
                  f"({torch.cuda.get_device_name(device) if available else 'torch.cuda.is_available() is False'})")
        return device
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = (f"this PyTorch build ({torch.__version__}) has no CUDA support" if torch.version.cuda is None
                   else f"PyTorch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU")
            raise DeviceUnavailableError(f"device '{name}' was asked for, but torch.cuda.is_available() is False: "
                                         f"{why}; use device cpu, or auto (a GPU only where there is one)")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise DeviceUnavailableError(f"device '{name}' was asked for, but PyTorch sees {count} CUDA "
                                         f"device{'s' if count != 1 else ''} (cuda:0 to cuda:{count - 1})")
    return device


@dataclass(frozen=True)
class Bf16Support:
    """Whether a device runs bf16 natively, and the facts behind the answer (for logs and benchmark records)."""

    native: bool
    reason: str


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str] | None:
    """The CPU's feature flags, or ``None`` where the system does not list them."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.split(":", 1)[1].split())
    return None


def cpu_bf16_support(flags: frozenset[str] | None = None, capability: str | None = None) -> Bf16Support:
    """bf16 support of this CPU, from its flags (``amx_bf16`` / ``avx512_bf16``) and PyTorch's vector capability.

    Where the flags cannot be read, PyTorch's own answer decides: its oneDNN bf16 path and an AVX-512 capability.
    """
    import torch

    if capability is None:
        capability = torch.backends.cpu.get_cpu_capability()
    if flags is None:
        flags = cpu_flags()
    if flags is not None:
        native = sorted(flags.intersection(NATIVE_BF16_CPU_FLAGS))
        if native:
            return Bf16Support(True, f"CPU ({platform.machine()}, PyTorch capability {capability}) has "
                                     f"{' and '.join(native)}")
        return Bf16Support(False, f"CPU ({platform.machine()}, PyTorch capability {capability}) has neither "
                                  f"{' nor '.join(NATIVE_BF16_CPU_FLAGS)}: bf16 would be emulated")
    native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()) and capability.startswith("AVX512")
    return Bf16Support(native, f"CPU flags unknown; PyTorch capability {capability}, oneDNN bf16 "
                               f"{'supported' if native else 'not native'}")


def bf16_support(device: str | torch.device = "cpu") -> Bf16Support:
    """bf16 support of ``device`` (``cpu``, ``cuda``, ``cuda:N``)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        native = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        name = torch.cuda.get_device_name(device) if torch.cuda.is_available() else "no CUDA device"
        return Bf16Support(native, f"{name}: bf16 {'supported' if native else 'not supported'}")
    if device.type == "cpu":
        return cpu_bf16_support()
    return Bf16Support(False, f"{device.type}: bf16 support unknown")


def resolve_precision(requested: str = "auto", device: str | torch.device = "cpu") -> str:
    """``fp32`` or ``bf16`` for ``requested`` (``auto``, ``fp32``, ``bf16``) on ``device``.

    ``auto`` is bf16 only where the device runs it natively; the choice is logged once per process. An explicit
    ``bf16`` on a device without native bf16 is honoured with a warning that it will be slow.
    """
    if requested not in PRECISION_CHOICES:
        raise ValueError(f"precision must be one of {', '.join(PRECISION_CHOICES)}, not '{requested}'")
    if requested == "fp32":
        return "fp32"
    support = bf16_support(device)
    if requested == "bf16":
        if not support.native:
            _warn_once(f"bf16 was asked for, but {support.reason}; it will run many times slower than fp32 "
                       "(--precision auto chooses fp32 here)")
        return "bf16"
    chosen = "bf16" if support.native else "fp32"
    _log_once(f"precision auto: {chosen} ({support.reason})")
    return chosen


@functools.cache
def _log_once(message: str) -> None:
    logger.info(message)


@functools.cache
def _warn_once(message: str) -> None:
    logger.warning(message)
