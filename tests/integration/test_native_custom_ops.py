"""Custom-op libraries through the C API: a library built here (tests/native/custom_op_library.c, two
OrtCustomOps) registered with RegisterCustomOpsLibrary_V2 and run by a training session on a path no
trainable parameter is upstream of, equal to a torch reference; exported and run by ONNX Runtime with the
same options; an op the gradient must flow through refused naming the op and the parameter; a library that
cannot be loaded, or has no RegisterCustomOps, refused with a status."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ort_torch_train.api import CheckpointState
from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts
from tests.helpers.native import PROGRAMS, NativeBuild, build_native
from tests.helpers.timeouts import scaled

ALPHA, SHIFT = 0.5, 1
X = (np.arange(12) % 7 * 0.25 - 0.5).astype(np.float32).reshape(4, 3)  # what custom_ops.c feeds
TARGET = (np.arange(8) % 3 * 0.5).astype(np.float32).reshape(4, 2)


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> NativeBuild:
    return build_native(tmp_path_factory)


def compile_library(native: NativeBuild, source: Path, output: Path) -> Path:
    command = [native.compiler, "-std=c11", "-O1", "-Wall", "-shared", "-fPIC", *native.flags.cflags]
    done = subprocess.run(
        [*command, str(source), "-o", str(output)], capture_output=True, text=True, timeout=scaled(120)
    )
    assert done.returncode == 0, done.stderr
    return output


@pytest.fixture(scope="module")
def library(native: NativeBuild, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("custom_op_library")
    return compile_library(native, PROGRAMS / "custom_op_library.c", folder / "libott_test_ops.so")


def artifacts(folder: Path, custom_after_parameters: bool, shift: bool = True) -> Path:
    """Artifacts of y = (-ScaledSquare(x)) @ W + B (the custom ops upstream of every parameter), or of
    y = ScaledSquare(x @ W + B); made from standard stand-ins, then the stand-ins become the custom ops
    (ScaledSquare without its shift attribute unless ``shift``)."""
    nodes = (
        [
            helper.make_node("MatMul", ["x", "W"], ["mm"], name="matmul"),
            helper.make_node("Add", ["mm", "B"], ["h"], name="add"),
            helper.make_node("Mul", ["h", "h"], ["y"], name="square"),
        ]
        if custom_after_parameters
        else [
            helper.make_node("Mul", ["x", "x"], ["s"], name="square"),
            helper.make_node("Neg", ["s"], ["n"], name="negate"),
            helper.make_node("MatMul", ["n", "W"], ["mm"], name="matmul"),
            helper.make_node("Add", ["mm", "B"], ["y"], name="add"),
        ]
    )
    rng = np.random.default_rng(0)
    initializers = [
        onnx.numpy_helper.from_array(rng.standard_normal((3, 2)).astype(np.float32), "W"),
        onnx.numpy_helper.from_array(rng.standard_normal(2).astype(np.float32), "B"),
    ]
    graph = helper.make_graph(
        nodes,
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 2])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    generate_artifacts(
        model,
        requires_grad=["W", "B"],
        loss=LossType.MSELoss,
        optimizer=OptimType.SGD,
        artifact_directory=folder,
        additional_output_names=["y"],
    )
    for name in ("training_model.onnx", "eval_model.onnx"):
        trained = onnx.load(folder / name)
        for node in trained.graph.node:
            if node.name in ("square", "negate"):
                node.domain = "ott.test"
                node.op_type = "ScaledSquare" if node.name == "square" else "Negate"
                del node.input[1:]
                if node.name == "square":
                    node.attribute.append(helper.make_attribute("alpha", ALPHA))
                    node.attribute.extend([helper.make_attribute("shift", SHIFT)] if shift else [])
        trained.opset_import.append(helper.make_opsetid("ott.test", 1))
        onnx.save(trained, folder / name)
    return folder


def values(lines: list[str], label: str) -> np.ndarray:
    found = [line.split()[len(label.split()) :] for line in lines if line.startswith(label + " ")]
    assert len(found) == 1, (label, lines)
    return np.array([float(value) for value in found[0]], dtype=np.float32)


def reference(weights: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, float]:
    y = -(ALPHA * X * X + SHIFT) @ weights + bias
    return y, float(np.mean((y - TARGET) ** 2))


def test_a_registered_library_runs_in_training_eval_and_onnx_runtime(
    native: NativeBuild, library: Path, tmp_path: Path
) -> None:
    folder = artifacts(tmp_path / "artifacts", custom_after_parameters=False)
    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    initial = {name: state.parameters[name].data for name in ("W", "B")}
    done = native.run(native.program(PROGRAMS / "custom_ops.c"), "train", str(library), str(folder), str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    losses = [float(line.split()[2]) for line in lines if line.startswith("loss ")]
    assert len(losses) == 5 and losses[-1] < losses[0]
    assert losses[0] == pytest.approx(reference(initial["W"], initial["B"])[1], rel=1e-6)

    params = values(lines, "params")
    weights, bias = params[:6].reshape(3, 2), params[6:]
    y, loss = reference(weights, bias)
    assert values(lines, "eval 0")[0] == pytest.approx(loss, rel=1e-6)
    np.testing.assert_allclose(values(lines, "eval 1").reshape(4, 2), y, rtol=1e-6, atol=1e-6)
    # the exported model, run by ONNX Runtime's own session on the kernels the same options registered
    np.testing.assert_allclose(values(lines, "inference").reshape(4, 2), y, rtol=1e-6, atol=1e-6)


def test_an_op_the_gradient_must_flow_through_is_refused_naming_it(
    native: NativeBuild, library: Path, tmp_path: Path
) -> None:
    folder = artifacts(tmp_path / "artifacts", custom_after_parameters=True)
    done = native.run(native.program(PROGRAMS / "custom_ops.c"), "create", str(library), str(folder))
    assert done.returncode == 0, done.stdout + done.stderr
    status = done.stdout.splitlines()[-1]
    assert status.startswith("status 9 ")  # ORT_NOT_IMPLEMENTED
    assert "ott.test::ScaledSquare (node 'square') has no gradient" in status and "parameter 'W'" in status


def test_a_library_that_cannot_register_gets_a_status(native: NativeBuild, tmp_path: Path) -> None:
    program = native.program(PROGRAMS / "custom_ops.c")
    missing = native.run(program, "register", str(tmp_path / "absent.so"))
    assert missing.returncode == 0, missing.stderr
    assert missing.stdout.startswith("status 1 ") and "absent.so cannot be loaded" in missing.stdout
    source = tmp_path / "unrelated.c"
    source.write_text("int unrelated(void) { return 0; }\n")
    unrelated = compile_library(native, source, tmp_path / "libunrelated.so")
    refused = native.run(program, "register", str(unrelated))
    assert refused.stdout.startswith("status 2 ") and "has no function RegisterCustomOps" in refused.stdout


def test_a_kernel_that_fails_gives_the_step_its_status(native: NativeBuild, library: Path, tmp_path: Path) -> None:
    folder = artifacts(tmp_path / "artifacts", custom_after_parameters=False, shift=False)
    done = native.run(native.program(PROGRAMS / "custom_ops.c"), "train", str(library), str(folder), str(tmp_path))
    assert done.returncode == 1 and "TrainStep" in done.stderr
    assert "the custom op's CreateKernel failed: No attribute with name:'shift' is defined." in done.stderr
    assert "Traceback" not in done.stderr
