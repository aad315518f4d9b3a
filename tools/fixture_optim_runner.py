"""Run one optimizer model for 20 steps in a process whose memory layout is reproducible.

Used by fixture_extras.optimizer_variants. ORT's InplaceClipGradNorm adds the per-tensor squared
norms in the iteration order of an absl hash map, and absl salts that order with memory addresses,
so clip trajectories differ by ~1 ulp between processes. The parent therefore starts this script
with ASLR off (`setarch -R`), a fixed minimal environment (PYTHONHASHSEED=0, one thread), no
arguments, and a scratch working directory holding fixed file names:

    data.npz  artifacts/{training_model.onnx,eval_model.onnx,checkpoint}  optimizer.onnx  job.json

It writes result.json and arrays.npz there. Reruns on one machine are then bit-identical.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fixture_io as fio  # noqa: E402
import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnxruntime.training.api import CheckpointState, Module, Optimizer  # noqa: E402

STEPS = 20


def open_module(art: Path) -> tuple[CheckpointState, Module]:
    """Fresh state from artifacts/checkpoint and a single-threaded Module."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    state = CheckpointState.load_checkpoint(str(art / "checkpoint"))
    return state, Module(str(art / "training_model.onnx"), state, str(art / "eval_model.onnx"), session_options=so)


def grad_norm(state: CheckpointState) -> float:
    """L2 norm over all gradients, in float64 and name order (for reference only)."""
    total = sum(float(np.sum(np.asarray(p.grad, np.float64) ** 2)) for _, p in state.parameters if p.grad is not None)
    return float(np.sqrt(total))


def loss_of(out) -> float:
    first = out[0] if isinstance(out, (tuple, list)) else out
    return float(np.asarray(first).reshape(-1)[0])


def trajectory(optim: Path, lr: float, keys: list[str], tag: str) -> tuple[dict, dict]:
    """20 steps (train call, grad norms, optimizer.step, lazy_reset_grad), eval, saved optimizer state."""
    data = dict(np.load("data.npz"))
    state, module = open_module(Path("artifacts"))
    try:
        opt = Optimizer(str(optim), module)
    except Exception as exc:  # noqa: BLE001 - ORT's refusal is what gets recorded
        return {
            "error_at": "Optimizer(...)",
            "error": {"type": type(exc).__qualname__, "message": fio.scrub(str(exc))},
        }, {}
    opt.set_learning_rate(lr)
    losses, before, after = [], [], []
    for i in range(STEPS):
        module.train()
        losses.append(loss_of(module(*[data[f"{k}_train"][i] for k in keys], data["y_train"][i])))
        before.append(grad_norm(state))
        opt.step()
        after.append(grad_norm(state))
        module.lazy_reset_grad()
    module.eval()
    eval_loss = loss_of(module(*[data[f"{k}_eval"] for k in keys], data["y_eval"]))
    CheckpointState.save_checkpoint(state, "final_checkpoint", include_optimizer_state=True)
    parsed = fio.read_checkpoint(Path("final_checkpoint"), with_data=True)
    changed = any(abs(a - b) > 1e-6 * max(1.0, a) for a, b in zip(before, after))
    info = {
        "losses": losses,
        "eval_loss": eval_loss,
        "grad_norm_before_step": before,
        "grad_norm_after_step": after,
        "optimizer_step_changed_grad_buffers": changed,
        "lr": lr,
        "optimizer_groups": fio.optimizer_groups_summary(parsed),
    }
    arrays = {f"{tag}__train_losses": np.array(losses, np.float32), f"{tag}__eval_loss": np.float32(eval_loss)}
    arrays.update({f"{tag}__final__{n}": np.array(p.data) for n, p in state.parameters})
    arrays.update(fio.optimizer_state_arrays(parsed, prefix=f"{tag}__"))
    return info, arrays


def main() -> int:
    """Read job.json (lr, keys, tag) from the working directory; write result.json and arrays.npz."""
    ort.set_default_logger_severity(3)
    job = json.loads(Path("job.json").read_text())
    info, arrays = trajectory(Path("optimizer.onnx"), job["lr"], job["keys"], job["tag"])
    Path("result.json").write_text(json.dumps(info))
    fio.save_npz(Path("arrays.npz"), arrays)
    return 0


if __name__ == "__main__":
    sys.exit(main())
