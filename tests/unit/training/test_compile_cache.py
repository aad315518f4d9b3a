"""save/load_compile_cache: a missing file is 'nothing cached yet', a foreign file a clear error."""

import logging
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree

from ort_torch_train.api import Module
from ort_torch_train.errors import InputError
from ort_torch_train.training.compile import precompiled
from ort_torch_train.training.compile.cache import _MAGIC, load_compile_cache, save_compile_cache
from tests.helpers.corpus import Case
from tests.helpers.paths import FIXTURES, ROOT


@pytest.fixture(autouse=True)
def _precompiling_stays_in_the_test(monkeypatch):
    """load_compile_cache switches precompiling on for the process: off again for the next tests."""
    from torch._inductor import config

    monkeypatch.setattr(precompiled, "_steps", None)
    with config.patch({"cpp.vec_isa_ok": config.cpp.vec_isa_ok}):
        yield


def test_a_missing_cache_file_loads_nothing(tmp_path):
    assert load_compile_cache(tmp_path / "compile.cache") is False


def test_a_file_that_is_not_a_compile_cache_is_rejected_by_name(tmp_path):
    path = tmp_path / "compile.cache"
    path.write_bytes(b"not a cache")
    with pytest.raises(InputError, match="compile.cache"):
        load_compile_cache(path)


def test_saving_with_nothing_compiled_writes_a_loadable_file_or_nothing(tmp_path):
    path = tmp_path / "compile.cache"
    written = save_compile_cache(path)
    assert (written == 0 and not path.exists()) or (path.stat().st_size == written and load_compile_cache(path))


def _train_in_a_process(case_dir: Path, cache: Path, out: Path, env: dict, *extra: str) -> tuple[dict, str]:
    command = [
        sys.executable,
        "-m",
        "tests.helpers.precompile_worker",
        str(case_dir),
        str(cache),
        str(out),
        *extra,
    ]
    result = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    with np.load(out) as saved:
        return {key: saved[key] for key in saved.files}, result.stderr


@pytest.mark.compile
def test_a_saved_step_loads_in_a_new_process_and_trains_bitwise_alike(mlp_case, tmp_path):
    """A second process with an empty inductor cache dir (a new machine, a fresh /tmp) loads the train
    step and the eval graph instead of tracing them, builds no C++ library (the file carries them) and
    trains and evaluates bit for bit like the first; a saved step that does not load is compiled again
    (logged), with the same results."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    cache = tmp_path / "compile.cache"
    first, _ = _train_in_a_process(mlp_case.root, cache, tmp_path / "first.npz", env)
    assert cache.is_file() and first["library_builds"] > 0
    empty_dir = {**env, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "empty-inductor")}
    second, log = _train_in_a_process(mlp_case.root, cache, tmp_path / "second.npz", empty_dir)
    assert "loaded the saved train step" in log and "loaded the saved eval graph" in log
    assert "restored" in log and second["library_builds"] == 0, log
    for name in ("losses", "params", "evaluated"):
        np.testing.assert_array_equal(second[name], first[name])

    content = pickle.loads(cache.read_bytes()[len(_MAGIC) :])
    content["steps"] = {key: b"not a step" for key in content["steps"]}
    cache.write_bytes(_MAGIC + pickle.dumps(content))
    third, log = _train_in_a_process(mlp_case.root, cache, tmp_path / "third.npz", env)
    assert "saved train step" in log and "saved eval graph" in log and "loaded the saved" not in log
    assert log.count("does not load") == 2 and "compiling it again" in log
    for name in ("losses", "params", "evaluated"):
        np.testing.assert_array_equal(third[name], first[name])


def _cache_with_libraries(path: Path, platform_: tuple, libraries: dict[str, bytes]) -> Path:
    content = {
        "torch": torch.__version__,
        "artifacts": None,
        "steps": {},
        "vec_isa": None,
        "libraries": (platform_, libraries),
    }
    path.write_bytes(_MAGIC + pickle.dumps(content))
    return path


def test_saved_libraries_are_written_only_into_the_cache_dir_and_only_on_their_platform(tmp_path, monkeypatch, caplog):
    from ort_torch_train.training.compile.cache import _library_platform

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    here = _library_platform()
    caplog.set_level(logging.INFO, logger="ort_torch_train.training.compile.cache")
    assert load_compile_cache(_cache_with_libraries(tmp_path / "a.cache", here, {"ab/cabc.main.so": b"\x7fELF"}))
    assert (tmp_path / "inductor" / "ab" / "cabc.main.so").read_bytes() == b"\x7fELF"
    assert "restored 1 compiled libraries" in caplog.text

    elsewhere = (*here[:-1], ["_is_some_other_cpu_supported"])
    assert load_compile_cache(_cache_with_libraries(tmp_path / "b.cache", elsewhere, {"cd/ccd.so": b"\x7fELF"}))
    assert not (tmp_path / "inductor" / "cd").exists() and "building them anew" in caplog.text

    for escaping in ("../outside.so", "/abs/lib.so", "ab/../../x.so"):
        with pytest.raises(InputError, match="b.cache.*not of the form <dir>/<file>"):
            load_compile_cache(_cache_with_libraries(tmp_path / "b.cache", here, {escaping: b"x"}))
    assert not (tmp_path / "outside.so").exists()


@pytest.mark.compile
def test_a_saved_bf16_step_of_a_compile_mode_loads_and_trains_bitwise_alike(mlp_case, tmp_path):
    """Mixed-precision steps and ``compile=<mode>`` steps and eval graphs (the mode's inductor options)
    are precompiled too; the saved step is not used for a float32 ``compile=True`` one."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    cache = tmp_path / "compile.cache"
    settings = ("--mixed-precision", "bf16", "--mode", "max-autotune")
    first, _ = _train_in_a_process(mlp_case.root, cache, tmp_path / "first.npz", env, *settings)
    second, log = _train_in_a_process(mlp_case.root, cache, tmp_path / "second.npz", env, *settings)
    assert "loaded the saved train step" in log and "loaded the saved eval graph" in log
    for name in ("losses", "params", "evaluated"):
        np.testing.assert_array_equal(second[name], first[name])
    _, log = _train_in_a_process(mlp_case.root, cache, tmp_path / "float32.npz", env)
    assert "no saved train step for this model" in log and "loaded the saved" not in log


def test_a_cache_of_another_torch_version_is_ignored_with_a_log_line(tmp_path, caplog):
    path = tmp_path / "compile.cache"
    path.write_bytes(_MAGIC + pickle.dumps({"torch": "1.0.0", "artifacts": b"?", "steps": {"k": b"?"}}))
    with caplog.at_level(logging.WARNING):
        assert load_compile_cache(path) is False
    assert "torch 1.0.0" in caplog.text


def _converted(case, batch: int) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    module = Module(case.artifact("training_model.onnx"), case.load_state(), case.artifact("eval_model.onnx"))
    inputs = [torch.from_numpy(np.ascontiguousarray(a[:batch])) for a in case.train_inputs(0)]
    return module.train_graph.specialised(
        inputs, [module.training_state.params[n] for n in module.train_layout.params], "key", lambda m, _: m
    ), inputs


def test_a_saved_step_is_found_only_for_the_same_model_update_and_signature(mlp_case):
    """The key a saved step is stored under: equal for a rebuilt module, different for another batch
    size, another model or another update (those compile, their guards being partly left out)."""
    module, inputs = _converted(mlp_case, 4)
    key = precompiled.step_key(module, ("adamw",), inputs)
    assert precompiled.step_key(*_converted(mlp_case, 4)[:1], ("adamw",), _converted(mlp_case, 4)[1]) == key
    assert precompiled.step_key(module, ("sgd",), inputs) != key
    assert precompiled.step_key(*_converted(mlp_case, 2)[:1], ("adamw",), _converted(mlp_case, 2)[1]) != key
    other = Case(FIXTURES / "l1")  # another loss (mlp_frozen: the same graph, its plan differs)
    assert precompiled.step_key(*_converted(other, 4)[:1], ("adamw",), _converted(other, 4)[1]) != key


def test_a_saved_step_is_found_only_for_the_same_gradient_reduction(mlp_case):
    """A data-parallel step's key names its group and world size: a step saved without the all-reduce
    (one process, or inside ``no_sync``) or for another group or world is not loaded for it."""
    import torch.distributed as dist

    from ort_torch_train.distributed.data_parallel import GradientAverage

    module, inputs = _converted(mlp_case, 4)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        world, other_group = dist.group.WORLD, dist.new_group([0])
        keys = [
            precompiled.step_key(module, ("adamw", reduction), inputs)
            for reduction in (
                None,
                GradientAverage(world, 1),
                GradientAverage(world, 2),
                GradientAverage(other_group, 1),
            )
        ]
        assert len(set(keys)) == 4
        assert precompiled.step_key(module, ("adamw", GradientAverage(world, 1)), inputs) == keys[1]
    finally:
        dist.destroy_process_group()


@pytest.mark.compile
def test_the_eval_graph_is_precompiled_only_without_autograd(mlp_case):
    """A differentiable eval-mode forward (parameters requiring grad) compiles without precompiling and
    keeps its gradients; the eval step (no grad) is precompiled for saving."""
    precompiled.enable({})
    module = Module(
        mlp_case.artifact("training_model.onnx"),
        mlp_case.load_state(),
        mlp_case.artifact("eval_model.onnx"),
        compile=True,
    )
    module.eval()
    inputs = mlp_case.eval_inputs()
    loss = module.forward(*[torch.from_numpy(a) for a in inputs])
    loss.backward()
    assert precompiled.saved_steps() == {}
    assert all(parameter.grad is not None for parameter in module.parameters() if parameter.requires_grad)
    evaluated = module(*inputs)
    assert len(precompiled.saved_steps()) == 1
    np.testing.assert_allclose(evaluated, loss.detach().numpy(), rtol=1e-6)


@pytest.mark.compile
def test_a_precompiled_steps_guards_accept_its_inputs_and_reject_others(caplog):
    """The guards of a precompiled step, checked from its closure and arguments by position, pass the
    inputs it was compiled for (also after a new pytree registration) and reject a new shape or constant,
    which run torch.compile's step."""
    weight = torch.randn(3, 4)

    def step(x, scale, *rest):  # torch.func.grad, as in the train steps (its pytree flattening is guarded)
        return torch.func.grad(lambda w: ((x @ w.T) * scale).square().sum())(weight) + sum(rest)

    x, bias = torch.randn(2, 4), torch.randn(4)
    guarded = precompiled.precompiled_step(
        step, torch.nn.Module(), (), {}, (x, 2.0, bias), {}, torch.compile(step, fullgraph=True, dynamic=False)
    )
    torch.testing.assert_close(guarded(x, 2.0, bias), step(x, 2.0, bias))

    class Registered:  # a library registering its classes (transformers does) leaves the step's guards alone
        pass

    pytree.register_pytree_node(Registered, lambda value: ([], None), lambda children, context: Registered())
    torch.testing.assert_close(guarded(x, 2.0, bias), step(x, 2.0, bias))
    assert not guarded.rejected
    with caplog.at_level(logging.WARNING):
        for args in ((torch.randn(5, 4), 2.0, bias), (x, 3.0, bias), (x, 2.0, bias, bias)):
            torch.testing.assert_close(guarded(*args), step(*args))
    assert guarded.rejected and caplog.text.count("guards reject these inputs") == 1
