"""A converted forward graph through torch.compile, precompiled like the train steps.

The eval graph of ``Module(compile=True)`` compiles on its own. A first call without autograd (no
grad mode, no argument requiring grad: the eval step passes detached parameters) compiles it ahead
(``precompiled.py``: later calls skip Dynamo's frame evaluation) or, with a compile cache (the
engine's), loads the forward a former process saved for this model, signature and autocast setting.
Other calls, and a graph recording CUDA graphs on CUDA, run a plain torch.compile.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import fx

from ort_torch_train.progress import Phase
from ort_torch_train.torch_internals import dynamic_tracing_errors, size_one_kept_dynamic
from ort_torch_train.training.compile import precompiled
from ort_torch_train.training.compile.cache_entries import CompileCache
from ort_torch_train.training.compile.settings import FrozenArguments, records_cuda_graphs
from ort_torch_train.training.compile.step import Compilation, specialisation
from ort_torch_train.training.dynamic_shapes import marked_args
from ort_torch_train.training.meta_keys import DYNAMIC_AXES
from ort_torch_train.training.threads import ThreadPolicy

log = logging.getLogger(__name__)

_AUTOCAST_DEVICES = ("cpu", "cuda")


class CompiledForward:
    """``forward(*inputs, *params)`` of ``module`` compiled with torch.compile's ``arguments``, loaded from
    and saved to the compile ``cache`` (None: compiled in this process only); its CPU runs follow the
    ``threads`` policy."""

    def __init__(
        self,
        module: fx.GraphModule,
        arguments: Mapping[str, Any],
        *,
        cache: CompileCache | None = None,
        threads: ThreadPolicy,
    ) -> None:
        forward = _forward_of(module)
        # the (input position, axis) pairs compiled as dynamic dimensions; () once torch needed them fixed
        self.dynamic_axes: tuple[tuple[int, int], ...] = DYNAMIC_AXES.get(module, ())
        self._arguments = FrozenArguments(arguments)  # named in the precompiled key
        self._compilation = Compilation(forward, module, {"module": module}, dict(arguments), "eval graph", cache)
        compiled, precompile = self._compilation.start(self.dynamic_axes)
        self._compiled, self._precompile = compiled, precompile  # a precompile pending: None once done
        self._called = False
        self._cuda_graphs = records_cuda_graphs(arguments)  # recorded and replayed by torch.compile's call
        self._threads = threads
        self._compiled_at_threads = 0  # torch's thread count at the first call, which compiled the forward

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self._called:
            if args:
                self._threads.hold(self._compiled_at_threads, args[0].device)
            return self._run(args)
        self._called = True
        self._compiled_at_threads = (
            torch.get_num_threads()
        )  # the first call compiles: dynamic axes marked on its arguments
        with Phase(log, "compiling the eval graph", done="compiled the eval graph"):
            try:
                try:
                    with size_one_kept_dynamic(bool(self.dynamic_axes)):  # batch 1 takes the graph of the others
                        return self._run(args, first=True)
                except dynamic_tracing_errors() as error:
                    if not self.dynamic_axes:
                        raise
                    self._compiled, self._precompile = self._compilation.fixed(
                        self.dynamic_axes, (), specialisation(error)
                    )
                    self.dynamic_axes = ()
                    return self._run(args)
            except dynamic_tracing_errors() as error:  # not even for fixed shapes: it runs uncompiled
                self._compiled, self._precompile = self._compilation.eager(args, specialisation(error))
                return self._compiled(*args)
            finally:
                self._threads.restart_load_window()

    def _run(self, args: tuple[torch.Tensor, ...], first: bool = False) -> tuple[torch.Tensor, ...]:
        """The compiled forward on ``args``; ``first``: the call that compiles it (with its dynamic axes)."""
        precompile = self._precompile
        if precompile is not None and not torch.is_grad_enabled() and not any(a.requires_grad for a in args):
            if self._cuda_graphs and any(a.is_cuda for a in args):
                self._precompile = None
            else:
                self._load_or_precompile(precompile, args)
        if first and not isinstance(self._compiled, precompiled.GuardedStep):
            return self._compiled(*marked_args(args, self.dynamic_axes))
        return self._compiled(*args)

    def _load_or_precompile(self, precompile: precompiled.Precompile, args: tuple) -> None:
        self._precompile = None
        autocast = [
            (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
            for device in _AUTOCAST_DEVICES
        ]
        parts = ("forward", self._arguments, autocast)
        self._compiled = precompile.replacing(self._compiled, parts, args)


def _forward_of(module: torch.nn.Module) -> Callable:
    """``module``'s call as a function of its own (a precompiled function is a function, not a module)."""

    def forward(*args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return module(*args)

    return precompiled.with_own_code(forward)
