"""``fit(progress=...)`` from the Python API in a real terminal (tmux): a callback's ``trainer.print``,
a warning and a root-logger record raised while the bar is live each get their own line, and read-only
eval arrays (what pandas' ``DataFrame.to_numpy()`` gives; pandas itself is not needed) raise no warning."""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import FIXTURES, ROOT
from tests.integration.test_terminal import BAR, run_in_tmux

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")]

SCRIPT = """
import logging
import warnings

import numpy as np

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.trainer import Callback, fit, print

logging.basicConfig(level=logging.INFO, format="LOG %(message)s")
artifacts = {artifacts!r}
state = CheckpointState.load_checkpoint(artifacts + "/checkpoint")
module = Module(artifacts + "/training_model.onnx", state, artifacts + "/eval_model.onnx")
optimizer = Optimizer(artifacts + "/optimizer_model.onnx", module)
rng = np.random.default_rng(0)
images = rng.standard_normal((64, 1, 12, 12), dtype=np.float32)
labels = rng.integers(0, 10, 64)
for array in (images, labels):
    array.setflags(write=False)  # as pandas hands them out


class Chatty(Callback):
    def on_step_end(self, run) -> None:
        if run.step % 10 == 0:
            print(f"PRINTED step {{run.step}}: loss {{run.loss:.3f}}")
        if run.step == 25:
            warnings.warn("WARNED at step 25", UserWarning)
            logging.getLogger("an.application").info("at step 25")


batches = [(images[i : i + 16], labels[i : i + 16]) for i in range(0, 64, 16)] * 20
result = fit(
    module, optimizer, batches, max_steps=60, eval_data=batches[:2], eval_every=20, callbacks=[Chatty()],
    progress="training",
)
builtins_print = __builtins__.print if hasattr(__builtins__, "print") else __builtins__["print"]
builtins_print("DONE", result.last_step, flush=True)
"""


def test_printing_callback_warnings_and_read_only_eval_data_keep_off_the_bar(tmp_path: Path) -> None:
    script = tmp_path / "train_api.py"
    script.write_text(SCRIPT.format(artifacts=str(FIXTURES / "cnn" / "artifacts")))
    command = f"PYTHONPATH={shlex.quote(str(ROOT))} {shlex.quote(sys.executable)} {shlex.quote(str(script))}"
    lines = run_in_tmux(command, tmp_path)
    text = "\n".join(lines)
    ours = ("PRINTED", "WARNED", "LOG at step 25", "DONE")
    for line in lines:
        assert not (BAR.search(line) and any(mark in line for mark in ours)), f"glued:\n{line}\n\n{text}"
    for step in (10, 20, 30, 40, 50, 60):
        assert sum(line.startswith(f"PRINTED step {step}:") for line in lines) == 1, text
    warned = [line for line in lines if "Warning:" in line]
    assert len(warned) == 1 and warned[0].endswith("UserWarning: WARNED at step 25"), text  # none about the arrays
    assert any(line.startswith("LOG at step 25") for line in lines), text
    assert any(line.startswith("DONE 60") for line in lines), text
    assert any("60/60" in line for line in lines if BAR.search(line)), text
