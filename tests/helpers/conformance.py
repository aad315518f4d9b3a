"""ONNX's backend node test cases run through the project's converter, in process.

Each case is converted with ``convert_graph`` (its inputs as graph inputs, never constants) and its
outputs compared with ONNX's expected outputs at the case's tolerances. Outcomes: ``pass``,
``unsupported`` (an UnsupportedOperatorError), ``wrong`` (converted, ran, numbers differ), ``error``
(any other exception) and ``skipped`` (non-tensor inputs/outputs, float8/float4/int4/int2 or string
data, or too large, with the reason). bfloat16 data runs (torch has the dtype).

Run directly for a report: ``python -m tests.helpers.conformance [--verbose] [--by-op] [op ...]``;
``python -m tests.helpers.conformance --markdown docs/conformance.md`` rewrites the per-operator docs page.
"""

from __future__ import annotations

import re
import sys
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx.backend.test.case.node import collect_testcases

from ort_torch_train.convert.graph import TensorSpec, convert_graph
from ort_torch_train.errors import UnsupportedOperatorError
from ort_torch_train.passes.pipeline import fuse_converted

KNOWN_FAILURES_FILE = Path(__file__).with_name("conformance_known_failures.txt")
DOCS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"
MAX_ELEMENTS = 2_000_000  # cases with more input/output elements are skipped (time budget)


@dataclass(frozen=True)
class Outcome:
    case: str
    op: str
    status: str  # pass | unsupported | wrong | error | skipped
    detail: str = ""


def _is_tensor(value_info: onnx.ValueInfoProto) -> bool:
    return value_info.type.HasField("tensor_type")


def _array(value):
    """Test data as a numpy array (numpy scalars and TensorProtos converted), else unchanged."""
    if isinstance(value, np.generic):
        return np.asarray(value)
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    return value


def _skip_reason(model: onnx.ModelProto, data_sets: list) -> str | None:
    graph = model.graph
    if not all(_is_tensor(v) for v in (*graph.input, *graph.output)):
        return "non-tensor input or output (sequence/optional/map)"
    for inputs, outputs in data_sets:
        values = [*inputs, *outputs]
        if any(not isinstance(v, np.ndarray) for v in values):
            return "non-array test data"
        if any(v.dtype.kind in "OUS" for v in values):
            return "string tensors"
        if any(
            str(v.dtype) != "bfloat16"
            and (v.dtype.kind == "V" or str(v.dtype).startswith(("float8", "float4", "int4", "uint4", "int2", "uint2")))
            for v in values
        ):
            return "ml_dtypes tensors (float8/float4/int4/int2)"
        if sum(v.size for v in values) > MAX_ELEMENTS:
            return f"more than {MAX_ELEMENTS} elements"
    return None


def _op_of(model: onnx.ModelProto, case_name: str) -> str:
    ops = [node.op_type for node in model.graph.node]
    return ops[-1] if len(ops) == 1 else (ops[0] if ops else case_name)


def _tensor(array: np.ndarray) -> torch.Tensor:
    """A torch copy of a test array (ml_dtypes bfloat16 through its bits)."""
    if str(array.dtype) == "bfloat16":
        return torch.from_numpy(np.array(array, copy=True).view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(np.array(array, copy=True))


def _matches(actual, expected: np.ndarray, rtol: float, atol: float) -> tuple[bool, str]:
    if not isinstance(actual, torch.Tensor):
        return False, f"output is {type(actual).__name__}, not a tensor"
    if str(expected.dtype) == "bfloat16":
        if actual.dtype != torch.bfloat16:
            return False, f"dtype {actual.dtype} != expected bfloat16"
        actual, expected = actual.float(), expected.astype(np.float32)
    got = actual.detach().cpu()
    if tuple(got.shape) != expected.shape:
        return False, f"shape {tuple(got.shape)} != expected {expected.shape}"
    got = got.numpy() if got.dtype != torch.bfloat16 else got.float().numpy()
    if got.dtype != expected.dtype:
        return False, f"dtype {got.dtype} != expected {expected.dtype}"
    if expected.dtype.kind in "biu":
        ok = np.array_equal(got, expected)
    else:
        ok = np.allclose(got, expected, rtol=rtol, atol=atol, equal_nan=True)
    if ok:
        return True, ""
    with np.errstate(all="ignore"):
        diff = np.nanmax(np.abs(got.astype(np.float64) - expected.astype(np.float64))) if got.size else 0.0
    return False, f"max abs diff {diff:.3g}"


def run_case(case) -> Outcome:
    """Convert and run one node test case."""
    model = case.model
    op = _op_of(model, case.name)
    data_sets = [([_array(v) for v in inputs], [_array(v) for v in outputs]) for inputs, outputs in case.data_sets]
    reason = _skip_reason(model, data_sets)
    if reason:
        return Outcome(case.name, op, "skipped", reason)
    if model.functions:
        model = onnx.inliner.inline_local_functions(model)
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    for inputs, expected_outputs in data_sets:
        tensors = [_tensor(array) for array in inputs]
        specs = [TensorSpec(tuple(t.shape), t.dtype) for t in tensors]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module = convert_graph(model.graph, opsets, specs, training=False, examples=tensors)
                fuse_converted(module, torch.device("cpu"))
                with torch.no_grad():
                    outputs = module(*tensors)
        except UnsupportedOperatorError as exc:
            return Outcome(case.name, op, "unsupported", str(exc).split(";")[0])
        except Exception as exc:  # noqa: BLE001  (recorded, compared with the known-failures file)
            return Outcome(case.name, op, "error", f"{type(exc).__name__}: {str(exc)[:200]}")
        if len(outputs) != len(expected_outputs):
            return Outcome(case.name, op, "wrong", f"{len(outputs)} outputs, expected {len(expected_outputs)}")
        for index, (actual, expected) in enumerate(zip(outputs, expected_outputs)):
            ok, detail = _matches(actual, np.asarray(expected), case.rtol, case.atol)
            if not ok:
                return Outcome(case.name, op, "wrong", f"output {index}: {detail}")
    return Outcome(case.name, op, "pass")


def node_cases(ops: set[str] | None = None) -> list:
    with warnings.catch_warnings(), np.errstate(all="ignore"):  # the cases' own numpy arithmetic
        warnings.simplefilter("ignore")
        cases = [case for case in collect_testcases() if case.kind == "node"]
    if ops:
        cases = [case for case in cases if _op_of(case.model, case.name) in ops or case.name in ops]
    return cases


def run_all(ops: set[str] | None = None) -> list[Outcome]:
    return [run_case(case) for case in node_cases(ops)]


def known_failures() -> dict[str, str]:
    """``case name -> reason`` from the reviewed known-failures file."""
    entries = {}
    for line in KNOWN_FAILURES_FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, reason = line.partition(" ")
            entries[name] = reason.strip()
    return entries


def summary(outcomes: list[Outcome]) -> Counter:
    known = known_failures()
    return Counter(
        "known-failure" if o.case in known and o.status in ("error", "wrong") else o.status for o in outcomes
    )


def by_operator(outcomes: list[Outcome]) -> dict[str, Counter]:
    """Counts per operator; an ``_expanded`` case (the op's function body) counts for its op."""
    known = known_failures()
    ops = {o.case: o.op for o in outcomes}
    table: dict[str, Counter] = {}
    for o in outcomes:
        op = ops.get(re.sub(r"_expanded.*$", "", o.case), o.op)
        status = "known-failure" if o.case in known and o.status in ("error", "wrong") else o.status
        table.setdefault(op, Counter())[status] += 1
    return table


def markdown(outcomes: list[Outcome]) -> str:
    """The docs page: totals, then one row per operator."""
    totals = summary(outcomes)
    columns = ("pass", "wrong", "known-failure", "unsupported", "skipped")
    lines = [
        "# Operator conformance",
        "",
        "ONNX's backend node tests (`onnx.backend.test.case.node.collect_testcases`) run through the converter",
        "by `tests/unit/adapters/test_conformance.py`. Known failures are listed with their reason in",
        "`tests/helpers/conformance_known_failures.txt`; unsupported cases raise `UnsupportedOperatorError`; skipped",
        "cases have non-tensor or float8/float4/int4/int2/string data. Regenerate this page with",
        "`python -m tests.helpers.conformance --markdown docs/conformance.md`.",
        "",
        f"Onnx {onnx.__version__}, {len(outcomes)} cases: " + ", ".join(f"**{totals[c]} {c}**" for c in columns) + ".",
        f"The cases are those of the one onnx installed ({onnx.__version__}); the project allows onnx>=1.21, whose",
        "other versions' node cases are not run here.",
        "",
        "| operator | " + " | ".join(columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    for op, counts in sorted(by_operator(outcomes).items(), key=lambda item: item[0].lower()):
        lines.append(f"| {op} | " + " | ".join(str(counts[c] or "") for c in columns) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    verbose = "--verbose" in argv
    ops = {a for a in argv if not a.startswith("--") and not a.endswith(".md")} or None
    outcomes = run_all(ops)
    known = known_failures()
    for outcome in outcomes:
        flagged = outcome.status in ("wrong", "error") and outcome.case not in known
        if verbose or flagged:
            print(f"{outcome.status:12} {outcome.op:24} {outcome.case}  {outcome.detail}")
    if "--by-op" in argv:
        for op, counts in sorted(by_operator(outcomes).items()):
            print(op, dict(counts))
    if "--markdown" in argv:
        Path(argv[argv.index("--markdown") + 1]).write_text(markdown(outcomes))
    print(dict(summary(outcomes)), "total", len(outcomes))


if __name__ == "__main__":
    main(sys.argv[1:])
