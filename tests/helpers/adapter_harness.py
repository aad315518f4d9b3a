"""Shared helpers of the adapter tests: one-node ONNX models, the reference evaluator, conversion.

``check`` converts a one-node model with ``convert_graph`` (constant inputs as initializers, the
others as graph inputs: the static path) and compares with ``onnx.reference``. ``run_dynamic``
converts the node with chosen inputs NOT constant (the run-time fallback), which ``convert_graph``
cannot reach on its own: it would run them on zero example tensors.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import numpy as np
import onnx
import torch
from onnx import helper
from onnx.reference import ReferenceEvaluator

from ort_torch_train.convert.graph import TensorSpec, convert_graph
from ort_torch_train.convert.registry import converter_for
from ort_torch_train.passes.pipeline import fuse_converted

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


def rand(*shape: int, dtype=np.float32, seed: int = 0) -> np.ndarray:
    """Random normal values (floats) or small integers in [-5, 5) (integer dtypes)."""
    generator = np.random.default_rng(seed + sum(shape))
    if np.issubdtype(dtype, np.integer):
        return generator.integers(-5, 5, size=shape).astype(dtype)
    return generator.standard_normal(shape).astype(dtype)


def _elem(array: np.ndarray) -> int:
    return helper.np_dtype_to_tensor_dtype(array.dtype)


def one_node_model(
    op_type: str,
    inputs: Sequence[np.ndarray | None],
    *,
    constant: Sequence[int] = (),
    outputs: int = 1,
    opset: int = 17,
    domain: str = "",
    **attrs,
) -> onnx.ModelProto:
    """A model of one node; inputs at positions in ``constant`` are initializers, None is absent."""
    names = ["" if value is None else f"in{i}" for i, value in enumerate(inputs)]
    node = helper.make_node(op_type, names, [f"out{i}" for i in range(outputs)], domain=domain, **attrs)
    graph_inputs, initializers = [], []
    for i, (name, value) in enumerate(zip(names, inputs)):
        if value is None:
            continue
        if i in constant:
            initializers.append(onnx.numpy_helper.from_array(np.asarray(value), name))
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, _elem(value), list(value.shape)))
    graph_outputs = [helper.make_tensor_value_info(f"out{i}", onnx.TensorProto.UNDEFINED, None) for i in range(outputs)]
    graph = helper.make_graph([node], "one_node", graph_inputs, graph_outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(domain, opset)])


def reference_outputs(
    model: onnx.ModelProto, inputs: Sequence[np.ndarray | None], reference: str = "onnx"
) -> list[np.ndarray]:
    """Outputs of ``onnx.reference`` or, with ``reference="ort"``, of onnxruntime (for what the
    reference evaluator implements differently from the spec, e.g. Softmax before opset 13)."""
    feeds = {vi.name: inputs[int(vi.name[2:])] for vi in model.graph.input}
    if reference == "onnx":
        return [np.asarray(value) for value in ReferenceEvaluator(model).run(None, feeds)]
    import onnxruntime

    for_ort = onnx.ModelProto()
    for_ort.CopyFrom(model)
    for_ort.ir_version = 8
    del for_ort.graph.output[:]
    for_ort.graph.output.extend(helper.make_empty_tensor_value_info(o.name) for o in model.graph.output)
    session = onnxruntime.InferenceSession(for_ort.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def convert_model(model: onnx.ModelProto, inputs: Sequence[np.ndarray | None], training: bool = False):
    """The converted GraphModule and the tensors to call it with (graph inputs in order)."""
    tensors = [torch.from_numpy(np.array(inputs[int(vi.name[2:])])) for vi in model.graph.input]
    specs = [TensorSpec(tuple(t.shape), t.dtype) for t in tensors]
    opsets = {o.domain: o.version for o in model.opset_import}
    module = convert_graph(model.graph, opsets, specs, training=training)
    fuse_converted(module, torch.device("cpu"))
    return module, tensors


def check(
    op_type: str,
    inputs: Sequence[np.ndarray | None],
    *,
    constant: Sequence[int] = (),
    outputs: int = 1,
    opset: int = 17,
    atol: float = 1e-6,
    reference: str = "onnx",
    **attrs,
) -> list[np.ndarray]:
    """Convert (static path), run, compare with the reference evaluator; returns the outputs."""
    model = one_node_model(op_type, inputs, constant=constant, outputs=outputs, opset=opset, **attrs)
    expected = reference_outputs(model, inputs, reference)
    gm, tensors = convert_model(model, inputs)
    got = [t.numpy() for t in gm(*tensors)]
    assert_close(got, expected, atol)
    return got


def assert_close(got: Sequence[np.ndarray], expected: Sequence[np.ndarray], atol: float) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape, (g.shape, e.shape)
        assert g.dtype == e.dtype, (g.dtype, e.dtype)
        if np.issubdtype(e.dtype, np.floating):
            np.testing.assert_allclose(g, e, atol=atol, rtol=atol)
        else:
            np.testing.assert_array_equal(g, e)


def run_dynamic(
    op_type: str,
    inputs: Sequence[np.ndarray | None],
    *,
    constant: Sequence[int] = (),
    outputs: int = 1,
    opset: int = 17,
    **attrs,
) -> list[np.ndarray]:
    """Convert the node with the inputs outside ``constant`` known only at run time, then run it."""
    model = one_node_model(op_type, inputs, constant=constant, outputs=outputs, opset=opset, **attrs)
    context = onnx.GraphProto(name="node")
    context.node.extend(model.graph.node)
    context.initializer.extend(model.graph.initializer)
    context.input.extend(model.graph.input)
    module, mapping = converter_for("", op_type, opset, False)(model.graph.node[0], context)
    values = {f"in{i}": torch.from_numpy(np.array(v)) for i, v in enumerate(inputs) if v is not None}
    args = [values[name] if name else None for name in mapping.inputs]
    positional, keywords = _positional(module, args)
    result = module(*positional, **keywords)
    result = result if isinstance(result, (tuple, list)) else (result,)
    return [t.numpy() for t in result]


def _positional(module, args: list) -> tuple[list, dict]:
    if None not in args:
        return args, {}
    first = args.index(None)
    names = tuple(inspect.signature(module.forward).parameters)[first:]
    return args[:first], {n: a for n, a in zip(names, args[first:]) if a is not None}


def check_dynamic(
    op_type: str,
    inputs,
    *,
    constant=(),
    outputs: int = 1,
    opset: int = 17,
    atol: float = 1e-6,
    reference: str = "onnx",
    **attrs,
):
    """``run_dynamic`` compared with the reference evaluator."""
    model = one_node_model(op_type, inputs, constant=(), outputs=outputs, opset=opset, **attrs)
    expected = reference_outputs(model, inputs, reference)
    got = run_dynamic(op_type, inputs, constant=constant, outputs=outputs, opset=opset, **attrs)
    assert_close(got, expected, atol)


def check_gradients(
    op_type: str,
    inputs: Sequence[np.ndarray | None],
    *,
    constant: Sequence[int] = (),
    opset: int = 17,
    outputs: int = 1,
    **attrs,
) -> None:
    """Finite-difference gradcheck (float64) of the converted node w.r.t. its float non-constant inputs."""
    inputs = [v.astype(np.float64) if v is not None and v.dtype == np.float32 else v for v in inputs]
    model = one_node_model(op_type, inputs, constant=constant, opset=opset, outputs=outputs, **attrs)
    gm, tensors = convert_model(model, inputs, training=True)
    wanted = [t.is_floating_point() for t in tensors]
    leaves = [t.clone().requires_grad_(w) for t, w in zip(tensors, wanted)]

    def function(*diff):
        it = iter(diff)
        args = [next(it) if w else t for t, w in zip(leaves, wanted)]
        return tuple(o for o in gm(*args) if o.is_floating_point())

    assert torch.autograd.gradcheck(function, [t for t, w in zip(leaves, wanted) if w], eps=1e-6, atol=1e-5)
