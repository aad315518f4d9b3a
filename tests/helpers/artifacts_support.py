"""Helpers shared by the test_artifacts* modules (no tests here).

ORT names generated values ``onnx::<token>::<n>`` from a process-global counter, so artifacts ORT
made later in one process carry shifted numbers; ``canonical`` renumbers such names by first
appearance so that graphs compare node for node.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx

from ort_torch_train.artifacts import Add, Block, Constant, L1Loss, LossType, MSELoss, Mul, OptimType

_GENERATED = re.compile(r"^onnx::(.+)::(\d+)$")
LOSSES = {
    "ce": LossType.CrossEntropyLoss,
    "mse": LossType.MSELoss,
    "bce": LossType.BCEWithLogitsLoss,
    "l1": LossType.L1Loss,
}


class WeightedMseL1(Block):
    """0.7 * MSELoss + 0.3 * L1Loss, composed from blocks (the fixtures' custom onnxblock loss)."""

    def __init__(self, w_mse: float = 0.7, w_l1: float = 0.3) -> None:
        super().__init__()
        self._mse, self._l1 = MSELoss(), L1Loss()
        self._w_mse, self._w_l1 = Constant(w_mse), Constant(w_l1)
        self._mul1, self._mul2, self._add = Mul(), Mul(), Add()

    def build(self, output_name: str, target_name: str = "target") -> str:
        mse = self._mul1(self._w_mse(), self._mse(output_name, target_name))
        l1 = self._mul2(self._w_l1(), self._l1(output_name, target_name))
        return self._add(mse, l1)


def generate_arguments(expected: dict) -> dict:
    """generate_artifacts keyword arguments from an expected.json's ``generate_artifacts`` record."""
    spec = expected["generate_artifacts"]
    loss = WeightedMseL1() if spec["loss"].startswith("custom") else LOSSES[spec["loss"]]
    return {
        "requires_grad": spec["requires_grad"],
        "frozen_params": spec["frozen_params"],
        "loss": loss,
        "optimizer": OptimType[spec["optimizer"]],
        "nominal_checkpoint": spec["nominal_checkpoint"],
        "additional_output_names": spec["additional_output_names"],
    }


def load_expected(case: Path) -> dict:
    return json.loads((case / "expected.json").read_text())


def input_keys(expected: dict) -> list[str]:
    """data.npz key stems of the user inputs, in input order (e.g. ['x'] or ['x', 'mask'])."""
    inputs = expected.get("data_keys", {}).get("inputs")
    if not inputs:
        return ["x"]
    return [value.split("_train")[0] for value in inputs.values()]


def batch(data: np.lib.npyio.NpzFile, keys: list[str], split: str, step: int | None = None) -> list[np.ndarray]:
    """The user inputs then the target of one step (``split='train'``) or of the eval set."""
    arrays = [data[f"{key}_{split}"] for key in keys] + [data[f"y_{split}"]]
    return [a[step] for a in arrays] if step is not None else arrays


def first_value(outputs) -> float:
    """The first (or only) output of a Module call as a float (losses may be shaped [] or [1])."""
    return np.asarray(outputs[0] if isinstance(outputs, tuple) else outputs).item()


def canonical(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy with generated names renumbered by first appearance, unreferenced value_info dropped."""
    result = onnx.ModelProto()
    result.CopyFrom(model)
    mapping: dict[str, str] = {}

    def rename(name: str) -> str:
        match = _GENERATED.match(name)
        if not match:
            return name
        return mapping.setdefault(name, f"onnx::{match.group(1)}::#{len(mapping)}")

    graph = result.graph
    for value in graph.input:
        value.name = rename(value.name)
    for init in graph.initializer:
        init.name = rename(init.name)
    for node in graph.node:
        node.name = rename(node.name)
        node.input[:] = [rename(name) for name in node.input]
        node.output[:] = [rename(name) for name in node.output]
    for value in graph.output:
        value.name = rename(value.name)
    used = {name for node in graph.node for name in (*node.input, *node.output)}
    kept = [value for value in graph.value_info if rename(value.name) in used]
    for value in kept:
        value.name = rename(value.name)
    del graph.value_info[:]
    graph.value_info.extend(kept)
    return result


def graph_differences(ours: onnx.ModelProto, theirs: onnx.ModelProto) -> list[str]:
    """What differs between two models, node for node (empty when they match)."""
    a, b = canonical(ours), canonical(theirs)
    problems = []
    if a.ir_version != b.ir_version:
        problems.append(f"ir_version {a.ir_version} != {b.ir_version}")
    if list(a.opset_import) != list(b.opset_import):
        problems.append(f"opset_import {a.opset_import} != {b.opset_import}")
    for what in ("input", "output", "initializer"):
        if list(getattr(a.graph, what)) != list(getattr(b.graph, what)):
            problems.append(
                f"graph {what}s differ: {[v.name for v in getattr(a.graph, what)]} vs "
                f"{[v.name for v in getattr(b.graph, what)]}"
            )
    if len(a.graph.node) != len(b.graph.node):
        problems.append(
            f"{len(a.graph.node)} nodes vs {len(b.graph.node)}: "
            f"{[n.op_type for n in a.graph.node]} vs {[n.op_type for n in b.graph.node]}"
        )
    for index, (x, y) in enumerate(zip(a.graph.node, b.graph.node)):
        if x != y:
            problems.append(f"node {index} differs:\n{x}\nvs\n{y}")
    types_a = {v.name: v for v in a.graph.value_info}
    for value in b.graph.value_info:
        if value.name in types_a and types_a[value.name] != value:
            problems.append(f"value_info {value.name}: {types_a[value.name].type} vs {value.type}")
    return problems
