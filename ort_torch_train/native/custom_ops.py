"""Custom-op libraries registered through the C API (``RegisterCustomOpsLibrary``), as a session's own
operators (``adapters.OpLibrary``).

libort_torch_train hands over each ``OrtCustomOp`` registered on the session options (domain, name, its
address, its input and output element types) and two functions of its own that run one: ``create_kernel``
(once per node, with the node's attributes) and ``compute``. A node of such an op becomes a call of the
torch op ``ort_torch_train::ort_custom_op`` (CPU), which gives the kernel its inputs as OrtValues over the
tensors' memory and returns the torch tensors the kernel asked for as outputs. No gradient flows through
it: a trainable parameter upstream of one is refused when the session is created.
"""

from __future__ import annotations

import functools
import itertools
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ort_torch_train.adapters import ConversionContext
from ort_torch_train.adapters.common import OperationConverterResult, result
from ort_torch_train.dtypes import ONNX_TO_TORCH, TORCH_TO_ONNX
from ort_torch_train.errors import InputTypeError

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode

Attribute = float | int | str | list[float] | list[int]
InputSpec = tuple[int, int, int, tuple[int, ...]]
"""(address, bytes, ONNX element type, shape) of a contiguous CPU tensor."""
Allocate = Callable[[int, tuple[int, ...]], tuple[int, int, int]]
"""(output index, shape) -> (address, bytes, ONNX element type) of a new tensor the kernel writes."""
CreateKernel = Callable[[int, dict[str, Attribute], int, int], object]
"""(OrtCustomOp address, attributes, input count, output count) -> the kernel."""
Compute = Callable[[object, tuple[InputSpec, ...], int, Allocate], None]
"""(kernel, inputs, output count, allocate): runs the kernel."""
RegisteredOp = tuple[str, str, int, Sequence[int], Sequence[int]]
"""(domain, op name, OrtCustomOp address, input element types, output element types), as the C side gives."""

_UNDEFINED = 0  # ONNX element type: the kernel decides (an output then takes its first input's type)
_KERNELS: weakref.WeakValueDictionary[int, _Kernel] = weakref.WeakValueDictionary()  # by key, for the torch op
_KEYS = itertools.count(1)


@dataclass(frozen=True)
class CustomOp:
    """One registered OrtCustomOp."""

    domain: str
    name: str
    address: int
    input_types: tuple[int, ...]
    output_types: tuple[int, ...]


class _Kernel:
    """A kernel of one node, created by the library's CreateKernel and destroyed with this object."""

    def __init__(self, op: CustomOp, node_name: str, handle: object, compute: Compute) -> None:
        self.op, self.node_name, self.handle, self._compute = op, node_name, handle, compute
        self.key = next(_KEYS)
        _KERNELS[self.key] = self

    def __deepcopy__(self, memo: dict) -> _Kernel:
        return self  # one kernel per node: a copied module runs the same one

    def compute(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        where = f"custom op {self.op.domain}::{self.op.name} (node {self.node_name!r})"
        held = [tensor.contiguous() for tensor in inputs]
        for position, tensor in enumerate(held):
            if tensor.device.type != "cpu" or tensor.dtype not in TORCH_TO_ONNX:
                raise InputTypeError(
                    f"{where}: input {position}: expected a CPU tensor of an ONNX element type, got "
                    f"{tensor.dtype} on {tensor.device}"
                )
        specs = tuple((t.data_ptr(), t.nbytes, TORCH_TO_ONNX[t.dtype], tuple(t.shape)) for t in held)
        outputs: dict[int, torch.Tensor] = {}

        def allocate(index: int, shape: tuple[int, ...]) -> tuple[int, int, int]:
            elem_type = self.op.output_types[index] if index < len(self.op.output_types) else _UNDEFINED
            if elem_type == _UNDEFINED and specs:
                elem_type = specs[0][2]
            dtype = ONNX_TO_TORCH.get(elem_type)
            if dtype is None or any(size < 0 for size in shape):
                raise InputTypeError(f"{where}: output {index}: cannot allocate element type {elem_type} of {shape}")
            outputs[index] = tensor = torch.empty(shape, dtype=dtype)
            return tensor.data_ptr(), tensor.nbytes, elem_type

        count = len(self.op.output_types)
        self._compute(self.handle, specs, count, allocate)
        missing = [index for index in range(count) if index not in outputs]
        if missing:
            raise RuntimeError(f"{where}: the kernel did not produce output {missing[0]} (KernelContext_GetOutput)")
        return [outputs[index] for index in range(count)]


@functools.cache
def _torch_op() -> Callable[[int, list[torch.Tensor]], list[torch.Tensor]]:
    """The torch op that runs a kernel by its key (registered on first use)."""

    @torch.library.custom_op("ort_torch_train::ort_custom_op", mutates_args=(), device_types="cpu")
    def ort_custom_op(kernel: int, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return _KERNELS[kernel].compute(inputs)

    return ort_custom_op


class CustomOpModule(torch.nn.Module):
    """One node of a custom op: ``ort_torch_train::ort_custom_op`` on its kernel."""

    def __init__(self, kernel: _Kernel) -> None:
        super().__init__()
        self.kernel = kernel  # held here: the torch op finds it by key while this module lives

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        outputs = _torch_op()(self.kernel.key, list(inputs))
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


class CustomOpLibrary:
    """The OrtCustomOps registered on one session options, as an ``adapters.OpLibrary``."""

    def __init__(self, ops: Sequence[RegisteredOp], create_kernel: CreateKernel, compute: Compute) -> None:
        self.ops = {
            (domain, name): CustomOp(domain, name, int(address), tuple(inputs), tuple(outputs))
            for domain, name, address, inputs, outputs in ops
        }
        self._create_kernel, self._compute = create_kernel, compute

    def converter(self, domain: str, op_type: str) -> Callable[..., Any] | None:
        op = self.ops.get((domain, op_type))
        return None if op is None else functools.partial(self._convert, op)

    def differentiable(self, domain: str, op_type: str) -> bool:
        return False

    def _convert(
        self, op: CustomOp, node: OnnxNode, graph: OnnxGraph, context: ConversionContext
    ) -> OperationConverterResult:
        attributes = {
            name: list(value) if isinstance(value, tuple) else value
            for name, value in node.attributes.items()
            if _attribute(value)
        }
        handle = self._create_kernel(op.address, attributes, len(node.input_values), len(node.output_values))
        return result(CustomOpModule(_Kernel(op, node.name, handle, self._compute)), node)


def _attribute(value: object) -> bool:
    """Whether a parsed ONNX attribute is one the kernel info gives (float, int, string, lists of those numbers)."""
    if isinstance(value, list | tuple):
        return all(isinstance(item, float) for item in value) or all(type(item) is int for item in value)
    return isinstance(value, float | str) or type(value) is int
