"""A training process that saves a checkpoint from its SIGTERM handler (the usual preemption pattern),
for tests/unit/api/test_preemption.py.

``python -m tests.helpers.preemption_worker OUT_DIR BATCHES``: trains the MLP fixture on BATCHES
batches, taking UPDATES optimizer steps on each batch's gradients (so that a signal often lands in
``optimizer.step()``, here with the multi-kernel "foreach" update), saving ``OUT_DIR/preempted_<n>.ckpt`` (with optimizer state) on the n-th SIGTERM, and records the
parameters and moments after every step (what a replay of the run gives). It then checks every saved
checkpoint against that record at its step and writes ``OUT_DIR/report.json``: how many were saved,
and which were inconsistent (their parameters or moments not those of their step).
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from types import FrameType

import numpy as np
import torch

from ort_torch_train.api import CheckpointState, Module, Optimizer
from tests.helpers.distributed_worker import MLP, STEPS, batches

UPDATES = 50


def snapshot(state: CheckpointState) -> dict[str, torch.Tensor]:
    """The parameters and moments of a state, copied, by name."""
    training = state.training_state
    tensors = {f"param/{name}": param.detach().clone() for name, param in training.params.items()}
    assert training.optimizer is not None
    for name, moments in training.optimizer.momentums.items():
        tensors.update({f"moment/{name}/{key}": moment.detach().clone() for key, moment in moments.items()})
    return tensors


def main() -> None:
    out, batch_count = Path(sys.argv[1]), int(sys.argv[2])
    artifacts = MLP / "artifacts"
    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    module = Module(artifacts / "training_model.onnx", state)
    optimizer = Optimizer(artifacts / "optimizer_model.onnx", module, implementation="foreach")
    saved: list[Path] = []

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        saved.append(out / f"preempted_{len(saved)}.ckpt")
        CheckpointState.save_checkpoint(state, saved[-1], include_optimizer_state=True)

    inputs = [[np.ascontiguousarray(array) for array in batches(MLP, step)] for step in range(STEPS)]
    assert state.training_state.optimizer is not None
    replay = {state.training_state.optimizer.step: snapshot(state)}
    signal.signal(signal.SIGTERM, on_sigterm)
    (out / "ready").touch()  # only once the handler is in place: the test signals as soon as it sees this
    for batch in range(batch_count):
        module(*inputs[batch % STEPS])
        for _ in range(UPDATES):
            optimizer.step()
            assert state.training_state.optimizer is not None
            replay[state.training_state.optimizer.step] = snapshot(state)
        module.lazy_reset_grad()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    inconsistent = []
    for path in saved:
        loaded = CheckpointState.load_checkpoint(path)
        assert loaded.training_state.optimizer is not None
        expected = replay[loaded.training_state.optimizer.step]
        found = snapshot(loaded)
        if found.keys() != expected.keys() or not all(torch.equal(found[k], expected[k]) for k in expected):
            inconsistent.append(path.name)
    (out / "report.json").write_text(json.dumps({"saved": len(saved), "inconsistent": inconsistent}))


if __name__ == "__main__":
    main()
