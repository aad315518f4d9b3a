"""A forward graph run as torch code: converted once per input signature and cached."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import onnx
import torch
from torch import fx, nn

from ort_torch_train.convert.graph import TensorSpec, convert_graph
from ort_torch_train.convert.registry import check_supported
from ort_torch_train.convert.string_inputs import numeric_inputs
from ort_torch_train.dtypes import dtype_name, onnx_elem_type, ort_tensor_type, torch_dtype
from ort_torch_train.errors import InputError, InputTypeError
from ort_torch_train.graph.layout import GraphLayout, declared_shape
from ort_torch_train.passes.pipeline import Restructure, run_compiled, run_eager
from ort_torch_train.training.compile.settings import (
    Compiler,
    CompileSetting,
    compile_arguments,
    for_device,
    torch_compile,
)

Signature = tuple[tuple[torch.Size, torch.dtype], ...]


@dataclass(frozen=True)
class InputDeclaration:
    """What the ONNX graph declares for one user input."""

    name: str
    elem_type: int
    dims: tuple[int | str | None, ...] | None

    @property
    def dtype(self) -> torch.dtype:
        return torch_dtype(self.elem_type)


log = logging.getLogger(__name__)


class ForwardGraph:
    """``graph(user_inputs, params) -> outputs`` with ONNX semantics, specialised per input signature."""

    def __init__(
        self,
        graph: onnx.GraphProto,
        opsets: dict[str, int],
        layout: GraphLayout,
        *,
        training: bool,
        compile: CompileSetting = False,
        compiler: Compiler = torch_compile,
        module_transform: Restructure | None = None,
        cache_size: int = 16,
    ) -> None:
        check_supported(graph, opsets)
        graph, self.string_casts = numeric_inputs(graph)  # string inputs parsed on the host (string_inputs.py)
        self.graph = graph
        self.opsets = opsets
        self.layout = layout
        self.training = training
        self.compile_arguments = compile_arguments(compile)
        self.compiler = compiler  # (converted module, torch.compile's arguments) -> the compiled callable
        self.cache_size = cache_size
        by_name = {value.name: value for value in graph.input}
        self.declarations = tuple(
            InputDeclaration(name, by_name[name].type.tensor_type.elem_type, declared_shape(by_name[name]))
            for name in layout.user_inputs
        )
        self._cache: OrderedDict[Hashable, Callable] = OrderedDict()
        self.module_transform = module_transform  # recompute's segments, between the graph rewrites

    def __call__(self, inputs: Sequence[torch.Tensor], params: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return self.module_for(inputs, params)(*inputs, *params)

    def module_for(self, inputs: Sequence[torch.Tensor], params: Sequence[torch.Tensor]) -> Callable:
        """The converted module for these inputs' shapes and dtypes (built on first use, then cached)."""
        return self.specialised(inputs, params, "module", self._compiled_if_asked)

    def specialised(
        self,
        inputs: Sequence[torch.Tensor],
        params: Sequence[torch.Tensor],
        variant: Hashable,
        build: Callable[[fx.GraphModule, torch.device], Callable],
    ) -> Callable:
        """``build(converted module, its device)`` for these inputs' shapes and dtypes, cached under ``variant``
        (``build`` prepares the module with ``eager_module`` or ``compiled_module``)."""
        key: Hashable
        try:
            key = (variant, tuple((t.shape, t.dtype) for t in inputs))
        except AttributeError:
            key = None
        built = self._cache.get(key)
        if built is not None:
            return built
        self.validate(inputs)
        specs = [TensorSpec(tuple(t.shape), t.dtype) for t in (*inputs, *params)]
        log.info(
            "specialising the %s graph (%s) for inputs %s",
            "training" if self.training else "eval",
            variant,
            [(tuple(t.shape), str(t.dtype)) for t in inputs],
        )
        module = convert_graph(self.graph, self.opsets, specs, training=self.training, examples=(*inputs, *params))
        device = params[0].device if params else inputs[0].device
        built = build(module, device)
        self._cache[key] = built
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return built

    def eager_module(self, module: fx.GraphModule, device: torch.device) -> nn.Module:
        """A converted ``module`` ready for eager runs on ``device``: the eager graph rewrites, this graph's
        ``module_transform`` among them, and moved to ``device``."""
        return run_eager(module, device, self.module_transform).to(device)

    def compiled_module(self, module: fx.GraphModule, device: torch.device) -> nn.Module:
        """A converted ``module`` ready for torch.compile on ``device``: the compiled graph rewrites, this
        graph's ``module_transform`` among them, and moved to ``device``."""
        return run_compiled(module, device, self.module_transform).to(device)

    def _compiled_if_asked(self, module: fx.GraphModule, device: torch.device) -> Callable:
        if self.compile_arguments is None:
            return self.eager_module(module, device)
        return self.compiler(self.compiled_module(module, device), for_device(self.compile_arguments, device))

    def clear(self) -> None:
        """Forget every specialisation (after a device move)."""
        self._cache.clear()

    def validate(self, inputs: Sequence[object]) -> None:
        """Raise a clear error unless ``inputs`` match the declared user inputs."""
        expected = len(self.declarations)
        if len(inputs) != expected:
            names = ", ".join(repr(d.name) for d in self.declarations)
            raise InputError(f"expected {expected} user inputs ({names}) in this order, got {len(inputs)}")
        for position, (declaration, value) in enumerate(zip(self.declarations, inputs)):
            _check_input(declaration, position, value)


def _check_input(declaration: InputDeclaration, position: int, value: object) -> None:
    name = declaration.name
    if not isinstance(value, torch.Tensor):
        raise InputTypeError(
            f"input {name!r} (position {position}): expected a tensor of {ort_tensor_type(declaration.elem_type)}, "
            f"got {type(value).__name__}"
        )
    if value.dtype != declaration.dtype:
        raise InputTypeError(
            f"Unexpected input data type for input {name!r} (position {position}). "
            f"Actual: ({_type_text(value.dtype)}), expected: ({ort_tensor_type(declaration.elem_type)})"
        )
    dims = declaration.dims
    if dims is None:
        return
    if value.dim() != len(dims):
        raise InputError(f"Invalid rank for input: {name} Got: {value.dim()} Expected: {len(dims)}")
    for index, (actual, wanted) in enumerate(zip(value.shape, dims)):
        if isinstance(wanted, int) and actual != wanted:
            raise InputError(
                f"Got invalid dimensions for input: {name} for the following indices index: {index} "
                f"Got: {actual} Expected: {wanted} (the model fixes this dimension: to feed other sizes, "
                f"export it as dynamic, e.g. generate_artifacts(..., dynamic_axes={{{name!r}: {{{index}: 'dim{index}'}}}}) "
                "or dynamic_shapes=)"
            )


def _type_text(dtype: torch.dtype) -> str:
    try:
        return ort_tensor_type(onnx_elem_type(dtype))
    except TypeError:
        return dtype_name(dtype)
