"""Gradient tensors that a one-graph step refills with gradients of its own.

A step that overwrites the gradients (the reset after ``lazy_reset_grad``) and updates the parameters in
the same graph never reads the old gradients. Its graph makes the new ones in buffers of its own, so
holding the old ones across the step would keep a second set of gradients alive at the step's peak.
So the old buffers are released before the step, and its gradients are installed in the same tensor
objects after it (each ``.grad`` and the flat buffer they view keep their identity, as the optimizer
and the compiled steps' argument lists hold them), as torch's ``zero_grad(set_to_none=True)`` frees
gradients between steps. A view of a gradient taken elsewhere keeps the old values alive, unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ort_torch_train.training.flat_params import FlatState


@dataclass(frozen=True)
class GradientTensors:
    """The tensors holding the trainable parameters' gradients: each ``.grad`` (in ``grads``) and,
    with ``flat``, the flat buffer they are views of."""

    grads: Sequence[Tensor]
    flat: FlatState | None

    def release(self) -> None:
        """Free their memory: each becomes an empty tensor until ``install``."""
        with torch.no_grad():
            for tensor in self._tensors():
                tensor.set_(tensor.new_empty(0).untyped_storage(), 0, (0,), (1,))

    def install(self, gradients: Sequence[Tensor]) -> None:
        """Make them hold ``gradients``: one flat tensor with ``flat``, else one tensor per ``.grad``."""
        with torch.no_grad():
            if self.flat is None:
                for grad, new in zip(self.grads, gradients, strict=True):
                    new = new.contiguous()
                    grad.set_(new.untyped_storage(), new.storage_offset(), new.shape, new.stride())
                return
            (new,) = gradients
            new = new.contiguous()
            storage, offset = new.untyped_storage(), new.storage_offset()
            self.flat.grads.set_(storage, offset, new.shape, new.stride())
            for grad, shape, size in zip(self.grads, self.flat.layout.shapes, self.flat.layout.sizes, strict=True):
                grad.set_(storage, offset, shape, _contiguous_strides(shape))
                offset += size
            self.flat.grad_pointers[:] = [grad.data_ptr() for grad in self.grads]

    def install_zeros(self, like: Sequence[Tensor]) -> None:
        """Make them hold zeros shaped as ``like`` (the flat parameters, or each parameter)."""
        self.install([torch.zeros_like(t, memory_format=torch.contiguous_format) for t in like])

    def _tensors(self) -> list[Tensor]:
        return [*self.grads] if self.flat is None else [self.flat.grads, *self.grads]


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))
