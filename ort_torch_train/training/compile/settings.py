"""torch.compile settings: the ``compile`` argument parsed once, frozen for step keys, and this project's
CPU inductor defaults."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import fx

from ort_torch_train.passes.onednn_linear import cpu_matmuls
from ort_torch_train.passes.small_products import small_products_pass
from ort_torch_train.torch_internals import GraphPass, allow_written_whole, custom_graph_pass

CompileSetting = bool | str | Mapping[str, Any]
Compiler = Callable[[fx.GraphModule, Mapping[str, Any]], Callable]
_COMPILE_KEYS = ("mode", "options", "backend")
MIN_CHUNK_SIZE = 16384  # elements per thread from which inductor's CPU loops run in parallel


def compile_arguments(compile: CompileSetting) -> dict[str, Any] | None:
    """torch.compile's keyword arguments for a ``compile`` setting, or None for False.

    True: torch.compile's defaults; a string: that mode ("max-autotune", "reduce-overhead", ...); a
    dict: any of ``mode``, ``options`` (inductor settings, e.g. ``{"cpp_wrapper": True}``), ``backend``.
    Graphs are always compiled whole (``fullgraph=True``), for fixed shapes but the input axes marked
    dynamic (``training/dynamic_shapes.py``).
    """
    if compile is False or compile is None:
        return None
    if compile is True:
        return {}
    if isinstance(compile, str) and compile:
        return {"mode": compile}
    if isinstance(compile, Mapping) and set(compile) <= set(_COMPILE_KEYS):
        return dict(compile)
    raise ValueError(
        f"compile: expected a bool, a torch.compile mode name or a dict with keys from {_COMPILE_KEYS}; got {compile!r}"
    )


def for_device(arguments: Mapping[str, Any], device: torch.device, *, cpp_wrapper: bool = True) -> dict[str, Any]:
    """``arguments`` with this project's inductor defaults for CPU graphs, unless a mode or another
    backend is asked for, or the option is set: the C++ wrapper (it calls the kernels without per-call
    Python; ``cpp_wrapper=False`` for graphs it cannot generate: collectives, checkpointed random ops),
    loops parallelised only from ``MIN_CHUNK_SIZE`` elements a thread (inductor's default, 512, spends
    more on OpenMP's fork and join than it saves on small models), and ``cpu_post_grad_passes()``."""
    if device.type != "cpu" or "mode" in arguments or arguments.get("backend", "inductor") != "inductor":
        return dict(arguments)
    defaults = {
        "cpp_wrapper": cpp_wrapper,
        "cpp.min_chunk_size": MIN_CHUNK_SIZE,
        "post_grad_custom_post_pass": cpu_post_grad_passes(),
    }
    return {**arguments, "options": {**defaults, **(arguments.get("options") or {})}}


@functools.cache  # one instance: compiled steps' keys and inductor's caches compare it
def cpu_post_grad_passes() -> GraphPass:
    """The inductor post-grad passes of this project's CPU graphs, in order: small matrix products as loops of
    inductor's own (``small_products.py``; not those summing over the batch, which would compile a second graph
    for a batch of 1); small attention calls as products and sums that inductor fuses (``attention_loops.py``);
    attention heads' reshape chains rewritten so that no axis mixes the dynamic batch with the heads
    (``refined_reshapes.py``); large float32 GEMMs sent to oneDNN and small ones' bias adds fused
    (``onednn_linear.py``). Keyed in inductor's caches by the passes' files and settings."""
    from ort_torch_train.passes.attention_loops import attention_loops_pass  # sympy: loaded when a step compiles
    from ort_torch_train.passes.refined_reshapes import refined_reshapes_pass

    reshapes, matmuls = refined_reshapes_pass(), cpu_matmuls()

    def reshapes_then_matmuls(graph: fx.Graph) -> None:
        reshapes(graph)
        matmuls(graph)

    tail = custom_graph_pass(
        "RefinedReshapesThenMatmuls", reshapes_then_matmuls, lambda: reshapes.uuid() + b":" + matmuls.uuid()
    )
    return small_products_pass(then=attention_loops_pass(then=tail), symbolic_contraction=False)


def records_cuda_graphs(arguments: Mapping[str, Any]) -> bool:
    """Whether torch.compile with these arguments records CUDA graphs (on a CUDA device)."""
    options = arguments.get("options") or {}
    return arguments.get("mode") in ("reduce-overhead", "max-autotune") or bool(options.get("triton.cudagraphs"))


def torch_compile(module: Callable, arguments: Mapping[str, Any]) -> Callable:
    """``module`` through torch.compile with ``arguments``, whole (``fullgraph``); shapes fixed but the
    axes its first call's inputs mark dynamic (no automatic dynamic shapes: no second compilation)."""
    allow_written_whole()
    return torch.compile(module, fullgraph=True, dynamic=False, **arguments)


class FrozenArguments(Mapping[str, Any]):
    """torch.compile's keyword arguments, immutable and hashable (a compiled step's key holds them): the
    dicts inside (``options``) frozen too, names sorted, so that equal arguments give equal reprs."""

    __slots__ = ("_items", "_hash")

    def __init__(self, arguments: Mapping[str, Any] | None = None) -> None:
        self._items = {
            name: FrozenArguments(value) if isinstance(value, Mapping) else value
            for name, value in sorted((arguments or {}).items())
        }
        self._hash = hash(tuple((name, _hashable(value)) for name, value in self._items.items()))

    def __getitem__(self, name: str) -> Any:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return repr(self._items)

    def thawed(self) -> dict[str, Any]:
        """The arguments as plain dicts, as torch.compile takes them."""
        return {name: value.thawed() if isinstance(value, FrozenArguments) else value for name, value in self.items()}


def _hashable(value: object) -> object:
    """``value``, its lists and sets as tuples and frozensets (torch.compile's options may hold them)."""
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(item) for item in value)
    if isinstance(value, set):
        return frozenset(_hashable(item) for item in value)
    return value
