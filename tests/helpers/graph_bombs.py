"""Models that are tiny on disk but unbounded when converted naively: a long Scan, nested Loops, an
Expand/Tile/ConstantOfShape/Range to an impossible size. ``python -m tests.helpers.graph_bombs NAME...``
converts and runs each named one under a memory cap and prints what happened as JSON (the tests run it in a
subprocess with a timeout, so a regression fails instead of taking the machine down)."""

from __future__ import annotations

import json
import resource
import sys
import time

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from ort_torch_train.convert.graph import TensorSpec, convert_graph
from ort_torch_train.convert.run_time_loops import RunTimeLoop, RunTimeScan

FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
MEMORY_CAP = 3 << 30  # bytes of address space the bomb may use
SCAN_STEPS = 20_000
NESTED_TRIPS = 30


def scan_model(steps: int = SCAN_STEPS) -> onnx.ModelProto:
    """Scan over x[steps]: state += x_t, scan output the running sum (a cumulative sum)."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]), helper.make_node("Identity", ["s_out"], ["y_t"])],
        "body",
        [helper.make_tensor_value_info("s_in", FLOAT, []), helper.make_tensor_value_info("x_t", FLOAT, [])],
        [helper.make_tensor_value_info("s_out", FLOAT, []), helper.make_tensor_value_info("y_t", FLOAT, [])],
    )
    node = helper.make_node("Scan", ["s0", "x"], ["s", "y"], body=body, num_scan_inputs=1)
    graph = helper.make_graph(
        [node],
        "scan",
        [helper.make_tensor_value_info("s0", FLOAT, []), helper.make_tensor_value_info("x", FLOAT, [steps])],
        [helper.make_tensor_value_info("s", FLOAT, []), helper.make_tensor_value_info("y", FLOAT, [steps])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _loop(trips: str, inner: list[onnx.NodeProto], level: int) -> onnx.NodeProto:
    """Loop(trips) carrying a float ``v{level}``: the body runs ``inner`` (which maps v_in to v_out)."""
    body = helper.make_graph(
        inner + [helper.make_node("Identity", [f"c_in{level}"], [f"c_out{level}"])],
        f"body{level}",
        [
            helper.make_tensor_value_info(f"i{level}", INT64, []),
            helper.make_tensor_value_info(f"c_in{level}", BOOL, []),
            helper.make_tensor_value_info(f"v_in{level}", FLOAT, []),
        ],
        [
            helper.make_tensor_value_info(f"c_out{level}", BOOL, []),
            helper.make_tensor_value_info(f"v_out{level}", FLOAT, []),
        ],
    )
    return helper.make_node(
        "Loop",
        [trips, "", f"v_in{level + 1}" if level < 2 else "v"],
        [f"v_out{level + 1}" if level < 2 else "out"],
        body=body,
    )


def nested_loops_model(trips: int = NESTED_TRIPS) -> onnx.ModelProto:
    """Three nested Loops of ``trips`` iterations each; the innermost adds one: out = v + trips**3."""
    innermost = [helper.make_node("Add", ["v_in0", "one"], ["v_out0"])]
    middle = [_loop("n", innermost, 0)]
    middle[0].input[2], middle[0].output[0] = "v_in1", "v_out1"
    outer = [_loop("n", middle, 1)]
    outer[0].input[2], outer[0].output[0] = "v_in2", "v_out2"
    top = _loop("n", outer, 2)
    graph = helper.make_graph(
        [top],
        "nested",
        [helper.make_tensor_value_info("v", FLOAT, [])],
        [helper.make_tensor_value_info("out", FLOAT, [])],
        [
            numpy_helper.from_array(np.array(trips, np.int64), "n"),
            numpy_helper.from_array(np.array(1, np.float32), "one"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def size_model(op: str) -> onnx.ModelProto:
    """``op`` to an output of 2**40 float32 elements (4 TiB), then a ReduceSum over it."""
    x = helper.make_tensor_value_info("x", FLOAT, [1])
    constants = {
        "Expand": ([numpy_helper.from_array(np.array([2**20, 2**20], np.int64), "shape")], ["x", "shape"]),
        "Tile": ([numpy_helper.from_array(np.array([2**40], np.int64), "repeats")], ["x", "repeats"]),
        "ConstantOfShape": ([numpy_helper.from_array(np.array([2**40], np.int64), "shape")], ["shape"]),
        "Range": (
            [
                numpy_helper.from_array(np.array(v, np.float32), n)
                for n, v in (("start", 0), ("limit", 2**40), ("delta", 1))
            ],
            ["start", "limit", "delta"],
        ),
    }
    initializers, inputs = constants[op]
    nodes = [helper.make_node(op, inputs, ["big"]), helper.make_node("ReduceSum", ["big"], ["total"], keepdims=0)]
    if op in ("ConstantOfShape", "Range"):
        nodes.append(helper.make_node("Add", ["total", "x"], ["out"]))
    else:
        nodes.append(helper.make_node("Identity", ["total"], ["out"]))
    graph = helper.make_graph(nodes, op, [x], [helper.make_tensor_value_info("out", FLOAT, None)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def run(name: str) -> dict:
    """Convert and run one bomb; what happened, as JSON-ready values."""
    if name == "scan":
        model, inputs = scan_model(), [torch.tensor(0.0), torch.ones(SCAN_STEPS)]
    elif name == "nested_loops":
        model, inputs = nested_loops_model(), [torch.tensor(0.0)]
    else:
        model, inputs = size_model(name), [torch.ones(1)]
    started = time.perf_counter()
    specs = [TensorSpec(tuple(t.shape), t.dtype) for t in inputs]
    try:
        module = convert_graph(model.graph, {"": 17}, specs, training=False, examples=inputs)
        outputs = module(*inputs)
    except Exception as error:  # reported to the test, which checks type and message
        return {"error": type(error).__name__, "message": str(error), "seconds": time.perf_counter() - started}
    return {
        "outputs": [t.reshape(-1)[-1].item() for t in outputs],
        "graph_nodes": sum(len(m.graph.nodes) for m in module.modules() if isinstance(m, torch.fx.GraphModule)),
        "run_time_loops": sum(isinstance(m, (RunTimeLoop, RunTimeScan)) for m in module.modules()),
        "seconds": time.perf_counter() - started,
    }


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))
    print(json.dumps({name: run(name) for name in sys.argv[1:]}))
