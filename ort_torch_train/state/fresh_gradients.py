"""A flat gradient buffer that a one-graph step refills with gradients of its own.

A step that overwrites the gradients (the reset after ``lazy_reset_grad``) and updates the parameters in
the same graph never reads the old gradients. Its graph makes the new ones in a buffer of its own, so
holding the old ones across the step would keep a second set of gradients alive at the step's peak.
So the memory behind the flat gradient buffer (``flat.py``) is freed before the step, as torch's
``zero_grad(set_to_none=True)`` frees gradients, and takes over the step's buffer after it: the flat
buffer and each ``.grad`` keep their identity and show the new gradients, as when steps wrote into them.
While anything else views the buffer (a numpy array from ``Parameter.grad``, a tensor view of a
gradient), it is kept and the step's gradients are copied into it, so no view reads freed memory.
Buffers under ``MIN_BYTES`` stay in place: a second set of such gradients costs less than the
bookkeeping does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ort_torch_train.state.flat import FlatState
from ort_torch_train.torch_internals import storage_use_count, swap_storage_memory

MIN_BYTES = 1 << 20


def pays_off(flat: FlatState) -> bool:
    """Whether ``flat``'s gradient buffer is large enough (``MIN_BYTES``) to be refilled afresh."""
    return flat.grads.numel() * flat.grads.element_size() >= MIN_BYTES


@dataclass
class FreshGradients:
    """The flat gradient buffer of ``flat`` and the parameters' ``.grad`` tensors (``grads``) viewing it."""

    flat: FlatState
    grads: Sequence[Tensor]
    released: bool = False

    def release(self) -> None:
        """Free the buffer's memory (``released``) unless something besides the state views it."""
        storage = self.flat.grads.untyped_storage()
        # the holders: the flat buffer, each .grad and ``storage`` here; numpy arrays pin a storage's size
        self.released = storage.resizable() and storage_use_count(storage) <= len(self.grads) + 2
        if self.released:
            storage.resize_(0)

    def install(self, gradient: Tensor) -> None:
        """Make the buffer hold ``gradient`` (flat, as long as the buffer)."""
        buffer = self.flat.grads
        storage = buffer.untyped_storage()
        nbytes = buffer.numel() * buffer.element_size()
        whole = gradient.is_contiguous() and gradient.storage_offset() == 0
        if self.released and whole and gradient.untyped_storage().nbytes() == nbytes:
            swap_storage_memory(storage, gradient.untyped_storage())  # the step's buffer itself: no copy
        else:
            if self.released:
                storage.resize_(nbytes)
            with torch.no_grad():
                buffer.copy_(gradient)
        self.released = False
        self.flat.note_gradient_storage(self.grads)

    def install_zeros(self) -> None:
        """Make the buffer hold zeros."""
        self.install(torch.zeros_like(self.flat.grads))
