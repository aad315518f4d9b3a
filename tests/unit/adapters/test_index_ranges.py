"""Indices read from data follow ONNX: [-size, size) is valid (negatives count from the end); anything
else raises IndexRangeError naming the op, the input, the value and the range, eager and compiled."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts
from ort_torch_train.errors import IndexRangeError
from tests.helpers.adapter_harness import convert_model, one_node_model, reference_outputs
from tests.helpers.timeouts import scaled

VOCAB, WIDTH, BATCH = 16, 4, 3
RNG = np.random.default_rng(5)
IDS = RNG.integers(0, VOCAB, size=(BATCH, 2)).astype(np.int64)
TARGET = RNG.standard_normal((BATCH, 2, WIDTH)).astype(np.float32)


def embedding_model() -> onnx.ModelProto:
    """ids[batch, 2] -> Gather(embed.weight) -> Mul(scale) -> out[batch, 2, width]."""
    weight = numpy_helper.from_array(RNG.standard_normal((VOCAB, WIDTH)).astype(np.float32), "embed.weight")
    scale = numpy_helper.from_array(np.full((WIDTH,), 1.5, np.float32), "scale")
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["embed.weight", "ids"], ["rows"], name="embed"),
            helper.make_node("Mul", ["rows", "scale"], ["out"]),
        ],
        "embedding",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [BATCH, 2])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [BATCH, 2, WIDTH])],
        [weight, scale],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("embedding")
    generate_artifacts(
        embedding_model(),
        requires_grad=["embed.weight"],
        loss=LossType.MSELoss,
        optimizer=OptimType.AdamW,
        artifact_directory=directory,
    )
    return directory


def _module(directory: Path, compile: bool) -> Module:
    state = CheckpointState.load_checkpoint(directory / "checkpoint")
    return Module(directory / "training_model.onnx", state, directory / "eval_model.onnx", compile=compile)


def _check_module(directory: Path, compile: bool) -> None:
    """Out-of-range ids raise IndexRangeError in training and eval steps; negative ones count from the end
    and train. A compiled step checks inside its graph (a RuntimeError naming the op, the input and the
    range); the engine then reruns the forward eagerly, whose error names the value too."""
    module = _module(directory, compile)
    module(IDS, TARGET)  # converted (and compiled) on good ids: the conversion's example run checks them too
    module.eval()
    module(IDS, TARGET)
    module.train()
    bad = IDS.copy()
    bad[1, 0] = VOCAB + 64
    message = rf"Gather node 'embed': input 'ids' holds {VOCAB + 64}, outside the valid range \[-{VOCAB}, {VOCAB}\)"
    with pytest.raises(IndexRangeError, match=message) as caught:
        module(bad, TARGET)
    if compile:
        assert isinstance(caught.value.__cause__, RuntimeError)
        assert "input 'ids' holds a value outside the valid range [-16, 16)" in str(caught.value.__cause__)
    module.eval()  # the eval model computes the loss too; a compiled eval step raises its graph's error
    in_graph = rf"Gather node 'embed': input 'ids' holds a value outside the valid range \[-{VOCAB}, {VOCAB}\)"
    with pytest.raises(RuntimeError if compile else IndexRangeError, match=in_graph if compile else message):
        module(bad, TARGET)
    with pytest.raises(RuntimeError, match=in_graph if compile else rf"holds {-VOCAB - 1}, outside the valid range"):
        module(IDS - VOCAB - 1, TARGET)
    assert float(module(IDS - VOCAB, TARGET)) == float(module(IDS, TARGET))  # negative ids count from the end
    module.train()
    optimizer = Optimizer(directory / "optimizer_model.onnx", module)
    losses = []
    for _ in range(3):
        losses.append(float(module(IDS - VOCAB, TARGET)))
        optimizer.step()
        module.lazy_reset_grad()
    assert losses[-1] < losses[0]


def test_an_embedding_refuses_ids_outside_the_vocabulary_and_counts_negative_ones_from_the_end(artifacts: Path):
    _check_module(artifacts, compile=False)


@pytest.mark.compile
def test_a_compiled_embedding_refuses_ids_outside_the_vocabulary(artifacts: Path):
    _check_module(artifacts, compile=True)


# Node models: GatherND, ScatterElements (and the other index ops), converted as the engine converts them
DATA = RNG.standard_normal((4, 5, 3)).astype(np.float32)
NODE_CASES = {
    # op: (inputs with in-range indices, the indices' position, one index out of range, the error's range)
    "GatherND": ([DATA, np.array([[0, 4], [-4, -5], [3, 1]], np.int64)], {"batch_dims": 0}, (1, (2, 1), 5), (-5, 5)),
    "ScatterElements": (
        [DATA, np.array([[[0, -1, 2]], [[-5, 4, 1]]], np.int64).repeat(2, 0), np.ones((4, 1, 3), np.float32)],
        {"axis": 1},
        (1, (0, 0, 1), -6),
        (-5, 5),
    ),
    "GatherElements": ([DATA, np.array([[[1, -2, 0]]] * 4, np.int64)], {"axis": 1}, (1, (3, 0, 2), 5), (-5, 5)),
    "ScatterND": (
        [DATA, np.array([[-1, 2], [0, -5]], np.int64), np.ones((2, 3), np.float32)],
        {},
        (1, (0, 0), -5),
        (-4, 4),
    ),
}


def _node_case(op: str) -> tuple[onnx.ModelProto, list[np.ndarray], list[np.ndarray]]:
    """The one-node model, its in-range inputs and the same with one index out of range."""
    inputs, attrs, (position, where, value), _ = NODE_CASES[op]
    model = one_node_model(op, inputs, opset=18, **attrs)
    bad = [array.copy() for array in inputs]
    bad[position][where] = value
    return model, inputs, bad


def _with_negatives_wrapped(inputs: list[np.ndarray], op: str) -> list[np.ndarray]:
    """The inputs with every negative index replaced by index + size (what ONNX means by it)."""
    position = NODE_CASES[op][2][0]
    sizes = np.array(DATA.shape[:2] if op.endswith("ND") else DATA.shape[1])  # per index column, or the axis
    wrapped = [array.copy() for array in inputs]
    wrapped[position] = np.where(inputs[position] < 0, inputs[position] + sizes, inputs[position])
    return wrapped


@pytest.mark.parametrize("op", sorted(NODE_CASES))
@pytest.mark.parametrize("training", [False, True])
def test_node_indices_follow_onnx_ranges(op: str, training: bool) -> None:
    model, inputs, bad = _node_case(op)
    module, tensors = convert_model(model, inputs, training=training)
    expected = reference_outputs(model, inputs)
    data = tensors[0].clone().requires_grad_(training)
    got = module(data, *tensors[1:])[0]
    np.testing.assert_allclose(got.detach().numpy(), expected[0], rtol=1e-6)
    if training:
        got.sum().backward()
        positive = tensors[0].clone().requires_grad_(True)
        wrapped = [torch.from_numpy(a) for a in _with_negatives_wrapped(inputs, op)]
        module(positive, *wrapped[1:])[0].sum().backward()
        torch.testing.assert_close(data.grad, positive.grad)
    low, high = NODE_CASES[op][3]
    value = NODE_CASES[op][2][2]
    with pytest.raises(
        IndexRangeError, match=rf"{op} node .*input 'in1'.* holds {value}, outside the valid range \[{low}, {high}\)"
    ):
        module(*[torch.from_numpy(a) for a in bad])


@pytest.mark.compile
@pytest.mark.parametrize("op", ["GatherND", "ScatterElements"])
def test_compiled_node_indices_follow_onnx_ranges(op: str) -> None:
    model, inputs, bad = _node_case(op)
    module, tensors = convert_model(model, inputs)
    compiled = torch.compile(lambda *args: module(*args), fullgraph=True, dynamic=False)  # as the engine calls it
    np.testing.assert_allclose(compiled(*tensors)[0].numpy(), reference_outputs(model, inputs)[0], rtol=1e-6)
    with pytest.raises(RuntimeError, match=rf"{op} node .*input 'in1'.* holds a value outside the valid range"):
        compiled(*[torch.from_numpy(a) for a in bad])


CUDA_SCRIPT = """
import sys
import json
import numpy as np, torch
from tests.unit.adapters.test_index_ranges import _node_case
from tests.helpers.adapter_harness import convert_model
model, inputs, bad = _node_case("GatherND")
module, tensors = convert_model(model, inputs)
module = module.to("cuda")
print(json.dumps(module(*[t.cuda() for t in tensors])[0].cpu().numpy().tolist()), flush=True)
module(*[torch.from_numpy(a).cuda() for a in bad])
torch.cuda.synchronize()
"""


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_on_cuda_an_index_out_of_range_stops_with_a_device_side_assert() -> None:
    """On CUDA the check runs on the device (no host synchronisation): a bad index fails the process's
    CUDA work with a device-side assert, raised as a RuntimeError at the next synchronisation."""
    process = subprocess.run(
        [sys.executable, "-c", CUDA_SCRIPT],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        cwd=Path(__file__).parents[3],
    )
    model, inputs, _ = _node_case("GatherND")
    first_line = process.stdout.splitlines()[0]
    np.testing.assert_allclose(np.array(json.loads(first_line)), reference_outputs(model, inputs)[0], rtol=1e-6)
    assert process.returncode != 0
    assert "device-side assert" in process.stderr


@pytest.mark.slow  # imports transformers
def test_a_sequence_past_gpt2_positions_names_the_inputs_and_the_table_size(tmp_path: Path) -> None:
    """Eager: 12 tokens into a GPT-2 of 8 positions fails while the graph is specialised for that shape. The
    error is an index error naming the inputs' shapes and the position table's size, not a conversion failure."""
    from tests.helpers.lora_models import TOKENS, tiny_lm

    generate_artifacts(
        tiny_lm("gpt2"),
        example_inputs=(torch.zeros(2, TOKENS, dtype=torch.int64),),
        input_names=["tokens"],
        output_names=["logits"],
        dynamic_axes={"tokens": {0: "batch", 1: "sequence"}, "logits": {0: "rows"}},
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path,
    )
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = Module(tmp_path / "training_model.onnx", state, tmp_path / "eval_model.onnx")
    tokens = np.zeros((2, TOKENS + 4), np.int64)
    with pytest.raises(IndexRangeError) as caught:
        module(tokens, np.zeros(2 * (TOKENS + 4), np.int64))
    message = str(caught.value)
    assert "cannot convert" not in message, message
    assert f"'tokens' [2, {TOKENS + 4}]" in message and f"outside the valid range [-{TOKENS}, {TOKENS})" in message
    assert f"a position table that holds {TOKENS} positions" in message
    assert caught.value.value == TOKENS + 3 and caught.value.valid == (-TOKENS, TOKENS)
    assert np.isfinite(float(module(tokens[:, :TOKENS], np.zeros(2 * TOKENS, np.int64))))  # a fitting one trains


@pytest.mark.compile
def test_a_compiled_range_check_over_a_dynamic_axis_keeps_the_axis_dynamic():
    """Indices checked against a dynamic axis's size (a Gather over batch x length rows) compile once for
    every size: the in-graph message does not write the size out (that would fix the axis to it)."""
    from torch._dynamo.utils import counters

    from ort_torch_train.adapters.index_checks import wrapped_indices

    def gather(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        return x.flatten()[wrapped_indices(indices, x.numel(), "Gather node 'g'", "input 'indices'")]

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(gather, backend="eager", fullgraph=True, dynamic=False)
    indices = torch.tensor([0, -1, 3])
    for shape in [(2, 6), (2, 5), (3, 7)]:
        x = torch.randn(shape)
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(x, 1)
        assert torch.equal(compiled(x, indices), gather(x, indices))
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.compile
def test_a_compiled_range_check_over_a_bounded_dynamic_size_keeps_the_axis_dynamic():
    """A size torch knows an upper bound of (rows of a table cut to the dynamic length, as MoE's index_add
    into a narrowed buffer) is still no constant: the message does not write it, and the axis stays
    dynamic; the constant bound of the other check is written."""
    from torch._dynamo.utils import counters

    from ort_torch_train.adapters.index_checks import wrapped_indices

    table = torch.zeros(16)

    def scatter(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        rows = table.narrow(0, 0, x.shape[0])
        checked = wrapped_indices(indices, table.shape[0], "Gather", "input 'i'")
        return rows.index_add(0, wrapped_indices(checked, rows.shape[0], "ScatterElements", "input 'i'"), x[:2])

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(scatter, backend="eager", fullgraph=True, dynamic=False)
    indices = torch.tensor([0, 3])
    for length in (8, 5, 12):
        x = torch.randn(length)
        torch._dynamo.mark_dynamic(x, 0)
        assert torch.equal(compiled(x, indices), scatter(x, indices))
    assert counters["stats"]["unique_graphs"] == 1
    with pytest.raises(RuntimeError, match=r"ScatterElements: input 'i' holds a value outside the valid range of its"):
        compiled(torch.randn(6), torch.tensor([0, 9]))
    with pytest.raises(RuntimeError, match=r"Gather: input 'i' holds a value outside the valid range \[-16, 16\)"):
        compiled(torch.randn(6), torch.tensor([0, 16]))
