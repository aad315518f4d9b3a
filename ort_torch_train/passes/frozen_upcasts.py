"""Low-precision frozen parameters upcast inside each op that reads them, never kept upcast across a step.

A parameter held in bfloat16/float16 (LoRA's ``frozen_dtype``) reaches its ops through a Cast to
float32. Converted as it is, the cast runs once at the graph's start and every op that needs the
weight for its backward (a matrix product, for the gradient of its input) keeps the float32 copy
until backward: more memory than the float32 parameter it replaces. ``upcast_where_used`` moves each
such cast into the op that reads it (``UpcastOperands``): the float32 copy is made for that call only,
and what the op saves for backward from it is saved as the low-precision parameter and upcast again
when backward reads it (a saved-tensors hook). The ops compute on the same float32 values in the same
layout, so losses and gradients are bitwise those of the plain graph. A reader that only selects
elements (a Gather, an embedding lookup) selects from the low-precision parameter and upcasts what it
selected: the same values, without upcasting the whole table. Eager graphs only; a cast whose reader
this pass cannot take in (its value nested in a list, a submodule's call) moves next to that reader.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

from ort_torch_train.adapters import indexing
from ort_torch_train.passes.match import args_of, kwargs_of, val
from ort_torch_train.passes.meta_keys import FUSIONS
from ort_torch_train.torch_internals import current_saved_tensors_hooks

LOW_PRECISION = (torch.bfloat16, torch.float16)
WIDER = (torch.float32, torch.float64)
Position = int | str  # a positional argument's index or a keyword argument's name
# functions whose output holds elements of one argument, unchanged: upcasting commutes with them
SELECTIONS: dict[Callable[..., Any], int] = {indexing.gather: 0, torch.index_select: 0, F.embedding: 1}


class UpcastOperands(nn.Module):
    """``function(*args, **kwargs)`` with the arguments at ``upcasts`` cast to their dtype for the call only.

    ``function`` is a callable or a tensor method's name (called on the first argument). Under autograd,
    a frozen (``requires_grad`` False) argument's upcast that the call saves for backward is saved as
    the argument itself and upcast again when backward reads it.
    """

    def __init__(self, function: Callable[..., Any] | str, upcasts: tuple[tuple[Position, torch.dtype], ...]) -> None:
        super().__init__()
        self.function = function
        self.upcasts = upcasts

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        positional = list(args)
        frozen: list[tuple[Tensor, Tensor]] = []  # (upcast, its frozen source)
        for position, dtype in self.upcasts:
            source = positional[position] if isinstance(position, int) else kwargs[position]
            upcast = source.to(dtype)
            if isinstance(position, int):
                positional[position] = upcast
            else:
                kwargs[position] = upcast
            if not source.requires_grad and upcast.numel():
                frozen.append((upcast, source))
        if not frozen or not torch.is_grad_enabled():
            return self._call(positional, kwargs)
        hooks = _FrozenUpcastHooks(frozen, current_saved_tensors_hooks())
        with torch.autograd.graph.saved_tensors_hooks(hooks.pack, _unpack):
            return self._call(positional, kwargs)

    def _call(self, args: list[Any], kwargs: dict[str, Any]) -> Any:
        if isinstance(self.function, str):
            return getattr(args[0], self.function)(*args[1:], **kwargs)
        return self.function(*args, **kwargs)

    def extra_repr(self) -> str:
        name = self.function if isinstance(self.function, str) else getattr(self.function, "__name__", "?")
        return f"{name}, upcasts={self.upcasts}"


@dataclass(frozen=True)
class _Upcast:
    """A saved view of a frozen parameter's upcast, kept as the parameter: ``source.to(dtype)`` viewed so."""

    source: Tensor
    version: int
    dtype: torch.dtype
    size: torch.Size
    stride: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class _Outer:
    """A tensor packed by the saved-tensors hooks that were active outside the op (e.g. checkpoint's)."""

    packed: Any
    unpack: Callable[[Any], Tensor]


class _FrozenUpcastHooks:
    """Packs a saved tensor that aliases a frozen upcast as an ``_Upcast``; any other tensor as the outer
    hooks pack it (kept as it is without them). Autograd keeps the pack hook until backward, so the hooks
    keep each upcast's address only, not the upcast: its storage is alive while the op runs, the only
    time the hook packs."""

    def __init__(self, frozen: list[tuple[Tensor, Tensor]], outer: tuple[Callable, Callable] | None) -> None:
        self.frozen = [
            (upcast.untyped_storage().data_ptr(), upcast.dtype, upcast.device, source) for upcast, source in frozen
        ]
        self.outer = outer

    def pack(self, tensor: Tensor) -> Any:
        address = tensor.untyped_storage().data_ptr()
        for upcast_address, dtype, device, source in self.frozen:
            if address == upcast_address and tensor.dtype == dtype and tensor.device == device:
                return _Upcast(
                    source, source._version, dtype, tensor.size(), tensor.stride(), int(tensor.storage_offset())
                )
        if self.outer is None:
            return tensor
        pack, unpack = self.outer
        return _Outer(pack(tensor), unpack)


def _unpack(packed: Any) -> Tensor:
    if isinstance(packed, _Upcast):
        if packed.source._version != packed.version:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an inplace "
                f"operation: a frozen {packed.source.dtype} parameter of shape {list(packed.source.shape)} "
                "changed between forward and backward"
            )
        return packed.source.to(packed.dtype).as_strided(packed.size, packed.stride, packed.offset)
    if isinstance(packed, _Outer):
        return packed.unpack(packed.packed)
    return packed


def upcast_where_used(module: fx.GraphModule, device: torch.device) -> None:
    """Each cast of a low-precision graph input to a wider float moved into the ops that read it
    (``UpcastOperands``), or next to a reader it cannot move into; counted in ``module``'s ``FUSIONS``."""
    graph = module.graph
    casts = {node: args_of(node) for node in graph.nodes if upcasts_input(node)}
    readers = {reader: None for cast in casts for reader in cast.users}  # each once
    taken = sum(_take_in(module, reader, casts) for reader in list(readers))
    order = {node: index for index, node in enumerate(graph.nodes)}
    for cast in casts:
        if not cast.users:
            graph.erase_node(cast)
            continue
        first = min(cast.users, key=order.__getitem__)
        if first.op != "output":
            first.prepend(cast)
    if taken:
        FUSIONS.setdefault(module, Counter())["frozen upcast in its op"] += taken


def upcasts_input(node: fx.Node) -> bool:
    """Whether ``node`` is ``placeholder.to(dtype)`` from bfloat16/float16 to a wider float."""
    if node.op != "call_method" or node.target != "to" or node.kwargs or len(node.args) != 2:
        return False
    source, dtype = args_of(node)
    meta = val(source)
    return meta is not None and source.op == "placeholder" and meta.dtype in LOW_PRECISION and dtype in WIDER


def _take_in(module: fx.GraphModule, reader: fx.Node, casts: dict[fx.Node, tuple[Any, Any]]) -> bool:
    """``reader`` rewritten to an ``UpcastOperands`` that reads each cast's input where it read the cast
    (directly, not inside a list); False for a reader of another kind. ``casts``: each cast's (input, dtype)."""
    args, kwargs = args_of(reader), kwargs_of(reader)
    upcasts: list[tuple[Position, torch.dtype]] = [
        (index, casts[arg][1]) for index, arg in enumerate(args) if _is_cast(arg, casts)
    ]
    upcasts += [(key, casts[arg][1]) for key, arg in kwargs.items() if _is_cast(arg, casts)]
    if reader.op not in ("call_function", "call_method") or not upcasts:
        return False
    selected = SELECTIONS.get(reader.target) if reader.op == "call_function" else None  # type: ignore[arg-type]
    if selected is not None and [position for position, _ in upcasts] == [selected]:
        _select_then_upcast(module.graph, reader, selected, casts)
        return True
    name = _free_name(module, f"upcast_{reader.name}")
    module.add_submodule(name, UpcastOperands(reader.target, tuple(upcasts)))
    arguments = tuple(casts[arg][0] if _is_cast(arg, casts) else arg for arg in args)
    keywords = {key: casts[arg][0] if _is_cast(arg, casts) else arg for key, arg in kwargs.items()}
    with module.graph.inserting_before(reader):
        replacement = module.graph.call_module(name, arguments, keywords)
    replacement.meta = dict(reader.meta)
    reader.replace_all_uses_with(replacement)
    module.graph.erase_node(reader)
    return True


def _select_then_upcast(graph: fx.Graph, reader: fx.Node, position: int, casts: dict[fx.Node, tuple[Any, Any]]) -> None:
    """``reader`` (a selection) reads the cast's low-precision input; its result is upcast after it."""
    source, dtype = casts[args_of(reader)[position]]
    reader.args = tuple(source if index == position else arg for index, arg in enumerate(reader.args))
    with graph.inserting_after(reader):
        upcast = graph.call_method("to", (reader, dtype))
    reader.replace_all_uses_with(upcast, delete_user_cb=lambda user: user is not upcast)
    upcast.meta = dict(reader.meta)
    selected, low = val(reader), val(source)
    if selected is not None and low is not None:
        reader.meta["val"] = selected.to(low.dtype)


def _is_cast(arg: Any, casts: dict[fx.Node, tuple[Any, Any]]) -> bool:
    return isinstance(arg, fx.Node) and arg in casts


def _free_name(module: fx.GraphModule, name: str) -> str:
    candidate, suffix = name, 1
    while hasattr(module, candidate):
        candidate, suffix = f"{name}_{suffix}", suffix + 1
    return candidate
