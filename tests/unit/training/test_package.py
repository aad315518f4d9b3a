"""Packages of steps (issue 51, items 1 and 3): ``ort-torch-train package`` compiles the mlp fixture's train, eval
and optimizer steps ahead of time; ``Module(compile="package:DIR")`` trains through them with no compilation, as
the eager run does; a package built for other artifacts, another torch or another CPU is refused, naming which."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from torch._dynamo.utils import counters

from ort_torch_train.api import Module, Optimizer
from ort_torch_train.errors import InputError, PackageError
from ort_torch_train.native.packaged_build import libtorch_flags
from ort_torch_train.optim.engine import OptimizerEngine
from ort_torch_train.optim.float32 import to_float32
from ort_torch_train.optim.optimizer_model import read_optimizer_model
from ort_torch_train.state.training_state import TrainingState
from ort_torch_train.training.options import EngineOptions
from ort_torch_train.training.package.manifest import MANIFEST
from ort_torch_train.training.package.packaged import PackagedSteps, PackageFolder
from tests.helpers.corpus import Case
from tests.helpers.packaged import fixture_package
from tests.helpers.paths import FIXTURES, ROOT
from tests.helpers.timeouts import scaled

CASE = "mlp_ce_adamw_sched"
STEPS = 5
ACCUMULATED = 1  # the step after which neither the optimizer steps nor the gradients reset: the next adds to them


def _case(name: str = CASE) -> Case:
    if not (FIXTURES / name / "expected.json").is_file():
        pytest.skip(f"fixture {name} not present")
    return Case(FIXTURES / name)


@pytest.fixture(scope="session")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The mlp fixture's package, built by the command line (once per test run, shared with the tests of the
    runtime with no Python)."""
    return fixture_package(tmp_path_factory, CASE)


def _run(case: Case, compile: bool | str) -> tuple[list[float], float, dict[str, np.ndarray], bytes, list[float]]:
    """Losses, eval loss, parameters and checkpoint bytes after STEPS steps (one accumulating), and the losses
    of a last partial batch of 3 in train and eval mode."""
    module = Module(
        case.artifact("training_model.onnx"), case.load_state(), case.artifact("eval_model.onnx"), compile=compile
    )
    optimizer = Optimizer(case.artifact("optimizer_model.onnx"), module)
    losses = []
    for step in range(STEPS):
        optimizer.set_learning_rate(case.lr_before(step))
        losses.append(float(module(*case.train_inputs(step))))
        if step != ACCUMULATED:
            optimizer.step()
            module.lazy_reset_grad()
    partial = [float(module(*(array[:3] for array in case.train_inputs(STEPS))))]
    module.eval()
    eval_loss = float(module(*case.eval_inputs()))
    partial.append(float(module(*(array[:3] for array in case.eval_inputs()))))
    params = {name: p.detach().numpy().copy() for name, p in module.named_parameters()}
    checkpoint = module.training_state.to_bytes(include_optimizer_state=True)
    return losses, eval_loss, params, checkpoint, partial


@pytest.mark.compile
@pytest.mark.slow
def test_packaged_module_trains_as_eager_does_without_compiling(
    package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = _case()
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where libtorch's loader would unpack a program archive
    manifest = json.loads((package / MANIFEST).read_text())
    assert sorted(p.name for p in package.iterdir()) == sorted(
        [MANIFEST, "native_steps.txt", "train_step", "eval_step", "optimizer_step"]
        + ["export_0.onnx", "export_0"]  # the inference export of `logits` the runtime with no Python writes
    )
    assert all((package / name).is_dir() for name in ("train_step", "eval_step", "optimizer_step", "export_0"))
    assert [entry["shape"] for entry in manifest["train"]["inputs"]] == [[None, 20], [None]]  # the batch is dynamic
    eager = _run(case, False)
    frames = counters["frames"]["total"]
    packaged = _run(case, f"package:{package}")
    assert counters["frames"]["total"] == frames  # no torch.compile frame: nothing compiles
    loaded = Module(case.artifact("training_model.onnx"), case.load_state(), compile=f"package:{package}")
    assert loaded.training_state is not None and not any(tmp_path.iterdir())  # programs run in place: none unpacked
    np.testing.assert_allclose(packaged[0], eager[0], rtol=0, atol=1e-6)
    assert packaged[1] == pytest.approx(eager[1], abs=1e-6)
    np.testing.assert_allclose(packaged[4], eager[4], rtol=0, atol=1e-6)
    for name, value in eager[2].items():
        np.testing.assert_allclose(packaged[2][name], value, rtol=0, atol=1e-6, err_msg=name)
    # the checkpoints hold the same records in the same layout; their values agree to 1e-6 (fused kernels round
    # the last bit of some sums otherwise than ATen's)
    assert len(packaged[3]) == len(eager[3])
    saved, reference = TrainingState.load(packaged[3]), TrainingState.load(eager[3])
    assert saved.optimizer is not None and reference.optimizer is not None
    assert saved.optimizer.step == reference.optimizer.step == STEPS - 1
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(saved.state_dict()[name], value, rtol=0, atol=1e-6)


@pytest.mark.compile
@pytest.mark.slow
def test_packaged_optimizer_step_is_the_eager_update(package: Path) -> None:
    case = _case()
    spec = read_optimizer_model(case.artifact("optimizer_model.onnx"))
    states = [TrainingState.load(case.artifact("checkpoint")) for _ in range(2)]
    names = [n for n in states[0].params if states[0].params[n].requires_grad]
    generator = torch.Generator().manual_seed(0)
    grads = [torch.randn(states[0].params[n].shape, generator=generator) for n in names]
    engines = [OptimizerEngine(spec, state, names) for state in states]
    for state, engine in zip(states, engines):
        engine.set_learning_rate(0.01)
        for name, grad in zip(names, grads):
            state.params[name].grad.copy_(grad)
    engines[0].step()
    engine, state = engines[1], states[1]
    assert states[0].optimizer is not None and state.optimizer is not None
    steps = PackagedSteps(package, onnx.load(case.artifact("training_model.onnx")), None, state.params, names)
    update = steps.bind_update(state, onnx.load(case.artifact("optimizer_model.onnx")))
    assert update is not None
    update(engine.next_step_scalars())
    engine.count_step()
    assert state.optimizer.step == states[0].optimizer.step == 1
    for name in names:
        torch.testing.assert_close(state.params[name], states[0].params[name], rtol=0, atol=1e-6)
        held, reference = state.optimizer.momentums[name], states[0].optimizer.momentums[name]
        assert sorted(held) == sorted(reference) and held
        for moment, value in reference.items():
            torch.testing.assert_close(held[moment], value, rtol=0, atol=1e-6, msg=f"{name} {moment}")


@pytest.mark.compile
@pytest.mark.slow
def test_packaged_steps_see_the_state_replaced_behind_their_back(package: Path) -> None:
    """The train and optimizer programs take the state's tensors assembled once: parameters and gradients replaced
    between steps (``param.data = ...``, ``param.grad = ...``), or copied in, are what the next steps train, as in
    the eager run; the Optimizer runs the package's update only where it was built from the same optimizer model."""
    case = _case()
    optimizer_model = onnx.load(case.artifact("optimizer_model.onnx"))

    def train(compile: bool | str) -> tuple[list[float], dict[str, np.ndarray]]:
        module = Module(
            case.artifact("training_model.onnx"), case.load_state(), case.artifact("eval_model.onnx"), compile=compile
        )
        optimizer = Optimizer(case.artifact("optimizer_model.onnx"), module)
        losses = []
        for step in range(6):
            if step == 2:
                for param in module.training_state.params.values():
                    param.data = param.data * 0.5  # new storage: the programs' old arguments are stale
            if step == 3:
                for param in module.training_state.params.values():
                    if param.grad is not None:
                        param.grad = torch.ones_like(param)  # accumulated into by the next step (no reset before)
            if step == 4:
                module.copy_buffer_to_parameters(module.get_contiguous_parameters(trainable_only=True).numpy() * 2)
            losses.append(float(module(*case.train_inputs(step))))
            optimizer.step()
            if step != 2:
                module.lazy_reset_grad()
        return losses, {n: p.detach().numpy().copy() for n, p in module.training_state.params.items()}

    (eager_losses, eager), (losses, packaged) = train(False), train(f"package:{package}")
    np.testing.assert_allclose(losses, eager_losses, rtol=0, atol=1e-5)
    for name, value in eager.items():
        np.testing.assert_allclose(packaged[name], value, rtol=0, atol=1e-5, err_msg=name)

    module = Module(case.artifact("training_model.onnx"), case.load_state(), compile=f"package:{package}")
    assert module.update_program(optimizer_model) is not None
    other = onnx.ModelProto()
    other.CopyFrom(optimizer_model)
    other.doc_string = "another optimizer model"
    assert module.update_program(other) is None  # the Optimizer then runs its own kernel
    assert Module(case.artifact("training_model.onnx"), case.load_state()).update_program(optimizer_model) is None


@pytest.mark.compile
@pytest.mark.slow
def test_module_step_on_a_package_is_the_three_calls(package: Path) -> None:
    """``module.step(optimizer, ...)`` runs the train program, then the optimizer's, then resets the gradients: the
    same losses, parameters and step count, bit for bit, as ``module(...)``, ``optimizer.step()``,
    ``module.lazy_reset_grad()``, the learning rate changing at every step as a scheduler changes it."""
    case = _case()

    def train(one_call: bool) -> tuple[list[float], dict[str, np.ndarray], int]:
        module = Module(case.artifact("training_model.onnx"), case.load_state(), compile=f"package:{package}")
        optimizer = Optimizer(case.artifact("optimizer_model.onnx"), module)
        losses = []
        for step in range(4):
            optimizer.set_learning_rate(case.lr_before(step))
            if one_call:
                losses.append(float(module.step(optimizer, *case.train_inputs(step))))
            else:
                losses.append(float(module(*case.train_inputs(step))))
                optimizer.step()
                module.lazy_reset_grad()
        params = {n: p.detach().numpy().copy() for n, p in module.training_state.params.items()}
        assert module.training_state.optimizer is not None
        return losses, params, module.training_state.optimizer.step

    (three_losses, three, three_steps), (losses, stepped, steps) = train(False), train(True)
    assert losses == three_losses and steps == three_steps == 4
    for name, value in three.items():
        np.testing.assert_array_equal(stepped[name], value, err_msg=name)


def _edited(package: Path, folder: Path, **changes: object) -> Path:
    shutil.copytree(package, folder)
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest.update(changes)
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return folder


@pytest.mark.compile
@pytest.mark.slow
@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"torch": "1.0.0"}, "another torch version: '1.0.0'"),
        ({"machine": "riscv64"}, "another CPU architecture: 'riscv64'"),
        ({"cpu_capability": "NO_AVX"}, "another CPU: 'NO_AVX'"),
        ({"cpu_features": ["_is_quantum_supported"]}, "features this CPU lacks: ['_is_quantum_supported']"),
        ({"train": {"file": "../elsewhere", "inputs": [], "outputs": []}}, "leaves the folder"),
        (  # an older package: its optimizer program takes one tensor per parameter
            {"format": "ort-torch-train-package/2"},
            "is of format 'ort-torch-train-package/2', this version reads 'ort-torch-train-package/3'; rebuild the "
            "package",
        ),
    ],
)
def test_package_built_elsewhere_is_refused_naming_what_differs(
    package: Path, tmp_path: Path, changes: dict, named: str
) -> None:
    case = _case()
    folder = _edited(package, tmp_path / "edited", **changes)
    with pytest.raises((PackageError, ValueError), match=re.escape(named)):
        Module(case.artifact("training_model.onnx"), case.load_state(), compile=f"package:{folder}")


@pytest.mark.compile
@pytest.mark.slow
def test_package_of_other_artifacts_and_bad_inputs_are_refused(package: Path, tmp_path: Path) -> None:
    other = _case("mlp_frozen")
    with pytest.raises(PackageError, match="built from other artifacts: its training_model"):
        Module(other.artifact("training_model.onnx"), other.load_state(), compile=f"package:{package}")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PackageError, match="no manifest.json"):
        Module(_case().artifact("training_model.onnx"), _case().load_state(), compile=f"package:{tmp_path / 'empty'}")
    case = _case()
    module = Module(case.artifact("training_model.onnx"), case.load_state(), compile=f"package:{package}")
    x, y = case.train_inputs(0)
    with pytest.raises(
        InputError, match=r"input 'input': the package takes float32 \['any', 20\], got float32 \[8, 7\]"
    ):
        module(x[:, :7], y)
    with pytest.raises(InputError, match=r"input 'labels': the package takes int64 \['any'\], got int32"):
        module(x, y.astype(np.int32))
    loss = module(x, y)  # a signature checked once: the next calls check only what it does not hold
    assert module(np.asfortranarray(x), y) == loss  # not contiguous: checked in full, made contiguous
    with pytest.raises(
        InputError, match=r"input 'input': the package takes float32 \['any', 20\], got float32 \[8, 7\]"
    ):
        module(x[:, :7], y)
    with pytest.raises(InputError, match=r"TrainStep: expected 2 inputs \['input', 'labels'\], got 3"):
        module._engine.train_step([torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(y)])


@pytest.mark.compile
@pytest.mark.slow
def test_batchnorm_statistics_update_through_the_package(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The frozen parameters a forward updates (BatchNorm's running statistics) come back from the train step."""
    case = _case("bn_frozen_stats")
    out = fixture_package(tmp_path_factory, case.root.name)

    def train(compile: bool | str) -> tuple[list[float], dict[str, np.ndarray]]:
        module = Module(case.artifact("training_model.onnx"), case.load_state(), compile=compile)
        optimizer = Optimizer(case.artifact("optimizer_model.onnx"), module)
        losses = []
        for step in range(3):
            losses.append(float(module(*case.train_inputs(step))))
            optimizer.step()
            module.lazy_reset_grad()
        return losses, {n: p.detach().numpy().copy() for n, p in module.training_state.params.items()}

    (eager_losses, eager), (losses, packaged) = train(False), train(f"package:{out}")
    np.testing.assert_allclose(losses, eager_losses, rtol=0, atol=1e-6)
    statistics = [name for name in eager if "running" in name]
    assert statistics and all(
        not np.array_equal(eager[n], case.load_state().training_state.params[n]) for n in statistics
    )
    for name, value in eager.items():
        # BatchNorm cancels the gradient of the bias before it: AdamW turns its rounding noise into lr-sized steps
        # (as for compiled steps: test_compile.py)
        np.testing.assert_allclose(
            packaged[name], value, rtol=0, atol=1e-5 if name in statistics else 1e-4, err_msg=name
        )


def _tensor_record(tensor: torch.Tensor) -> bytes:
    """One tensor of the C++ program's run file: "dtype rank dims" and its raw bytes."""
    names = {torch.float32: "f32", torch.int64: "i64", torch.bool: "b8"}
    header = " ".join([names[tensor.dtype], str(tensor.dim()), *(str(n) for n in tensor.shape)])
    return header.encode() + b"\n" + tensor.contiguous().numpy().tobytes()


@pytest.mark.compile
@pytest.mark.slow
def test_a_cpp_program_trains_through_the_package_with_no_python(package: Path, tmp_path: Path) -> None:
    """Item 2's foundation: libtorch's C++ loader runs the package's train and optimizer steps in a process with
    no libpython, to 1e-6 of the Python eager run."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    case = _case()
    compile_flags, link_flags = libtorch_flags()
    program = tmp_path / "packaged_steps"
    source = ROOT / "tests" / "native" / "packaged_steps.cpp"
    build = [compiler, "-std=c++20", "-O1", *compile_flags, str(source), "-o", str(program), *link_flags]
    subprocess.run(build, check=True, capture_output=True, timeout=scaled(300))

    module = Module(case.artifact("training_model.onnx"), case.load_state())
    optimizer = Optimizer(case.artifact("optimizer_model.onnx"), module)
    spec = read_optimizer_model(case.artifact("optimizer_model.onnx"))
    state = module.training_state
    names = module.trainable_parameter_names
    moments = spec.algorithm.updated_moments
    records = [f"count {len(names)}\n".encode(), *(_tensor_record(state.params[n].detach()) for n in names)]
    held = state.optimizer.momentums if state.optimizer is not None else {}
    records.append(f"count {len(moments)}\n".encode())
    for moment in moments:
        for name in names:
            value = held.get(name, {}).get(moment)
            records.append(_tensor_record(torch.zeros_like(state.params[name]) if value is None else value))
    records += [f"count {STEPS}\n".encode(), b"count 2\n"]
    losses = []
    for step in range(STEPS):
        learning_rate = case.lr_before(step)
        optimizer.set_learning_rate(learning_rate)
        inputs = case.train_inputs(step)
        hyperparameters = spec.hyperparameters.with_learning_rate(to_float32(learning_rate))
        scalars = torch.tensor(spec.algorithm.step_scalars(hyperparameters, step + 1), dtype=torch.float32)
        records += [*(_tensor_record(torch.from_numpy(np.asarray(a))) for a in inputs), _tensor_record(scalars)]
        losses.append(float(module(*inputs)))
        optimizer.step()
        module.lazy_reset_grad()
    run_file = tmp_path / "run.bin"
    run_file.write_bytes(b"".join(records))

    done = subprocess.run(
        [str(program), str(package), str(run_file)], capture_output=True, text=True, timeout=scaled(120)
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "libpython mapped: 0"
    native_losses = [float(line.split()[1]) for line in lines if line.startswith("loss ")]
    np.testing.assert_allclose(native_losses, losses, rtol=0, atol=1e-6)
    native_params = [np.array(line.split()[1:], dtype=np.float64) for line in lines if line.startswith("param ")]
    for name, values in zip(names, native_params, strict=True):
        expected = state.params[name].detach().numpy().reshape(-1)
        np.testing.assert_allclose(values, expected, rtol=0, atol=1e-6, err_msg=name)


def test_package_setting_is_checked_once() -> None:
    with pytest.raises(ValueError, match="names no folder"):
        EngineOptions.of(compile="package:")
    with pytest.raises(ValueError, match="a package runs on the CPU in float32"):
        EngineOptions.of(compile="package:somewhere", mixed_precision="bf16")
    options = EngineOptions.of(compile="package:somewhere")
    assert options.programs == PackageFolder(Path("somewhere")) and options.compile_arguments is None
