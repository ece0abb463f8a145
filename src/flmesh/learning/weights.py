"""A model's starting weights from a local state-dict file (``[model] weights``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn


class ModelError(ValueError):
    """The model cannot be built for this data; the message says why."""


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _final_linear(model: nn.Module) -> str | None:
    """The name of the model's last nn.Linear module (its classifier), if any."""
    last = None
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            last = name
    return last


def _hint(key: str) -> str:
    if key.rsplit(".", 1)[-1] in ("running_mean", "running_var", "num_batches_tracked"):
        return " (batch-norm statistics: was the file saved with the same [model] norm?)"
    if key == "conv1.weight":
        return " (check [model] small_input: 3x3 small-input stem vs 7x7 ImageNet stem)"
    return ""


def load_weights(model: nn.Module, path: str | Path) -> list[str]:
    """Copy the tensors of a state-dict file (``torch.save(model.state_dict(), path)``)
    into ``model``; returns the names it left as they were.

    The file is read with ``torch.load(weights_only=True)``, so it cannot run code.
    Every tensor must match by name and shape, except the final linear layer,
    which keeps its fresh initialisation when the file has another number of
    classes. Anything else raises ModelError naming the file and the first tensor
    that does not fit; the model is only changed when the whole file fits.
    """
    where = f"[model] weights {path}"
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ModelError(f"{where}: file not found") from None
    except Exception as exc:  # unpickling, zip and torch errors alike: the file is not usable
        raise ModelError(f"{where}: not a state dict saved with torch.save ({one_line(exc)})") from None
    if isinstance(state, Mapping) and isinstance(state.get("state_dict"), Mapping):
        state = state["state_dict"]  # a checkpoint that wraps the state dict
    if not isinstance(state, Mapping) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise ModelError(f"{where}: expected a state dict (tensor name -> tensor), "
                         f"got {type(state).__name__}")
    if state and all(k.startswith("module.") for k in state):  # saved from (Distributed)DataParallel
        state = {k.removeprefix("module."): v for k, v in state.items()}

    own = model.state_dict()
    head = _final_linear(model)
    head_keys = {f"{head}.weight", f"{head}.bias"} if head is not None else set()
    keep: list[str] = []
    for key, mine in own.items():
        theirs = state.get(key)
        if theirs is None:
            raise ModelError(f"{where} does not fit model: tensor {key!r} is missing from the file"
                             f"{_hint(key)}")
        if theirs.shape != mine.shape:
            if key in head_keys and theirs.shape[1:] == mine.shape[1:]:
                keep.append(key)  # another number of classes: this layer starts fresh
                continue
            raise ModelError(f"{where} does not fit model: tensor {key!r} has shape "
                             f"{list(theirs.shape)} in the file, the model needs {list(mine.shape)}"
                             f"{_hint(key)}")
    extra = next((k for k in state if k not in own), None)
    if extra is not None:
        raise ModelError(f"{where} does not fit model: the file has tensor {extra!r}, which the "
                         f"model lacks{_hint(extra)}")
    with torch.no_grad():
        for key, mine in own.items():
            if key not in keep:
                mine.copy_(state[key])
    return keep
