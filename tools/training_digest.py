"""Print a digest of each reference case's training, to compare two commits bit for bit.

For every case of tests/fixtures and ../shared/refcorpus: ORT's loop on the case's artifacts and data
(the case's learning rate before each step), then the eval loss; the digest covers every step's loss,
the eval loss, the final parameters and the optimizer moments. Run it in two checkouts and diff:

    .venv/bin/python tools/training_digest.py --compiled mlp transformer > digests.txt
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from ort_torch_train.api import CheckpointState, Module, Optimizer

ROOT = Path(__file__).resolve().parents[1]
CASE_ROOTS = (ROOT.parent / "shared" / "refcorpus", ROOT / "tests" / "fixtures")


def training_digest(case: Path, compile: bool) -> str:
    """The digest of one case trained eagerly, or with ``module.step`` compiled."""
    expected = json.loads((case / "expected.json").read_text())
    with np.load(case / "data.npz") as arrays:
        data = dict(arrays)
    keys = expected.get("data_keys", {})
    train_keys = keys.get("train") or ["x_train", "y_train"]
    eval_keys = keys.get("eval") or ["x_eval", "y_eval"]
    torch.manual_seed(0)
    artifacts = case / "artifacts"
    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    module = Module(artifacts / "training_model.onnx", state, artifacts / "eval_model.onnx", compile=compile)
    optimizer = Optimizer(artifacts / "optimizer_model.onnx", module)
    digest = hashlib.sha256()
    for step, learning_rate in enumerate(expected["train"]["lr_before_each_step"]):
        optimizer.set_learning_rate(learning_rate)
        inputs = [data[key][step] for key in train_keys]
        if compile:
            outputs = module.step(optimizer, *inputs)
        else:
            outputs = module(*inputs)
            optimizer.step()
            module.lazy_reset_grad()
        digest.update(np.ascontiguousarray(_first(outputs)).tobytes())
    module.eval()
    digest.update(np.ascontiguousarray(_first(module(*[data[key] for key in eval_keys]))).tobytes())
    training_state = state.training_state
    for name in sorted(training_state.params):
        digest.update(training_state.params[name].detach().numpy().tobytes())
    if training_state.optimizer is not None:
        for _name, moments in sorted(training_state.optimizer.momentums.items()):
            for key in sorted(moments):
                digest.update(moments[key].numpy().tobytes())
    return digest.hexdigest()[:16]


def _first(outputs: object) -> object:
    return outputs[0] if isinstance(outputs, (list, tuple)) else outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--compiled", nargs="*", default=[], help="cases also trained with compile=True")
    args = parser.parse_args()
    for root in CASE_ROOTS:
        if not root.is_dir():
            continue
        for case in sorted(path for path in root.iterdir() if (path / "expected.json").is_file()):
            for compile in (False, True) if case.name in args.compiled else (False,):
                mode = "compiled" if compile else "eager"
                print(f"{root.name}/{case.name} {mode} {training_digest(case, compile)}", flush=True)


if __name__ == "__main__":
    main()
