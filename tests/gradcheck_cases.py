"""float64 gradchecks of converted ops, one small ONNX backend node case per operator.

Each operator's smallest node case with floating inputs and outputs (not a known conformance
failure, not an ``_expanded`` function body) is re-typed to float64: float inputs become DOUBLE graph
inputs filled with random values shaped like the case's (integer inputs keep the case's values),
then ``torch.autograd.gradcheck`` runs w.r.t. those float inputs on the floating outputs.

Run directly for a report: ``python tests/gradcheck_cases.py [op ...]``.
"""

from __future__ import annotations

import re
import sys
import warnings
from dataclasses import dataclass

import numpy as np
import onnx
import torch
from onnx import TensorProto

from conformance import _array, _op_of, _skip_reason, known_failures, node_cases
from ort_torch_train.errors import UnsupportedOperatorError
from ort_torch_train.graph.convert import TensorSpec, convert_graph

FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16)
MAX_FULL = 120  # float input elements up to which gradcheck runs in full mode (fast mode above)
MAX_ELEMENTS = 3000  # cases with more float input elements are not candidates


@dataclass(frozen=True)
class Candidate:
    """A node case re-typed to float64, with the values to gradcheck it at."""

    case: str
    op: str
    model: onnx.ModelProto
    inputs: list[np.ndarray]

    @property
    def float_elements(self) -> int:
        return sum(v.size for v in self.inputs if v.dtype == np.float64)


def _elem_type(value_info: onnx.ValueInfoProto) -> int:
    return value_info.type.tensor_type.elem_type


def _as_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its float graph inputs, outputs and initializers typed DOUBLE."""
    double = onnx.ModelProto()
    double.CopyFrom(model)
    for value_info in (*double.graph.input, *double.graph.output):
        if _elem_type(value_info) in FLOAT_TYPES:
            value_info.type.tensor_type.elem_type = TensorProto.DOUBLE
    for index, initializer in enumerate(double.graph.initializer):
        if initializer.data_type in FLOAT_TYPES:
            array = onnx.numpy_helper.to_array(initializer).astype(np.float64)
            double.graph.initializer[index].CopyFrom(onnx.numpy_helper.from_array(array, initializer.name))
    return double


def candidates(ops: set[str] | None = None) -> dict[str, list[Candidate]]:
    """Per operator, its usable node cases re-typed to float64, smallest first."""
    known = known_failures()
    found: dict[str, list[Candidate]] = {}
    for case in node_cases(ops):
        model = case.model
        if "_expanded" in case.name or case.name in known or len(model.graph.node) != 1:
            continue
        inputs, outputs = case.data_sets[0]
        inputs = [_array(v) for v in inputs]
        if _skip_reason(model, [(inputs, [_array(v) for v in outputs])]):
            continue
        graph = model.graph
        float_in = [_elem_type(vi) in FLOAT_TYPES for vi in graph.input]
        if not any(float_in) or not any(_elem_type(vi) in FLOAT_TYPES for vi in graph.output):
            continue
        generator = np.random.default_rng(len(found))
        values = [generator.uniform(-1.0, 1.0, v.shape) if is_float else np.array(v)
                  for v, is_float in zip(inputs, float_in)]
        candidate = Candidate(case.name, _op_of(model, case.name), _as_float64(model), values)
        if candidate.float_elements <= MAX_ELEMENTS:
            found.setdefault(candidate.op, []).append(candidate)
    for cases in found.values():
        cases.sort(key=lambda c: (c.float_elements, c.case))
    return found


def module_of(candidate: Candidate) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    """The converted float64 node (training mode) and the tensors to call it with."""
    tensors = [torch.from_numpy(v) for v in candidate.inputs]
    specs = [TensorSpec(tuple(t.shape), t.dtype) for t in tensors]
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in candidate.model.opset_import}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = convert_graph(candidate.model.graph, opsets, specs, training=True, examples=tensors)
    return module, tensors


def gradcheck(candidate: Candidate, prepare=None) -> None:
    """Raise unless the converted node's float64 gradients match finite differences."""
    if prepare:
        candidate = Candidate(candidate.case, candidate.op, candidate.model, prepare(candidate.inputs))
    module, tensors = module_of(candidate)
    wanted = [t.dtype == torch.float64 for t in tensors]

    def function(*diff):
        it = iter(diff)
        args = [next(it) if w else t for t, w in zip(tensors, wanted)]
        return tuple(o for o in module(*args) if o.is_floating_point())

    leaves = [t.clone().requires_grad_() for t, w in zip(tensors, wanted) if w]
    torch.autograd.gradcheck(function, leaves, eps=1e-6, atol=1e-5, rtol=1e-4,
                             fast_mode=candidate.float_elements > MAX_FULL)


def main(argv: list[str]) -> None:
    found = candidates(set(argv) or None)
    for op, cases in sorted(found.items()):
        try:
            gradcheck(cases[0])
            print(f"ok    {op:24} {cases[0].case}")
        except UnsupportedOperatorError:
            print(f"unsup {op:24} {cases[0].case}")
        except Exception as exc:  # noqa: BLE001  (a report)
            detail = re.sub(r"\s+", " ", str(exc))[:160]
            print(f"FAIL  {op:24} {cases[0].case}: {type(exc).__name__}: {detail}")


if __name__ == "__main__":
    main(sys.argv[1:])
