"""Drive onnxruntime.training.api on generated artifacts and record what it does."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fixture_io as fio
import numpy as np
import onnx
import onnxruntime as ort
import torch
from fixture_export import initializer_arrays, torch_reference
from fixture_specs import STEPS, FixtureSpec, torch_loss
from onnxruntime.training.api import CheckpointState, LinearLRScheduler, Module, Optimizer


@dataclass
class FixtureRun:
    """One fixture being recorded: its spec, paths, data and base model."""

    spec: FixtureSpec
    out: Path
    data: dict[str, np.ndarray]
    base: onnx.ModelProto

    @property
    def art(self) -> Path:
        return self.out / "artifacts"

    def batch(self, split: str, i: int | None = None) -> list[np.ndarray]:
        """User inputs then target for train step i (split='train') or the eval set."""
        keys = [f"{inp.key}_{split}" for inp in self.spec.inputs] + [f"y_{split}"]
        return [self.data[k] if i is None else self.data[k][i] for k in keys]

    def open(self, checkpoint: Path | None = None) -> tuple[CheckpointState, Module]:
        """A fresh CheckpointState (default: artifacts/checkpoint) and Module with the eval model."""
        state = CheckpointState.load_checkpoint(str(checkpoint or self.art / "checkpoint"))
        module = Module(
            str(self.art / "training_model.onnx"),
            state,
            str(self.art / "eval_model.onnx"),
            session_options=session_options(),
        )
        return state, module

    def param_order(self, state: CheckpointState) -> list[str]:
        """Parameter names in the training graph's input order."""
        names = set(state._state.parameter_names())  # noqa: SLF001 - also works on nominal states
        graph = onnx.load(str(self.art / "training_model.onnx")).graph
        return [i.name for i in graph.input if i.name in names]


def session_options() -> ort.SessionOptions:
    """Single-threaded sessions, so recorded numbers do not depend on the machine's core count."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    return so


def capture(fn: Callable[[], Any]) -> dict:
    """Run fn; record its result or the exception type and exact message (refcorpus style)."""
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - recording ORT's behaviour is the point
        return {
            "raised": True,
            "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
            "message": fio.scrub(str(exc)),
        }
    return {"raised": False, "result": str(result)}


def as_tuple(out: Any) -> tuple[np.ndarray, ...]:
    """Module.__call__ returns a bare array for one output and a tuple for several."""
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def loss_of(out: Any) -> float:
    """The loss (first output) of a Module call as a Python float (it may be 0-d or shape [1])."""
    return float(np.asarray(as_tuple(out)[0]).reshape(-1)[0])


def param_values(state: CheckpointState) -> dict[str, np.ndarray]:
    """Copies of every parameter's data, in state iteration (name-sorted) order."""
    return {name: np.array(p.data) for name, p in state.parameters}


def grads(state: CheckpointState) -> dict[str, np.ndarray | None]:
    """Copies of every parameter's gradient (None for frozen ones)."""
    return {name: (None if p.grad is None else np.array(p.grad)) for name, p in state.parameters}


def contiguous(module: Module, trainable_only: bool) -> np.ndarray:
    """get_contiguous_parameters as a numpy copy."""
    return np.array(module.get_contiguous_parameters(trainable_only).numpy())


def maxabs(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))) if np.size(a) else 0.0


# ----------------------------------------------------------------------------- setup / gradients


def record_setup(run: FixtureRun) -> tuple[dict, dict]:
    """Parameters, sizes, mode names, initial values, contiguous buffers and their order."""
    state, module = run.open()
    info: dict = {"checkpoint_parameter_order": [n for n, _ in state.parameters], "parameters": {}}
    for name, p in state.parameters:
        info["parameters"][name] = {
            "requires_grad": bool(p.requires_grad),
            "shape": list(p.data.shape),
            "dtype": str(p.data.dtype),
        }
    info["parameters_size"] = {f"trainable_only_{t}": module.get_parameters_size(t) for t in (True, False)}
    for mode in ("train", "eval"):
        module.train(mode == "train")
        info[f"{mode}_mode"] = {"input_names": module.input_names(), "output_names": module.output_names()}
    info["grad_before_any_train_step"] = {
        n: {"shape": None if g is None else list(g.shape), "all_zero": None if g is None else bool(not g.any())}
        for n, g in grads(state).items()
    }
    values = param_values(state)
    arrays = {f"init__{n}": v for n, v in values.items()}
    arrays["init_contiguous_trainable"] = contiguous(module, True)
    arrays["init_contiguous_all"] = contiguous(module, False)
    info["get_contiguous_parameters_return_type"] = (
        type(module.get_contiguous_parameters()).__module__
        + "."
        + type(module.get_contiguous_parameters()).__qualname__
    )
    info["contiguous_buffer_order"] = buffer_order(run, state, values, arrays)
    return info, arrays


def buffer_order(run: FixtureRun, state: CheckpointState, values: dict, arrays: dict) -> dict:
    """Which parameter order the flat buffers follow."""
    order = run.param_order(state)
    trainable = [n for n in order if state.parameters[n].requires_grad]

    def flat(names: list[str]) -> np.ndarray:
        return np.concatenate([values[n].ravel() for n in names]) if names else np.zeros(0, np.float32)

    ck_order = [t["name"] for t in _file_param_order(run.art / "checkpoint")]
    same = lambda a, b: bool(a.shape == b.shape and np.array_equal(a, b))  # noqa: E731
    return {
        "training_model_param_input_order": order,
        "trainable_matches_training_model_input_order": same(arrays["init_contiguous_trainable"], flat(trainable)),
        "all_matches_training_model_input_order": same(arrays["init_contiguous_all"], flat(order)),
        "all_matches_sorted_name_order": same(arrays["init_contiguous_all"], flat(sorted(order))),
        "all_matches_checkpoint_file_order": same(arrays["init_contiguous_all"], flat(ck_order)),
        "checkpoint_file_order": ck_order,
        "note": "checkpoint_file_order = tensor order inside artifacts/checkpoint (generate_artifacts writes "
        "the exported-initializer order); checkpoint_parameter_order = CheckpointState iteration "
        "(name-sorted)",
    }


def _file_param_order(path: Path) -> list[dict]:
    ms = fio.read_checkpoint(path)["module_state"]
    return ms["requires_grad_params"] + ms["frozen_params"]


def gradient_semantics(run: FixtureRun) -> tuple[dict, dict]:
    """Three train calls on fresh state: no reset between 1 and 2, lazy_reset_grad before 3."""
    state, module = run.open()
    b0 = run.batch("train", 0)
    module.train()
    losses = [loss_of(module(*b0))]
    g1 = grads(state)
    losses.append(loss_of(module(*b0)))
    g2 = grads(state)
    module.lazy_reset_grad()
    g_after_reset_call = grads(state)
    losses.append(loss_of(module(*b0)))
    g3 = grads(state)
    module.eval()
    eval_loss = loss_of(module(*run.batch("eval")))
    g_after_eval = grads(state)
    live = [n for n, g in g1.items() if g is not None]
    info = {
        "loss_call1": losses[0],
        "loss_call2_no_reset": losses[1],
        "loss_call3_after_lazy_reset": losses[2],
        "grad_is_None_for": [n for n, g in g1.items() if g is None],
        "accum2_equals_2x_step1_maxabs": max([maxabs(g2[n], 2 * g1[n]) for n in live], default=0.0),
        "after_reset_equals_step1_maxabs": max([maxabs(g3[n], g1[n]) for n in live], default=0.0),
        "lazy_reset_grad_call_leaves_grads_unchanged": all(np.array_equal(g2[n], g_after_reset_call[n]) for n in live),
        "eval_call_leaves_grads_unchanged": all(np.array_equal(g3[n], g_after_eval[n]) for n in live),
        "eval_loss_initial_params": eval_loss,
    }
    arrays = {}
    for n in live:
        arrays[f"grad_step1__{n}"] = g1[n]
        arrays[f"grad_accum2__{n}"] = g2[n]
        arrays[f"grad_after_reset__{n}"] = g3[n]
    return info, arrays


def torch_crosscheck(
    run: FixtureRun, init: dict[str, np.ndarray], ort_loss: float, ort_grads: dict[str, np.ndarray]
) -> dict:
    """First-step loss and gradients from torch autograd on the same weights and batch."""
    values = {**initializer_arrays(run.base), **init}
    model = torch_reference(run.spec.build_model, values).train()
    *xs, y = (torch.from_numpy(np.array(a)) for a in run.batch("train", 0))
    loss = torch_loss(run.spec, model(*xs), y)
    loss.backward()
    named = dict(model.named_parameters())
    diffs = {n: maxabs(named[n].grad.numpy(), g) for n, g in ort_grads.items() if n in named}
    t_loss = loss.item()
    return {"torch_loss": t_loss, "ort_loss": ort_loss, "abs_diff": abs(t_loss - ort_loss), "grad_max_abs_diff": diffs}


# ----------------------------------------------------------------------------- training


def documented_lr(sched: dict, step: int) -> float:
    """LinearLRScheduler's documented lr after `step` completed optimizer steps."""
    warm, total, lr0 = sched["warmup_step_count"], sched["total_step_count"], sched["initial_lr"]
    if step < warm:
        return lr0 * step / max(1, warm)
    return lr0 * max(0.0, (total - step) / max(1, total - warm))


def make_optimizer(run: FixtureRun, module: Module, path: Path | None = None) -> tuple[Optimizer, Any, dict]:
    """Optimizer (+ LinearLRScheduler with the binding's swap undone) and a record of the setup."""
    opt = Optimizer(str(path or run.art / "optimizer_model.onnx"), module)
    info = {"optimizer_default_lr": opt.get_learning_rate()}
    sched = None
    s = run.spec.scheduler
    if s:
        # ORT 1.19.2's binding swaps warmup/total (also with keywords, the wrapper passes them on
        # positionally), so pass (total, warmup) to obtain the documented warmup=3, total=20.
        sched = LinearLRScheduler(opt, s["total_step_count"], s["warmup_step_count"], s["initial_lr"])
        info["scheduler"] = {
            "type": "LinearLRScheduler",
            **s,
            "semantics": "documented (lr = initial*step/max(1,warmup) while step<warmup, else "
            "initial*max(0,(total-step)/max(1,total-warmup)))",
            "ort_call": f"LinearLRScheduler(optimizer, {s['total_step_count']}, "
            f"{s['warmup_step_count']}, {s['initial_lr']})  # binding swaps the two",
            "call_order": "loss=module(...); optimizer.step(); scheduler.step(); module.lazy_reset_grad()",
        }
    else:
        opt.set_learning_rate(run.spec.lr)
        info["scheduler"] = None
    info["lr_after_setup"] = opt.get_learning_rate()
    return opt, sched, info


def train_steps(
    run: FixtureRun, state: CheckpointState, module: Module, opt: Optimizer, sched: Any
) -> tuple[dict, dict]:
    """The 20-step loop; records losses, lrs, additional outputs and (optionally) frozen params."""
    losses, before, after, extra = [], [], [], []
    frozen = [n for n, p in state.parameters if not p.requires_grad] if run.spec.track_frozen_each_step else []
    tracked: dict[str, list] = {n: [] for n in frozen}
    changed_in_call, changed_in_step = set(), set()
    for i in range(STEPS):
        before.append(opt.get_learning_rate())
        prev = {n: np.array(state.parameters[n].data) for n in frozen}
        module.train()
        out = as_tuple(module(*run.batch("train", i)))
        mid = {n: np.array(state.parameters[n].data) for n in frozen}
        losses.append(out[0])
        extra.append(out[1:])
        opt.step()
        if sched is not None:
            sched.step()
        module.lazy_reset_grad()
        after.append(opt.get_learning_rate())
        for n in frozen:
            now = np.array(state.parameters[n].data)
            tracked[n].append(now)
            changed_in_call |= {n} if not np.array_equal(prev[n], mid[n]) else set()
            changed_in_step |= {n} if not np.array_equal(mid[n], now) else set()
    info = {
        "steps": STEPS,
        "lr": run.spec.lr,
        "losses": [loss_of(v) for v in losses],
        "loss_return": {
            "type": f"{type(losses[0]).__module__}.{type(losses[0]).__name__}",
            "shape": list(np.shape(losses[0])),
            "dtype": str(np.asarray(losses[0]).dtype),
        },
        "lr_before_each_step": before,
        "lr_after_each_step": after,
    }
    arrays = {
        "train_losses": np.array([loss_of(v) for v in losses], np.float32),
        "lr_after_each_step": np.array(after, np.float32),
    }
    names = module.output_names()[1:]
    for j, name in enumerate(names):
        arrays[f"train_output__{name}"] = np.stack([e[j] for e in extra])
    for n in frozen:
        arrays[f"running_stats_after_step__{n}"] = np.stack(tracked[n])
    if frozen:
        info["frozen_params_changed_during_module_call"] = sorted(changed_in_call)
        info["frozen_params_changed_during_optimizer_step"] = sorted(changed_in_step)
    return info, arrays


def scheduler_check(sched: dict, info: dict) -> dict:
    """Compare recorded lrs with the documented formula (step = completed optimizer steps)."""
    want_before = [documented_lr(sched, i) for i in range(STEPS)]
    want_after = [documented_lr(sched, i + 1) for i in range(STEPS)]
    return {
        "documented_lr_before_each_step": want_before,
        "max_abs_diff_before": max(abs(a - b) for a, b in zip(info["lr_before_each_step"], want_before)),
        "max_abs_diff_after": max(abs(a - b) for a, b in zip(info["lr_after_each_step"], want_after)),
    }


def scheduler_keyword_probe(run: FixtureRun) -> dict:
    """LinearLRScheduler called with the documented keywords: are they swapped too?"""
    s = run.spec.scheduler
    _, module = run.open()
    opt = Optimizer(str(run.art / "optimizer_model.onnx"), module)
    sched = LinearLRScheduler(
        opt,
        warmup_step_count=s["warmup_step_count"],
        total_step_count=s["total_step_count"],
        initial_lr=s["initial_lr"],
    )
    lrs = []
    for _ in range(5):
        lrs.append(opt.get_learning_rate())
        opt.step()  # no train step yet: zero gradients, parameters unchanged, step count advances
        sched.step()
    swapped = {**s, "warmup_step_count": s["total_step_count"], "total_step_count": s["warmup_step_count"]}
    return {
        "call": f"LinearLRScheduler(optimizer, warmup_step_count={s['warmup_step_count']}, "
        f"total_step_count={s['total_step_count']}, initial_lr={s['initial_lr']})",
        "lr_before_steps_0_to_4": lrs,
        "matches_swapped_counts": all(abs(a - documented_lr(swapped, i)) < 1e-9 for i, a in enumerate(lrs)),
    }


def evaluate(run: FixtureRun, module: Module) -> tuple[float, dict]:
    """module.eval(); module(eval batch) -> eval loss and eval_output__<name> arrays."""
    module.eval()
    out = as_tuple(module(*run.batch("eval")))
    names = module.output_names()[1:]
    return loss_of(out), {f"eval_output__{n}": np.asarray(v) for n, v in zip(names, out[1:])}
