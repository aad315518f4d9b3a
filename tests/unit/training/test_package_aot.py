"""``Module(compile="aot")`` (issue 51, item 4): a package's programs compiled on demand into the compile cache. The
mlp fixture trains through them as the eager run does; a later Module on the same cache loads them with no
compilation; an entry with a flipped byte is refused and compiled again; the program folder of a process killed
while training goes when the next Module makes its own; settings a program cannot honour are refused before
anything compiles."""

from __future__ import annotations

import gc
import logging
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from ort_torch_train.api import Module, Optimizer
from ort_torch_train.training.options import EngineOptions
from ort_torch_train.training.package.on_demand import SCRATCH_PREFIX, AheadOfTime
from tests.helpers.corpus import Case
from tests.helpers.paths import FIXTURES, ROOT
from tests.helpers.timeouts import line_within, scaled

HOLDER = """
import sys, time
from pathlib import Path
from ort_torch_train.api import Module, Optimizer
from tests.helpers.corpus import Case
case = Case(Path(sys.argv[1]))
module = Module(case.artifact("training_model.onnx"), case.load_state(), compile="aot", compile_cache=sys.argv[2])
optimizer = Optimizer(case.artifact("optimizer_model.onnx"), module)
module(*case.train_inputs(0))
print("trained", flush=True)
time.sleep(600)
"""
CASE = "mlp_ce_adamw_sched"
STEPS = 4
LOGGER = "ort_torch_train.training.package.on_demand"


def _case() -> Case:
    if not (FIXTURES / CASE / "expected.json").is_file():
        pytest.skip(f"fixture {CASE} not present")
    return Case(FIXTURES / CASE)


def _train(case: Case, compile: bool | str, cache: Path | None) -> tuple[list[float], dict[str, np.ndarray]]:
    """Losses and parameters after STEPS steps (the second through ``module.step``), no eval step."""
    module = Module(
        case.artifact("training_model.onnx"), case.load_state(), compile=compile, compile_cache=cache or False
    )
    optimizer = Optimizer(case.artifact("optimizer_model.onnx"), module)
    losses = []
    for step in range(STEPS):
        optimizer.set_learning_rate(case.lr_before(step))
        if step == 1:
            losses.append(float(module.step(optimizer, *case.train_inputs(step))))
            continue
        losses.append(float(module(*case.train_inputs(step))))
        optimizer.step()
        module.lazy_reset_grad()
    return losses, {name: p.detach().numpy().copy() for name, p in module.named_parameters()}


def _killed_while_training(case: Case, cache: Path, temporary: Path) -> Path:
    """The program folder of a process killed (SIGKILL) after a train step of a compile="aot" Module on
    ``cache``, its temporary directory ``temporary``."""
    env = {**os.environ, "TMPDIR": str(temporary)}
    before = set(temporary.glob(f"{SCRATCH_PREFIX}*"))  # this process's Modules' not yet collected
    command = [sys.executable, "-c", HOLDER, str(case.root), str(cache)]
    process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        assert line_within(process.stdout, scaled(300), "the killed process's train step") == "trained\n"
        (folder,) = set(temporary.glob(f"{SCRATCH_PREFIX}*")) - before
        assert any(path.is_dir() for path in folder.iterdir())  # a program
    finally:
        process.kill()
        process.communicate(timeout=scaled(60))
    assert folder.is_dir()
    return folder


def _entries(cache: Path) -> dict[str, int]:
    """The cache's entry files by name, and their modification times."""
    return {path.name: path.stat().st_mtime_ns for path in sorted((cache / "entries-1").iterdir())}


@pytest.mark.compile
@pytest.mark.slow
def test_aot_programs_train_as_eager_load_from_the_cache_and_a_damaged_entry_compiles_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = _case()
    cache = tmp_path / "cache"
    temporary = tmp_path / "tmp"  # where the Modules' program folders go
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    eager = _train(case, False, None)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        first = _train(case, "aot", cache)
    assert len(re.findall(r"compiled the (train|optimizer) program", caplog.text)) == 2
    np.testing.assert_allclose(first[0], eager[0], rtol=0, atol=1e-6)
    for name, value in eager[1].items():
        np.testing.assert_allclose(first[1][name], value, rtol=0, atol=1e-6, err_msg=name)
    saved = _entries(cache)
    assert len(saved) == 2  # the train and optimizer programs
    killed = _killed_while_training(case, cache, temporary)  # its program folder left behind

    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        again = _train(case, "aot", cache)
    assert "compiled the" not in caplog.text
    assert len(re.findall(r"compile cache hit: the (train|optimizer) program", caplog.text)) == 2
    assert _entries(cache) == saved  # read, not written
    np.testing.assert_allclose(again[0], first[0], rtol=0, atol=1e-6)
    gc.collect()
    assert not killed.exists()  # removed by the next Module's, the lock its process held being free
    assert list(temporary.glob(f"*{SCRATCH_PREFIX}*")) == []  # each Module's program folder went with it

    damaged = next(iter(saved))
    path = cache / "entries-1" / damaged
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        repaired = _train(case, "aot", cache)
    assert "fails its signature" in caplog.text
    assert len(re.findall(r"compiled the (train|optimizer) program", caplog.text)) == 1
    np.testing.assert_allclose(repaired[0], first[0], rtol=0, atol=1e-6)
    after = _entries(cache)
    assert after.keys() == saved.keys() and after[damaged] != saved[damaged]  # written again, whole


def test_aot_settings_a_program_cannot_honour_are_refused_before_compiling() -> None:
    options = EngineOptions.of(compile="aot", compile_cache=False)
    assert options.programs == AheadOfTime(False) and options.compile_arguments is None
    for settings, named in (
        ({"device": "cuda"}, "device='cuda'"),
        ({"mixed_precision": "bf16"}, "mixed_precision='bf16'"),
        ({"recompute": True}, "recompute=True"),
    ):
        with pytest.raises(ValueError, match=re.escape(named)) as raised:
            EngineOptions.of(compile="aot", **settings)
        assert "compile='aot': programs compiled ahead of time run on the CPU in float32" in str(raised.value)
