"""The trainable parameters, their gradients and each optimizer moment as one flat buffer apiece.

A compiled step pays per tensor it takes (Dynamo's guards, AOTAutograd's and the C++ wrapper's work on
each argument), and a one-graph step takes every parameter, its gradient and its moments; an eager
optimizer step pays per tensor too. So when the optimizer first readies its tensors, the state's trainable parameters, gradients and
moments are copied into one buffer each and the state's tensors pointed at views of them: the
Parameter objects, their ``.grad`` and the moment dict stay what they were, only their storage moves
(once). Optimizer steps and one-graph steps then run on four tensors, the update as one loop (AdamW
and SGD are elementwise). ``TrainingState.flat_view`` keeps the buffers: a state whose tensors are
replaced later (a device move, ``complete_nominal``) starts a new generation, and the next step moves
them into new buffers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class FlatLayout:
    """The shapes of the tensors laid end to end in a flat buffer."""

    shapes: tuple[tuple[int, ...], ...]

    @property
    def sizes(self) -> list[int]:
        """Element counts, in order."""
        return [torch.Size(shape).numel() for shape in self.shapes]

    def views(self, flat: Tensor) -> list[Tensor]:
        """The tensors as views of ``flat``."""
        return [piece.view(shape) for piece, shape in zip(flat.split(self.sizes), self.shapes)]


@dataclass(frozen=True)
class FlatState:
    """Flat buffers behind a state's trainable parameters, gradients and moments (one per moment name),
    made at the state's ``generation``."""

    generation: int
    names: tuple[str, ...]
    moment_names: tuple[str, ...]
    layout: FlatLayout
    params: Tensor
    grads: Tensor
    moments: tuple[Tensor, ...]
    parameters: tuple[torch.nn.Parameter, ...]  # the state's, whose data and .grad are views of the buffers
    data_pointers: list[int]  # where the parameters' views start
    grad_pointers: list[int | None]  # where their gradients' views start

    def still_behind(self, gradients: bool) -> bool:
        """Whether the parameters' data (and ``gradients``: their gradients) are still the views."""
        if [p.data_ptr() for p in self.parameters] != self.data_pointers:
            return False
        if not gradients:
            return True
        # a gradient set to None counts as moved
        return [None if p.grad is None else p.grad.data_ptr() for p in self.parameters] == self.grad_pointers

    def note_gradient_storage(self, grads: Sequence[Tensor]) -> None:
        """Remember where the parameters' gradients (``grads``, the views of the gradient buffer) start now
        that the buffer's memory was exchanged."""
        self.grad_pointers[:] = [grad.data_ptr() for grad in grads]


def flatten(
    params: Sequence[torch.nn.Parameter],
    names: Sequence[str],
    momentums: dict[str, dict[str, Tensor]],
    moment_names: Sequence[str],
    generation: int,
) -> FlatState | None:
    """Move ``params`` (named ``names``), their gradients and their ``moment_names`` moments (from
    ``momentums``) into flat buffers made at ``generation``, the tensors becoming views of them; None, with
    nothing moved, unless all share one dtype and device. One kind of tensor moves at a time, so the old copies held nowhere
    else are freed as it goes."""
    params = list(params)
    grads = [param.grad for param in params]
    kinds = {
        (t.dtype, t.device) if t is not None else None
        for t in [*params, *grads, *(momentums[name][key] for key in moment_names for name in names)]
    }
    if not params or len(kinds) != 1 or None in kinds:
        return None
    grads_present = [grad for grad in grads if grad is not None]  # all of them: a None is a kind of its own
    del grads  # only the lists moved from may hold the old tensors
    layout = FlatLayout(tuple(tuple(param.shape) for param in params))
    with torch.no_grad():
        flat_params = _move_into_flat(
            layout, [param.detach() for param in params], lambda i, view: _set_data(params[i], view)
        )
        flat_grads = _move_into_flat(layout, grads_present, lambda i, view: _set_grad(params[i], view))
        grad_views = layout.views(flat_grads)
        flat_moments = []
        for key in moment_names:
            moments = [momentums[name][key] for name in names]
            flat_moments.append(_move_into_flat(layout, moments, _moment_setter(momentums, names, key)))
    grad_pointers: list[int | None] = [view.data_ptr() for view in grad_views]
    return FlatState(
        generation,
        tuple(names),
        tuple(moment_names),
        layout,
        flat_params,
        flat_grads,
        tuple(flat_moments),
        tuple(params),
        [p.data_ptr() for p in params],
        grad_pointers,
    )


def _move_into_flat(layout: FlatLayout, tensors: list[Tensor], rebind: Callable[[int, Tensor], None]) -> Tensor:
    """A new flat buffer holding ``tensors``, each copied in and at once replaced by its view (``rebind``),
    so that a tensor held nowhere else is freed before the next is copied: the buffer's pages fill as the
    old tensors' go, and moving a kind of tensor never needs twice its memory."""
    flat = _flat_base(layout, tensors)
    if flat is not None:  # already laid out end to end in one buffer (e.g. made by zeros_in_one_buffer)
        return flat
    flat = torch.empty(sum(layout.sizes), dtype=tensors[0].dtype, device=tensors[0].device)
    for index, view in enumerate(layout.views(flat)):
        view.copy_(tensors[index].reshape(view.shape))
        tensors[index] = view  # the list's reference to the old tensor goes too
        rebind(index, view)
    return flat


def _set_data(param: torch.nn.Parameter, view: Tensor) -> None:
    param.data = view


def _set_grad(param: torch.nn.Parameter, view: Tensor) -> None:
    param.grad = view


def _moment_setter(
    momentums: dict[str, dict[str, Tensor]], names: Sequence[str], key: str
) -> Callable[[int, Tensor], None]:
    def set_moment(index: int, view: Tensor) -> None:
        momentums[names[index]][key] = view

    return set_moment


def _flat_base(layout: FlatLayout, tensors: Sequence[Tensor]) -> Tensor | None:
    """The one buffer that ``tensors`` are consecutive contiguous views of, covering all of it; else None."""
    storage = tensors[0].untyped_storage()
    itemsize = tensors[0].element_size()
    total = sum(layout.sizes)
    if storage.nbytes() != total * itemsize or tensors[0].storage_offset() != 0:
        return None
    offset = 0
    for tensor, size in zip(tensors, layout.sizes):
        if tensor.untyped_storage().data_ptr() != storage.data_ptr() or tensor.storage_offset() != offset:
            return None
        if not tensor.is_contiguous() or tensor.dtype != tensors[0].dtype:
            return None
        offset += size
    return tensors[0].new_empty(0).set_(storage, 0, (total,), (1,))


def zeros_in_one_buffer(like: Sequence[Tensor]) -> list[Tensor]:
    """Zero tensors shaped like ``like``, as views of one buffer when all share a dtype and device (so that
    flattening them later costs no copy), else one tensor each."""
    if len({(t.dtype, t.device) for t in like}) != 1:
        return [torch.zeros_like(t, memory_format=torch.contiguous_format) for t in like]
    layout = FlatLayout(tuple(tuple(t.shape) for t in like))
    return layout.views(torch.zeros(sum(layout.sizes), dtype=like[0].dtype, device=like[0].device))
