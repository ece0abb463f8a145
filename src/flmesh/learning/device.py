"""Device selection, in one place: CUDA when present (and asked for), else CPU."""

from __future__ import annotations

import torch


class DeviceError(ValueError):
    """The configured device does not exist on this machine."""


def select_device(preference: str = "auto") -> torch.device:
    """Map a federation file's ``device`` ("auto", "cpu", "cuda", "cuda:N", "mps") to a device.

    "auto" picks the first CUDA device when one is visible, else the CPU. Asking
    for a device that is absent raises DeviceError naming it.
    """
    if preference == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(preference)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"device {preference!r}: no CUDA device is visible on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceError(f"device {preference!r}: only {torch.cuda.device_count()} "
                              "CUDA device(s) are visible")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise DeviceError(f"device {preference!r}: MPS is not available on this machine")
    return device
