"""ORT execution providers -> a torch device.

``providers`` / ``provider_options`` are checked like ORT's ``check_and_normalize_provider_args``
(``onnxruntime_inference_collection.py``): names or ``(name, options)`` tuples, options values turned
into strings, unavailable providers skipped with a warning, duplicates ignored. The first provider
that can run here picks the device: ``CUDAExecutionProvider`` -> ``cuda:<device_id>`` (default 0),
``CPUExecutionProvider`` -> ``cpu``; CPU is the fallback, as in ORT.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

CUDA, CPU = "CUDAExecutionProvider", "CPUExecutionProvider"


@dataclass(frozen=True)
class ProviderChoice:
    """The device chosen and what ``get_providers()`` / ``get_provider_options()`` report."""

    device: torch.device
    providers: list[str]
    options: dict[str, dict[str, str]]


def available_providers() -> list[str]:
    """The providers this machine can run, in ORT's default precedence."""
    return [CUDA, CPU] if torch.cuda.is_available() else [CPU]


def choose_provider(providers: Sequence | None, provider_options: Sequence | None) -> ProviderChoice:
    """The device for ``providers`` (all available ones when None), with ORT's checks and warnings."""
    available = available_providers()
    requested = (
        _normalize(providers, provider_options, available)
        if providers is not None
        else [(name, {}) for name in available]
    )
    for name, options in requested:
        if name == CUDA and CUDA in available:
            index = _device_id(options)
            return ProviderChoice(
                torch.device("cuda", index), [CUDA, CPU], {CUDA: {**options, "device_id": str(index)}, CPU: {}}
            )
        if name == CPU:
            return ProviderChoice(torch.device("cpu"), [CPU], {CPU: options})
    return ProviderChoice(torch.device("cpu"), [CPU], {CPU: {}})


def _normalize(
    providers: Sequence, provider_options: Sequence | None, available: list[str]
) -> list[tuple[str, dict[str, str]]]:
    if isinstance(providers, str) or not isinstance(providers, Sequence):
        raise ValueError("'providers' should be a sequence.")
    if provider_options is not None:
        if isinstance(provider_options, str) or not isinstance(provider_options, Sequence):
            raise ValueError("'provider_options' should be a sequence.")
        if len(providers) != len(provider_options):
            raise ValueError("'providers' and 'provider_options' should be the same length if both are given.")
        if not all(isinstance(name, str) for name in providers):
            raise ValueError("Only string values for 'providers' are supported if 'provider_options' is given.")
        if not all(isinstance(options, Mapping) for options in provider_options):
            raise ValueError("'provider_options' values must be dicts.")
        pairs = list(zip(providers, provider_options))
    else:
        pairs = []
        for provider in providers:
            if isinstance(provider, str):
                pairs.append((provider, {}))
            elif (
                isinstance(provider, tuple)
                and len(provider) == 2
                and isinstance(provider[0], str)
                and isinstance(provider[1], Mapping)
            ):
                pairs.append(provider)
            else:
                raise ValueError("'providers' values must be either strings or (string, dict) tuples.")
    normalized: dict[str, dict[str, str]] = {}
    for name, options in pairs:
        if name not in available:
            warnings.warn(
                f"Specified provider '{name}' is not in available provider names."
                f"Available providers: '{', '.join(available)}'",
                stacklevel=4,
            )
        if name in normalized:
            warnings.warn(f"Duplicate provider '{name}' encountered, ignoring.", stacklevel=4)
            continue
        normalized[name] = {str(key): str(value) for key, value in options.items()}
    return list(normalized.items())


def _device_id(options: Mapping[str, str]) -> int:
    text = options.get("device_id", "0")
    count = torch.cuda.device_count()
    if not text.isdigit() or int(text) >= count:
        raise ValueError(f"CUDAExecutionProvider option device_id: expected an integer in [0, {count}), got {text!r}")
    return int(text)
