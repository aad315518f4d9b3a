"""The compile cache: a per-user directory of signed entries that loads only what this user's cache wrote."""

import json
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
from ort_torch_train.state.training_state import TrainingState
from ort_torch_train.training.compile import cache as cache_module
from ort_torch_train.training.compile import precompiled
from ort_torch_train.training.compile.cache import (
    ProcessCompileCaches,
    compile_cache_for,
    load_compile_cache,
    process_caches,
    save_compile_cache,
)
from ort_torch_train.training.compile.cache_entries import CompileCache
from ort_torch_train.training.compile.cache_store import (
    CacheStore,
    default_cache_dir,
    platform_fingerprint,
    step_fingerprint,
)
from ort_torch_train.training.options import EngineOptions
from tests.helpers.corpus import Case
from tests.helpers.paths import FIXTURES, ROOT
from tests.helpers.timeouts import scaled


@pytest.fixture(autouse=True)
def _the_cache_stays_in_the_test(monkeypatch):
    """A process record of compile caches of the test's own: the directory load_compile_cache chooses and
    the steps recorded stay in the test."""
    from torch._inductor import config

    monkeypatch.setattr(cache_module, "_PROCESS_CACHES", ProcessCompileCaches())
    with config.patch({"cpp.vec_isa_ok": config.cpp.vec_isa_ok}):
        yield


class Marker:
    """A pickle that, once unpickled, creates the file ``path``: what a crafted cache file could do."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


# ---- the directory, its key and its entries ---------------------------------------------------------
def test_the_default_directory_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("ORT_TORCH_TRAIN_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "ort_torch_train"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == Path.home() / ".cache" / "ort_torch_train"
    monkeypatch.setenv("ORT_TORCH_TRAIN_CACHE_DIR", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"
    assert compile_cache_for().store.directory == tmp_path / "mine"  # type: ignore[union-attr]
    assert compile_cache_for(False) is None
    monkeypatch.setenv("ORT_TORCH_TRAIN_CACHE_DIR", "off")
    assert default_cache_dir() is None and compile_cache_for() is None


def _compiled_module(case, **options) -> Module:
    return Module(case.artifact("training_model.onnx"), case.load_state(), compile=True, **options)


def test_a_module_option_names_the_cache_or_switches_it_off_for_that_module(mlp_case, tmp_path):
    """Each Module's engine holds the cache its option names; ``load_compile_cache`` chooses the directory
    of the Modules built later without one."""
    named = _compiled_module(mlp_case, compile_cache=tmp_path / "cache")
    assert named._engine.compile_cache.store.directory == tmp_path / "cache"  # type: ignore[union-attr]
    assert _compiled_module(mlp_case, compile_cache=False)._engine.compile_cache is None
    assert named._engine.compile_cache.store.directory == tmp_path / "cache"  # type: ignore[union-attr]
    assert _compiled_module(mlp_case)._engine.compile_cache is None  # the suite's default: off
    load_compile_cache(tmp_path / "chosen")
    assert _compiled_module(mlp_case)._engine.compile_cache.store.directory == tmp_path / "chosen"  # type: ignore[union-attr]
    assert (
        _compiled_module(mlp_case, compile_cache=tmp_path / "cache")._engine.compile_cache
        is named._engine.compile_cache
    )
    assert Module(mlp_case.artifact("training_model.onnx"), mlp_case.load_state())._engine.compile_cache is None
    for bad in ("", 3, True):
        with pytest.raises(ValueError, match="compile_cache"):
            EngineOptions.of(compile=True, compile_cache=bad)


def test_the_directory_and_key_are_private_and_entries_read_back(tmp_path):
    store = CacheStore(tmp_path / "cache")
    assert (tmp_path / "cache").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "cache" / "key").stat().st_mode & 0o777 == 0o600
    path = store.write("step", "k", "f", b"payload", {"libraries": []})
    assert path.parent.parent == tmp_path / "cache" and path.stat().st_mode & 0o777 == 0o600
    assert CacheStore(tmp_path / "cache").read("step", "k", "f") == (
        {"libraries": [], "kind": "step", "key": "k", "fingerprint": "f"},
        b"payload",
    )
    assert store.read("step", "k", "another platform") is None and store.read("step", "other", "f") is None


def test_a_directory_or_key_others_can_write_or_read_is_refused(tmp_path, monkeypatch, caplog):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(InputError, match="shared.*can be written by others"):
        CacheStore(shared)
    monkeypatch.setenv("ORT_TORCH_TRAIN_CACHE_DIR", str(shared))  # the default one: only skipped
    with caplog.at_level(logging.WARNING):
        assert compile_cache_for() is None
    assert "compile cache off" in caplog.text
    CacheStore(tmp_path / "cache")
    (tmp_path / "cache" / "key").chmod(0o644)
    with pytest.raises(InputError, match="key can be read by others"):
        load_compile_cache(tmp_path / "cache")


def test_entry_files_others_can_write_links_and_foreign_files_are_refused(tmp_path, caplog):
    cache = CompileCache(CacheStore(tmp_path / "cache"))
    store, fingerprint = cache.store, step_fingerprint()
    path = store.write("step", "writable", fingerprint, b"x")
    path.chmod(0o666)
    store.path_of("step", "link", fingerprint).symlink_to(path)
    other = CacheStore(tmp_path / "another user's cache")  # signed with another key
    other.write("step", "foreign", fingerprint, b"x").rename(store.path_of("step", "foreign", fingerprint))
    store.write("step", "renamed", fingerprint, b"x").rename(store.path_of("step", "swapped", fingerprint))
    with caplog.at_level(logging.WARNING):
        for key in ("writable", "link", "foreign", "swapped"):
            assert cache.load_step(key, "train step") is None
    for reason in ("can be written by others", "symbolic link", "fails its signature", "holds the entry"):
        assert reason in caplog.text


def test_a_crafted_pickle_is_never_unpickled(tmp_path, caplog):
    """Neither an old-format cache file (the explicit call now takes a directory) nor a pickle put in
    place of an entry runs: they are refused before anything is unpickled."""
    marker = tmp_path / "marker"
    crafted = pickle.dumps({"torch": "1.0.0", "artifacts": Marker(marker), "steps": {}})
    old_file = tmp_path / "compile.cache"
    old_file.write_bytes(b"ort-torch-train compile cache 2\n" + crafted)
    with pytest.raises(InputError, match="compile.cache"):
        load_compile_cache(old_file)
    cache = CompileCache(CacheStore(tmp_path / "cache"))
    cache.store.path_of("step", "key", step_fingerprint()).write_bytes(crafted)
    with caplog.at_level(logging.WARNING):
        assert cache.load_step("key", "train step") is None
    assert "refused the saved train step" in caplog.text and "not a compile cache entry" in caplog.text
    assert not marker.exists()


def test_library_paths_stay_inside_the_inductor_cache_dir(tmp_path, monkeypatch, caplog):
    """A (signed) step naming libraries outside ``<dir>/<file>`` under inductor's cache dir writes none
    of them (``/<name>`` once wrote at the filesystem root); a library entry with a flipped bit is never
    installed there; a sound one is."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    cache = CompileCache(CacheStore(tmp_path / "cache"))
    fingerprint = platform_fingerprint()
    escaping = [f"/ort_torch_train_test_{os.getpid()}.so", "../outside.so", "ab/../../x.so", "ab/.hidden.so"]
    for name in [*escaping, "cd/flipped.so", "ab/cabc.main.so"]:
        cache.store.write("library", name, fingerprint, b"\x7fELF")
    flipped = cache.store.path_of("library", "cd/flipped.so", fingerprint)
    data = bytearray(flipped.read_bytes())
    data[-1] ^= 1
    flipped.write_bytes(bytes(data))
    with caplog.at_level(logging.INFO):
        assert cache.restore_libraries([*escaping, "cd/flipped.so", "ab/cabc.main.so"]) == 1
    assert (tmp_path / "inductor" / "ab" / "cabc.main.so").read_bytes() == b"\x7fELF"
    assert not Path(escaping[0]).exists() and not (tmp_path / "outside.so").exists()
    assert not (tmp_path / "inductor" / "cd").exists() and "fails its signature" in caplog.text
    assert caplog.text.count("refused the library path") == len(escaping)


_WRITER = """
import sys
from ort_torch_train.training.compile.cache_store import CacheStore
directory, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
for i in range(count):
    CacheStore(directory).write("step", f"{name}{i}", "f", f"{name} {i}".encode() * 1000)
"""


@pytest.mark.distributed
@pytest.mark.slow
def test_two_processes_filling_one_cache_keep_every_entry(tmp_path):
    """Two processes starting on a new directory at once agree on one key and keep each other's entries."""
    directory = tmp_path / "cache"
    writers = [subprocess.Popen([sys.executable, "-c", _WRITER, str(directory), name, "20"], cwd=ROOT) for name in "ab"]
    try:
        assert [writer.wait(timeout=scaled(120)) for writer in writers] == [0, 0]
    finally:  # a writer stuck past the timeout fails the test and is not left behind
        for writer in writers:
            if writer.poll() is None:
                writer.kill()
                writer.wait()
    store = CacheStore(directory)
    assert store.entry_count() == 40 and not list(directory.glob("**/.*"))
    for name in "ab":
        for i in range(20):
            assert store.read("step", f"{name}{i}", "f")[1] == f"{name} {i}".encode() * 1000  # type: ignore[index]


# ---- compiled steps across processes ----------------------------------------------------------------
def _cli_train(case: Path, cache: Path, out: Path, inductor: Path) -> tuple[dict, str]:
    """One CLI process training ``case`` compiled for 3 steps with ``cache``, counting its compilations."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(inductor), "ORT_TORCH_TRAIN_LOG": "info"}
    arguments = ["train", case / "artifacts", "--data", case / "data.npz", "--inputs", "x_train,y_train"]
    arguments += ["--batched", "--no-shuffle", "--steps", "3", "--eval-data", case / "data.npz"]
    arguments += ["--eval-inputs", "x_eval,y_eval", "--compile", "--compile-cache", cache, "--quiet"]
    arguments += ["--output", out]
    command = [sys.executable, "-m", "tests.helpers.count_compilations", str(out) + ".json"]
    result = subprocess.run(
        [*command, *map(str, arguments)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=scaled(400)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(Path(str(out) + ".json").read_text()), result.stderr


@pytest.mark.compile
@pytest.mark.slow
def test_a_second_cli_run_loads_every_step_and_a_flipped_bit_only_recompiles(tmp_path):
    """With a bit flipped in every entry of a first run's cache, the steps are refused and traced again, trained
    alike, and every entry (steps and libraries) is written again, though inductor's cache dir still held the
    libraries: a later run with an empty inductor cache dir (a new container) traces no graph and builds no
    library, and trains bit for bit alike."""
    case, cache = FIXTURES / "mlp_ce_adamw_sched", tmp_path / "cache"
    first, _ = _cli_train(case, cache, tmp_path / "first", tmp_path / "inductor-1")
    assert first["traced_graphs"] >= 2 and first["library_builds"] > 0
    expected = TrainingState.load(tmp_path / "first").state_dict()

    def assert_trained_alike(run: str) -> None:
        for name, value in TrainingState.load(tmp_path / run).state_dict().items():
            torch.testing.assert_close(value, expected[name], rtol=0, atol=0)

    for entry in (cache / "entries-1").iterdir():
        data = bytearray(entry.read_bytes())
        data[len(data) // 2] ^= 1
        entry.write_bytes(bytes(data))
    second, log = _cli_train(case, cache, tmp_path / "second", tmp_path / "inductor-1")
    assert "fails its signature" in log and "compile cache hit" not in log and second["traced_graphs"] >= 2
    assert_trained_alike("second")
    third, log = _cli_train(case, cache, tmp_path / "third", tmp_path / "inductor-2")
    assert (third["traced_graphs"], third["library_builds"]) == (0, 0), log
    assert "compile cache hit: the train step" in log and "compile cache hit: the eval graph" in log
    assert_trained_alike("third")


def _train_in_a_process(case_dir: Path, cache: Path, out: Path, env: dict, *extra: str) -> tuple[dict, str]:
    command = [sys.executable, "-m", "tests.helpers.precompile_worker", str(case_dir), str(cache), str(out), *extra]
    result = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=scaled(300))
    assert result.returncode == 0, result.stderr[-3000:]
    with np.load(out) as saved:
        return {key: saved[key] for key in saved.files}, result.stderr


@pytest.mark.compile
@pytest.mark.slow
def test_a_saved_bf16_step_of_a_compile_mode_loads_and_trains_bitwise_alike(mlp_case, tmp_path):
    """Mixed-precision steps and ``compile=<mode>`` steps and eval graphs (the mode's inductor options)
    are saved too; the saved step is not used for a float32 ``compile=True`` one (its process ends right
    after its lookup misses: compiling it shows nothing more); ``save_compile_cache`` copies the steps a
    process used into another directory."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    cache = tmp_path / "cache"
    settings = ("--mixed-precision", "bf16", "--mode", "reduce-overhead")  # a mode: its inductor options
    first, _ = _train_in_a_process(mlp_case.root, cache, tmp_path / "first.npz", env, *settings)
    copy = tmp_path / "copy"
    second, log = _train_in_a_process(
        mlp_case.root, cache, tmp_path / "second.npz", env, *settings, "--copy", str(copy)
    )
    assert "loaded the saved train step" in log and "loaded the saved eval graph" in log
    assert CacheStore(copy).entry_count() >= 2
    for name in ("losses", "params", "evaluated"):
        np.testing.assert_array_equal(second[name], first[name])
    float32, log = _train_in_a_process(mlp_case.root, cache, tmp_path / "float32.npz", env, "--stop-after-lookup")
    assert "compile cache miss: no saved train step" in log and "loaded the saved" not in log
    assert not float32["found"]


# ---- step keys and guards ---------------------------------------------------------------------------
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


@pytest.mark.slow
def test_a_saved_step_is_found_only_under_the_same_inductor_settings_and_in_a_new_process():
    """The fingerprint an entry is filed under: another inductor setting is another entry; a new process
    (another hash seed: sets in torch's settings iterate in another order) finds the same."""
    from torch._inductor import config

    fingerprint = step_fingerprint()
    with config.patch({"cpp.simdlen": 128}):
        assert step_fingerprint() != fingerprint
    script = "from ort_torch_train.training.compile.cache_store import step_fingerprint; print(step_fingerprint())"
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        printed = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True)
        assert printed.stdout.strip() == fingerprint, printed.stderr[-2000:]


def test_entries_are_filed_under_the_torch_build_and_the_cpu(monkeypatch):
    from ort_torch_train.training.compile import cache_store

    fingerprints = {platform_fingerprint()}
    monkeypatch.setattr(cache_store, "cpu_features", lambda: ["_is_some_other_cpu_supported"])
    fingerprints.add(platform_fingerprint())
    monkeypatch.setattr(torch, "__version__", "1.0.0")
    fingerprints.add(platform_fingerprint())
    assert len(fingerprints) == 3


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
def test_the_eval_graph_is_precompiled_only_without_autograd(mlp_case, tmp_path):
    """A differentiable eval-mode forward (parameters requiring grad) compiles without precompiling and
    keeps its gradients; the eval step (no grad) is precompiled and saved."""
    module = Module(
        mlp_case.artifact("training_model.onnx"),
        mlp_case.load_state(),
        mlp_case.artifact("eval_model.onnx"),
        compile=True,
        compile_cache=tmp_path / "cache",
    )
    module.eval()
    inputs = mlp_case.eval_inputs()
    loss = module.forward(*[torch.from_numpy(a) for a in inputs])
    loss.backward()
    cache = module._engine.compile_cache
    assert cache is not None and cache.steps == {}
    assert all(parameter.grad is not None for parameter in module.parameters() if parameter.requires_grad)
    evaluated = module(*inputs)
    assert len(cache.steps) == 1 and save_compile_cache(tmp_path / "cache") == 0  # saved when compiled
    np.testing.assert_allclose(evaluated, loss.detach().numpy(), rtol=1e-6)


@pytest.mark.compile
def test_a_module_without_a_cache_leaves_another_modules_cache_alone(mlp_case, tmp_path):
    """A Module built with ``compile_cache=False`` after one with a directory: the first still saves its
    step there (the option once switched the cache off for the whole process)."""
    cached = _compiled_module(mlp_case, compile_cache=tmp_path / "cache")
    _compiled_module(mlp_case, compile_cache=False)
    cached(*mlp_case.train_inputs(0))
    assert [what for what, _ in process_caches().steps.values()] == ["train step"]
    assert CacheStore(tmp_path / "cache").entry_count() >= 1
    assert save_compile_cache(tmp_path / "copy") == 1


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
