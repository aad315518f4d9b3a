"""``fit``: ORT's training loop over any iterable of batches (a DataLoader, a list, a generator), with
callbacks for logging, evaluation and checkpoints.

Each optimizer step is ORT's loop: ``grad_accum`` calls ``module(*batch)`` (gradients add up, as in
ORT, or are averaged with ``grad_accum_reduction="mean"`` as in HF and Lightning; under data
parallelism all but the last inside ``module.no_sync()``), then ``optimizer.step()``,
``scheduler.step()``, ``module.lazy_reset_grad()``; with one batch per step ``module.step(optimizer,
*batch)`` does the three at once (one compiled graph with ``compile``). Compilation, mixed precision,
recompute and data parallelism are the Module's options. The step count is the optimizer's, kept in
the checkpoint, so ``max_steps`` is a total that a resumed run reaches without overshooting.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from itertools import islice
from types import FrameType
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist

from ort_torch_train.errors import InputError
from ort_torch_train.progress import ProgressBar, output_above_bar
from ort_torch_train.trainer.batches import model_inputs
from ort_torch_train.trainer.data import data_position, resumable_sampler
from ort_torch_train.trainer.fit_state import Callback, FitResult, FitState, TrainingDiverged
from ort_torch_train.trainer.loader_state import StatefulLoader, restore_loader_state, warn_if_order_is_lost
from ort_torch_train.trainer.metric_base import Metric, StatefulMetric, as_metric
from ort_torch_train.trainer.metrics import evaluate, metric_named
from ort_torch_train.trainer.protocols import FitModule, FitOptimizer, Scheduler

__all__ = ["Callback", "FitResult", "FitState", "TrainingDiverged", "fit"]

log = logging.getLogger(__name__)


def fit(
    module: FitModule,
    optimizer: FitOptimizer,
    data: Iterable[Any],
    *,
    max_steps: int | None = None,
    epochs: int | None = None,
    grad_accum: int = 1,
    grad_accum_reduction: Literal["sum", "mean"] = "sum",
    scheduler: Scheduler | None = None,
    eval_data: Iterable[Any] | None = None,
    eval_every: int | None = None,
    metrics: Sequence[str | Metric | StatefulMetric] = ("loss",),
    callbacks: Sequence[Callback] = (),
    progress: bool | str = False,
    handle_interrupt: bool = True,
) -> FitResult:
    """Train ``module`` with ``optimizer`` until the optimizer's step count is ``max_steps`` or the data's
    epoch count is ``epochs`` (whichever comes first).

    Batches are sequences of the training model's inputs (or mappings by input name). ``eval_data``
    is evaluated with ``metrics`` (names from ``trainer.metrics``, Metric objects or torchmetrics metrics) every
    ``eval_every`` steps and at the end. ``progress``: a tqdm bar (a string: its description); while
    it runs, warnings and console log records go above it, and so does ``trainer.print``.
    ``grad_accum_reduction``: ``"sum"`` (ORT's semantics: ``grad_accum`` micro-batches give the sum of
    their gradients) or ``"mean"`` (their average, as HF and Lightning do: a learning rate ported from
    them keeps its meaning). ``handle_interrupt``: the first Ctrl-C ends the run after the current step (callbacks then save)
    and the result says ``interrupted``; a second one interrupts at once.

    Examples:
        ```python
        import numpy as np
        from ort_torch_train.api import CheckpointState, Module, Optimizer

        state = CheckpointState.load_checkpoint("artifacts/checkpoint")  # the README Quick start's artifacts
        module = Module("artifacts/training_model.onnx", state, "artifacts/eval_model.onnx")
        optimizer = Optimizer("artifacts/optimizer_model.onnx", module)
        x = np.random.default_rng(0).standard_normal((16, 20), dtype=np.float32)
        y = x[:, :5].argmax(axis=1)

        from ort_torch_train.trainer import Callback, array_loader, fit, print


        class PrintEvery(Callback):
            def on_step_end(self, run) -> None:
                if run.step % 5 == 0:
                    print(f"step {run.step}: loss {run.loss:.3f}")  # above the progress bar


        loader = array_loader([x, y], batch_size=8, seed=0)
        result = fit(module, optimizer, loader, max_steps=10, eval_data=[(x, y)], callbacks=[PrintEvery()], progress=True)
        print(result.last_step, result.metrics["loss"])
        ```
    """
    if max_steps is None and epochs is None:
        raise InputError("fit: give max_steps (a total step count) or epochs")
    if grad_accum < 1:
        raise InputError(f"grad_accum: expected an integer >= 1, got {grad_accum!r}")
    if grad_accum_reduction not in ("sum", "mean"):
        raise InputError(f"grad_accum_reduction: expected 'sum' or 'mean', got {grad_accum_reduction!r}")
    if eval_every is not None and eval_data is None:
        raise InputError("eval_every: needs eval_data")
    optimizer_state = module.training_state.optimizer
    if optimizer_state is None:
        raise InputError("fit: the module's state has no optimizer state; build the Optimizer first")
    evaluated = [metric_named(metric) if isinstance(metric, str) else as_metric(metric) for metric in metrics]
    run = FitState(module, optimizer, optimizer_state.step, optimizer_state.step)
    run.monitored = {metric.name: metric for metric in evaluated}
    _start_position(run, data, grad_accum)
    result = FitResult(run.start_step, run.start_step, [], 0.0, None, {}, False, None)
    stream = _batches(run, data, epochs)
    remaining = _total_steps(run, data, max_steps, epochs, grad_accum)
    run.target_step = None if remaining is None else run.step + remaining
    bar = ProgressBar(
        run.target_step,
        progress if isinstance(progress, str) else "training",
        disable=not progress,
        initial=run.step,  # the global step: a resumed run's bar continues its count
    )
    interrupt = deferred_interrupt() if handle_interrupt else nullcontext(lambda: False)
    try:
        with interrupt as interrupted, output_above_bar(bool(progress)):
            for callback in callbacks:
                callback.on_train_begin(run)
            started = wall_started = time.perf_counter()
            while (max_steps is None or run.step < max_steps) and not run.should_stop:
                micro_batches = list(islice(stream, grad_accum))
                if not micro_batches:
                    break
                run.loss = _train_step(module, optimizer, micro_batches, grad_accum_reduction == "mean")
                if scheduler is not None:
                    scheduler.step()
                run.step += 1
                if not math.isfinite(run.loss) and not optimizer.last_step_skipped:
                    raise TrainingDiverged(
                        f"the loss is {run.loss} at step {run.step}: training diverged (try a lower learning rate)"
                    )
                now = time.perf_counter()
                if result.first_step_seconds is None:
                    result.first_step_seconds = run.first_step_seconds = now - started
                    bar.reset_clock()
                    started = wall_started = now
                result.losses.append(run.loss)
                result.seconds = now - started
                run.steps_per_second = result.steps_per_second
                run.learning_rate = optimizer.get_learning_rate()
                bar.update(loss=run.loss, lr=run.learning_rate)
                if eval_data is not None and eval_every and run.step % eval_every == 0:
                    _evaluate(run, eval_data, evaluated, callbacks)
                for callback in callbacks:
                    callback.on_step_end(run)
                started += time.perf_counter() - now  # the rate counts training steps only
                if interrupted():
                    run.interrupted = True
                    break
            if max_steps is not None and run.step >= max_steps and not run.interrupted:
                run.stop_reason = None  # a stop asked for at the last step shortened nothing
            stopped = run.stop_reason
            if eval_data is not None and (not eval_every or run.step % eval_every or not result.losses):
                _evaluate(run, eval_data, evaluated, callbacks)
            run.stop_reason = stopped  # a stop asked for by the closing evaluation ends nothing
            if result.first_step_seconds is not None:
                result.wall_seconds = time.perf_counter() - wall_started
            bar.close()
            for callback in callbacks:
                callback.on_train_end(run)
    finally:
        stream.close()
        bar.close()
        for callback in callbacks:
            callback.close()
    result.last_step = run.step
    result.metrics = run.metrics
    result.interrupted = run.interrupted
    result.stop_reason = run.stop_reason
    return result


def _train_step(module: FitModule, optimizer: FitOptimizer, micro_batches: list[Any], average: bool) -> float:
    """One optimizer step over the micro-batches (their gradients summed, or ``average``d); the mean of
    their losses (over the ranks too)."""
    names = module.input_names()
    if len(micro_batches) == 1:
        losses = [loss_value(module.step(optimizer, *model_inputs(micro_batches[0], names)))]
    else:
        losses = []
        for index, batch in enumerate(micro_batches):
            local = module.data_parallel is not None and index < len(micro_batches) - 1
            with module.no_sync() if local else nullcontext():
                losses.append(loss_value(module(*model_inputs(batch, names))))
        if average:
            grads = [p.grad for p in module.training_state.params.values() if p.grad is not None]
            torch._foreach_div_(grads, len(micro_batches))
        optimizer.step()
        module.lazy_reset_grad()
    loss = sum(losses) / len(losses)
    data_parallel = module.data_parallel
    if data_parallel is not None:
        total = torch.tensor([loss], dtype=torch.float64, device=module.device)
        group = data_parallel.group
        dist.all_reduce(total, group=group)
        loss = float(total.item()) / dist.get_world_size(group)
    return loss


def _evaluate(run: FitState, data: Iterable[Any], metrics: list[Metric], callbacks: Sequence[Callback]) -> None:
    run.metrics = evaluate(run.module, data, metrics)
    for callback in callbacks:
        callback.on_evaluate(run, run.metrics)


def loss_value(outputs: Any) -> float:
    """The loss (first output) of a step's outputs as a float (the mean of an unreduced loss)."""
    loss = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
    if isinstance(loss, torch.Tensor):
        return float(loss.detach().float().mean())
    return float(np.mean(loss.numpy() if hasattr(loss, "numpy") else np.asarray(loss)))


def _start_position(run: FitState, data: Iterable[Any], grad_accum: int) -> None:
    """Where a resumed run continues in its data: the position stored in the checkpoint, else
    (an older checkpoint) the batches ``start_step`` steps consumed."""
    sampler = resumable_sampler(data)
    run.seed = sampler.seed if sampler is not None else None
    stored = data_position(run.properties, len(data) if hasattr(data, "__len__") else None)  # type: ignore[arg-type]
    if stored is not None:
        if stored.seed is not None and run.seed is not None and stored.seed != run.seed:
            log.warning("resuming with data seed %s; the checkpoint's data order used seed %s", run.seed, stored.seed)
        run.epoch, run.position = stored.epoch, stored.position
    elif run.start_step and hasattr(data, "__len__") and len(data):  # type: ignore[arg-type]
        run.epoch, run.position = divmod(run.start_step * grad_accum, len(data))  # type: ignore[arg-type]
    if isinstance(data, StatefulLoader) and sampler is None:
        run.loader = data
        run.loader_restored = restore_loader_state(run.properties, data)
    else:
        warn_if_order_is_lost(data, run.start_step)


def _batches(run: FitState, data: Iterable[Any], epochs: int | None) -> Generator[Any, None, None]:
    """The batches from ``run``'s position on, epoch after epoch; keeps ``run.epoch``/``run.position``."""
    sampler = resumable_sampler(data)
    while epochs is None or run.epoch < epochs:
        skip = 0
        if sampler is not None:
            sampler.set_position(run.epoch, run.position)
        else:
            set_epoch = getattr(getattr(data, "sampler", None), "set_epoch", None)
            if set_epoch is not None:
                set_epoch(run.epoch)
            skip = 0 if run.loader_restored else run.position  # an order we cannot seek in: replay it
            run.loader_restored = False
        seen = run.position
        for batch in iter(data):
            if skip:
                skip -= 1
                continue
            run.position += 1
            yield batch
        if seen == run.position == 0:
            raise InputError("data: yields no batches")
        run.epoch, run.position = run.epoch + 1, 0


def _total_steps(
    run: FitState, data: Iterable[Any], max_steps: int | None, epochs: int | None, grad_accum: int
) -> int | None:
    """The steps this run will take, when known (for the progress bar)."""
    totals = [] if max_steps is None else [max(max_steps - run.step, 0)]
    if epochs is not None and hasattr(data, "__len__"):
        batches = max((epochs - run.epoch) * len(data) - run.position, 0)  # type: ignore[arg-type]
        totals.append(math.ceil(batches / grad_accum))
    return min(totals) if totals else None


@contextmanager
def deferred_interrupt() -> Iterator[Callable[[], bool]]:
    """Within: the first SIGINT only sets a flag (read by the yielded function); a second one interrupts."""
    requested: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        if requested:
            raise KeyboardInterrupt
        requested.append(signum)
        log.info("interrupt received: finishing the current step")

    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread: keep the default behaviour
        yield lambda: False
        return
    try:
        yield lambda: bool(requested)
    finally:
        signal.signal(signal.SIGINT, previous)
