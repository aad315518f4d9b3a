"""float64 gradchecks of converted ops on the smallest ONNX backend node cases of each operator.

Each operator's smallest node cases with floating inputs and outputs (not a known conformance
failure, not an ``_expanded`` function body) is re-typed to float64: float inputs become DOUBLE graph
inputs filled with random values shaped like the case's (integer inputs keep the case's values),
then ``torch.autograd.gradcheck`` runs w.r.t. those float inputs on the floating outputs.

Run directly for a report: ``python -m tests.helpers.gradcheck_cases [op ...]``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import re
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto

from ort_torch_train.convert.graph import TensorSpec, convert_graph
from ort_torch_train.errors import UnsupportedOperatorError
from ort_torch_train.passes.pipeline import fuse_converted
from tests.helpers import conformance
from tests.helpers.conformance import KNOWN_FAILURES_FILE, _array, _op_of, _skip_reason, known_failures, node_cases
from tests.helpers.paths import ROOT

CONFORMANCE = Path(conformance.__file__)
NAMES_CACHE = ROOT / ".pytest_cache" / "gradcheck_case_names.json"
FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16)
MAX_FULL = 300  # input and output elements up to which gradcheck runs in full mode (fast mode above)
MAX_ELEMENTS = 20_000  # cases with more float input elements are not candidates
CASES_PER_OP = 2

# Where the op's math needs it: the range the random float inputs are drawn from (|x| in [0.2, 1]
# with random signs otherwise, away from the kinks at 0 of Relu, Abs, LeakyRelu ...).
POSITIVE = (0.2, 2.0)
DOMAINS = {
    "Acosh": (1.5, 3.0),
    "Sqrt": POSITIVE,
    "Log": POSITIVE,
    "Pow": POSITIVE,
    "ReduceLogSum": POSITIVE,
    "Adam": POSITIVE,
    "Adagrad": POSITIVE,
}  # the optimizers' squared-gradient accumulators

# Float inputs that configure the op rather than carry data: kept at the case's values, not differentiated.
SETTINGS_INPUTS = {
    "Resize": ({1, 2}, "roi and scales define the output grid"),
    "Upsample": ({1}, "scales define the output shape"),
    "RoiAlign": (
        {1},
        "box coordinates are read on the host (as torchvision's roi_align, gradients reach the features only)",
    ),
}

# Operators with floating inputs and outputs that are not gradchecked, with the reason (reviewed).
NOT_DIFFERENTIABLE = {
    "Ceil": "step function: zero gradient almost everywhere (torch gives zeros)",
    "Floor": "step function: zero gradient almost everywhere (torch gives zeros)",
    "Round": "step function: zero gradient almost everywhere (torch gives zeros)",
    "Sign": "step function: zero gradient almost everywhere (torch gives zeros)",
    "Binarizer": "step function (ai.onnx.ml): zero gradient almost everywhere",
    "Hardmax": "one-hot of the argmax: piecewise constant",
    "TreeEnsemble": "decision trees (ai.onnx.ml): piecewise constant in X",
    "Range": "its inputs define the output's length; torch.arange is not differentiable (ORT has no Range gradient)",
    "MelWeightMatrix": "a filter bank computed from its settings (sizes, frequency edges read on the host)",
    "Unique": "set of distinct values found by sorting; torch's unique has no derivative",
}


@dataclass(frozen=True)
class Candidate:
    """A node case re-typed to float64, with the values to gradcheck it at."""

    case: str
    op: str
    model: onnx.ModelProto
    inputs: list[np.ndarray]
    output_elements: int

    @property
    def differentiable(self) -> list[bool]:
        """Per input: gradchecked (a non-empty float64 input that carries data, not a setting)."""
        settings = SETTINGS_INPUTS.get(self.op, (set(), ""))[0]
        return [v.dtype == np.float64 and v.size > 0 and i not in settings for i, v in enumerate(self.inputs)]

    @property
    def float_elements(self) -> int:
        return sum(v.size for v, wanted in zip(self.inputs, self.differentiable) if wanted)


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
    for node in double.graph.node:
        for attribute in node.attribute:
            if attribute.name in ("to", "dtype") and attribute.i in FLOAT_TYPES:
                attribute.i = TensorProto.DOUBLE
    return double


def _random_like(value: np.ndarray, op: str, generator: np.random.Generator) -> np.ndarray:
    if op in DOMAINS:
        return np.asarray(generator.uniform(*DOMAINS[op], value.shape))
    return np.asarray(generator.uniform(0.2, 1.0, value.shape) * generator.choice([-1.0, 1.0], value.shape))


def candidates(ops: set[str] | None = None) -> dict[str, list[Candidate]]:
    """Per operator, its usable node cases re-typed to float64, smallest first (an empty list for an
    operator whose cases with floating inputs and outputs are all too large or empty)."""
    known = known_failures()
    found: dict[str, list[Candidate]] = {}
    for case in node_cases(ops):
        model = case.model
        if "_expanded" in case.name or case.name in known or len(model.graph.node) != 1:
            continue
        inputs, outputs = case.data_sets[0]
        inputs, outputs = [_array(v) for v in inputs], [_array(v) for v in outputs]
        if _skip_reason(model, [(inputs, outputs)]):
            continue
        graph = model.graph
        float_in = [_elem_type(vi) in FLOAT_TYPES for vi in graph.input]
        if not any(float_in) or not any(_elem_type(vi) in FLOAT_TYPES for vi in graph.output):
            continue
        op = _op_of(model, case.name)
        settings = SETTINGS_INPUTS.get(op, (set(), ""))[0]
        generator = np.random.default_rng(len(found))
        values = [
            np.array(v, dtype=np.float64)
            if is_float and i in settings
            else _random_like(v, op, generator)
            if is_float
            else np.array(v)
            for i, (v, is_float) in enumerate(zip(inputs, float_in))
        ]
        candidate = Candidate(case.name, op, _as_float64(model), values, sum(v.size for v in outputs))
        usable = any(candidate.differentiable) and candidate.float_elements <= MAX_ELEMENTS
        found.setdefault(op, []).extend([candidate] if usable else [])
    for cases in found.values():
        cases.sort(key=lambda c: (c.float_elements + c.output_elements, c.case))
    return found


@functools.cache
def all_candidates() -> dict[str, list[Candidate]]:
    """``candidates()`` of every operator, computed once per process."""
    return candidates()


@functools.cache
def checked() -> dict[str, Candidate]:
    """The gradchecked node cases by name: the ``CASES_PER_OP`` smallest of each operator not listed in
    ``NOT_DIFFERENTIABLE``."""
    return {
        case.case: case
        for op, cases in sorted(all_candidates().items())
        if op not in NOT_DIFFERENTIABLE
        for case in cases[:CASES_PER_OP]
    }


def checked_case_names() -> list[str]:
    """The names of ``checked()``, remembered in .pytest_cache for this onnx and these helpers, so that
    collecting the tests does not build every node case (that happens when they run)."""
    key = hashlib.sha256(
        b"\0".join(
            [
                onnx.__version__.encode(),
                *(path.read_bytes() for path in (Path(__file__), CONFORMANCE, KNOWN_FAILURES_FILE)),
            ]
        )
    ).hexdigest()
    try:
        cached = json.loads(NAMES_CACHE.read_text())
        if cached["key"] == key:
            return cached["names"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    names = list(checked())
    with contextlib.suppress(OSError):
        NAMES_CACHE.parent.mkdir(parents=True, exist_ok=True)
        NAMES_CACHE.write_text(json.dumps({"key": key, "names": names}))
    return names


def module_of(candidate: Candidate) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    """The converted float64 node (training mode) and the tensors to call it with."""
    tensors = [torch.from_numpy(v) for v in candidate.inputs]
    specs = [TensorSpec(tuple(t.shape), t.dtype) for t in tensors]
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in candidate.model.opset_import}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = convert_graph(candidate.model.graph, opsets, specs, training=True, examples=tensors)
        fuse_converted(module, torch.device("cpu"))
    return module, tensors


def gradcheck(candidate: Candidate) -> None:
    """Raise unless the converted node's float64 gradients match finite differences (random ops,
    e.g. Dropout in training mode, draw the same numbers at every call)."""
    module, tensors = module_of(candidate)
    wanted = candidate.differentiable

    def function(*diff):
        it = iter(diff)
        args = [next(it) if w else t for t, w in zip(tensors, wanted)]
        with torch.random.fork_rng():
            torch.manual_seed(0)
            return tuple(o for o in module(*args) if o.is_floating_point())

    leaves = [t.clone().requires_grad_() for t, w in zip(tensors, wanted) if w]
    torch.autograd.gradcheck(
        function,
        leaves,
        eps=1e-6,
        atol=1e-5,
        rtol=1e-4,
        fast_mode=max(candidate.float_elements, candidate.output_elements) > MAX_FULL,
    )


def main(argv: list[str]) -> None:
    found = candidates(set(argv) or None)
    for op, cases in sorted(found.items()):
        if op in NOT_DIFFERENTIABLE or not cases:
            print(f"{'listed' if cases else 'NONE':6} {op}")
        for case in cases[:CASES_PER_OP] if op not in NOT_DIFFERENTIABLE else ():
            try:
                start = time.perf_counter()
                gradcheck(case)
                print(f"ok     {op:24} {case.case} {case.float_elements} {time.perf_counter() - start:.2f}s")
            except UnsupportedOperatorError:
                print(f"unsup  {op:24} {case.case}")
            except Exception as exc:  # noqa: BLE001  (a report)
                detail = re.sub(r"\s+", " ", str(exc))[:160]
                print(f"FAIL   {op:24} {case.case}: {type(exc).__name__}: {detail}")


if __name__ == "__main__":
    main(sys.argv[1:])
