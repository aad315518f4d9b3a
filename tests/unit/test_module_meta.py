"""The typed facts in torch.fx ``meta`` dicts (module_meta.py): each written and read through its key,
each key declared once, and no source reading or writing one through a string of its own."""

from __future__ import annotations

import re
from collections import Counter

import onnx
import torch
from onnx import helper
from torch import fx

from ort_torch_train.convert import meta_keys as convert_keys
from ort_torch_train.convert.graph import TensorSpec, convert_graph
from ort_torch_train.convert.meta_keys import INPUT_REQUIRES_GRAD, MATRIX_PRODUCTS
from ort_torch_train.module_meta import MetaKey
from ort_torch_train.passes import meta_keys as passes_keys
from ort_torch_train.passes.meta_keys import FUSIONS
from ort_torch_train.passes.pipeline import run_eager
from ort_torch_train.training import meta_keys as training_keys
from tests.unit.test_architecture import modules

F32 = onnx.TensorProto.FLOAT
# torch.fx's own entries, which stay plain strings
FX_ENTRIES = {"val", "tensor_meta"}
# a meta dict indexed or read with a string literal, or any object's meta read through getattr
LITERAL_ACCESS = re.compile(r"""\.meta(?:\.(?:get|pop|setdefault)\(|\[)\s*["'](\w+)["']|getattr\([^)]*["']meta["']""")


def _linear_graph() -> onnx.GraphProto:
    """``x @ w.T + b`` for x of 4x3 and w of 5x3."""
    nodes = [
        helper.make_node("Transpose", ["w"], ["w_t"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "w_t"], ["product"]),
        helper.make_node("Add", ["product", "b"], ["out"]),
    ]
    inputs = [
        helper.make_tensor_value_info(name, F32, shape) for name, shape in (("x", [4, 3]), ("w", [5, 3]), ("b", [5]))
    ]
    return helper.make_graph(nodes, "linear", inputs, [helper.make_tensor_value_info("out", F32, None)])


def test_a_key_reads_writes_and_removes_its_entry_of_a_module_and_of_a_node() -> None:
    key: MetaKey[int] = MetaKey("answer")
    graph = fx.Graph()
    node = graph.placeholder("x")
    graph.output(node)
    for owner in (fx.GraphModule(torch.nn.Module(), graph), node):
        assert key.get(owner, None) is None
        key.set(owner, 41)
        assert key.setdefault(owner, 0) == 41 and owner.meta["answer"] == 41  # the entry of the key's name
        assert key.pop(owner, None) == 41 and key.pop(owner, None) is None
        assert key.setdefault(owner, 7) == 7 and key.get(owner, None) == 7


def test_a_converted_graph_keeps_its_facts_under_their_keys() -> None:
    examples = [torch.randn(4, 3), torch.randn(5, 3, requires_grad=True), torch.randn(5)]
    specs = [TensorSpec(tuple(t.shape), t.dtype) for t in examples]
    module = convert_graph(_linear_graph(), {"": 17}, specs, training=True, examples=examples)
    assert MATRIX_PRODUCTS.get(module, []) == [4 * 3 * 5]
    placeholders = module.graph.find_nodes(op="placeholder")
    assert [INPUT_REQUIRES_GRAD.get(node, None) for node in placeholders] == [False, True, False]
    assert FUSIONS.get(module, None) is None  # not rewritten yet
    fused = run_eager(module, torch.device("cpu"))
    counts = FUSIONS.get(fused, Counter())
    assert isinstance(counts, Counter) and counts["linear"] == 1
    assert MATRIX_PRODUCTS.get(fused, []) == [60]  # the rewrites keep the conversion's facts


def test_no_converted_graph_without_examples_notes_whether_its_inputs_need_gradients() -> None:
    specs = [TensorSpec((4, 3), torch.float32), TensorSpec((5, 3), torch.float32), TensorSpec((5,), torch.float32)]
    module = convert_graph(_linear_graph(), {"": 17}, specs, training=True)
    assert all(INPUT_REQUIRES_GRAD.get(node, None) is None for node in module.graph.find_nodes(op="placeholder"))


def test_each_key_is_declared_once_under_a_name_of_its_own() -> None:
    declared = [
        (f"{keys.__name__}.{name}", value.name)
        for keys in (convert_keys, passes_keys, training_keys)
        for name, value in vars(keys).items()
        if isinstance(value, MetaKey)
    ]
    names = [name for _, name in declared]
    assert len(declared) == 8 and len(set(names)) == len(names), declared
    assert not FX_ENTRIES & set(names)


def test_no_module_reads_or_writes_a_meta_entry_through_a_string_of_its_own() -> None:
    found = [
        f"{module}: {match.group(0)}"
        for module, path in modules().items()
        if module != "ort_torch_train.module_meta"
        for match in LITERAL_ACCESS.finditer(path.read_text())
        if match.group(1) not in FX_ENTRIES
    ]
    assert not found, "meta entries outside their MetaKey:\n" + "\n".join(found)
