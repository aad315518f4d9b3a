"""Binding checkpoint tensors to an nn.Module without copying them, and device parsing."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from ort_torch_train.errors import ModelError


def parse_device(device: str | torch.device) -> torch.device:
    """A torch device from ORT's spellings ("cpu", "cuda", "cuda:N"), checked to exist."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device: expected 'cpu', 'cuda' or 'cuda:N', got {device!r}") from exc
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"device {device!r} requested but CUDA is not available to torch here")
        index = torch.cuda.current_device() if parsed.index is None else parsed.index
        if index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) present")
        return torch.device("cuda", index)
    if parsed.type != "cpu":
        raise ValueError(f"device: expected 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    return parsed


def bind_parameters(module: nn.Module, params: Mapping[str, nn.Parameter]) -> None:
    """Register each parameter on ``module`` under its dotted name (``0.weight`` -> submodule ``0``).

    The same nn.Parameter objects are registered, so ``state_dict()``/``named_parameters()`` use
    the checkpoint's names and no tensor is copied.
    """
    for name, param in params.items():
        *path, leaf = name.split(".")
        owner = module
        for part in path:
            child = owner._modules.get(part)
            if child is None:
                _check_free(owner, part, name)
                child = nn.Module()
                owner.add_module(part, child)
            owner = child
        _check_free(owner, leaf, name)
        owner.register_parameter(leaf, param)


def _check_free(owner: nn.Module, attribute: str, full_name: str) -> None:
    if not attribute or hasattr(owner, attribute):
        raise ModelError(
            f"parameter {full_name!r} cannot be registered on the module: {attribute!r} is empty or already in use"
        )
