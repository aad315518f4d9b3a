"""Whole values copied into a state's parameters in place: a sharded parameter (a DTensor) takes this rank's piece."""

from __future__ import annotations

from collections.abc import Mapping

import torch


def copy_into_parameters(params: Mapping[str, torch.nn.Parameter], values: Mapping[str, torch.Tensor]) -> None:
    """Copy each whole value (already checked: the parameter's shape and a castable dtype) into its parameter
    in place, the unsharded ones in one batched copy; a sharded parameter takes this rank's piece of its value
    (no collective)."""
    sharded = {name for name in values if getattr(params[name], "device_mesh", None) is not None}
    whole = [name for name in values if name not in sharded]
    with torch.no_grad():
        if whole:
            targets: list[torch.Tensor] = [params[name] for name in whole]
            torch._foreach_copy_(targets, [values[name].to(p.device) for name, p in zip(whole, targets)])
        for name in (name for name in values if name in sharded):
            from torch.distributed.tensor import distribute_tensor  # DTensor: loaded by sharded runs only

            param = params[name]
            mesh, placements = getattr(param, "device_mesh"), getattr(param, "placements")  # noqa: B009  # a DTensor's
            param.copy_(distribute_tensor(values[name].to(param.device), mesh, placements, src_data_rank=None))
