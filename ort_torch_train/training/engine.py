"""The training engine: train and eval steps of ONNX forward graphs over a TrainingState's parameters.

Train steps run forward and backward with ORT's gradient semantics: gradients accumulate across
steps until ``lazy_reset_grad()``, after which the next step overwrites them. With ``compile`` a
train step is one compiled graph (``compile/step.py``), and ``train_and_update`` adds the
optimizer's update to that graph. Everything else (mixed precision, recompute, data parallelism)
comes from the ``EngineOptions``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

import onnx
import torch
from torch import nn

from ort_torch_train.distributed.data_parallel import DataParallel
from ort_torch_train.errors import ModelError
from ort_torch_train.graph.layout import GraphLayout, eval_layout, training_layout
from ort_torch_train.graph.model_checks import check_eval_pair, check_model
from ort_torch_train.optim.engine import OptimizerEngine, UpdateProgram
from ort_torch_train.state.parameter_buffer import ParameterBuffer
from ort_torch_train.state.training_state import TrainingState
from ort_torch_train.training.blas_threads import blas_threads_for
from ort_torch_train.training.compile.cache import compile_cache_for
from ort_torch_train.training.compile.settings import FrozenArguments
from ort_torch_train.training.compile.step_spec import ParameterPlan
from ort_torch_train.training.forward_graph import ForwardGraph
from ort_torch_train.training.forward_models import eval_forward, train_forward
from ort_torch_train.training.one_graph_step import OneGraphSteps
from ort_torch_train.training.options import EngineOptions
from ort_torch_train.training.package.step_programs import StepPrograms, TrainProgram
from ort_torch_train.training.precision import MixedPrecision, autocast_or_null, backward, float32_outputs
from ort_torch_train.training.ranks import rank_strategies
from ort_torch_train.training.threads import process_threads

if TYPE_CHECKING:  # pipelining loads Dynamo's shape machinery: imported where used
    from ort_torch_train.distributed.pipeline import PipelineParallel

log = logging.getLogger(__name__)


class TrainingEngine:
    """Train and eval steps over ONNX training artifacts, executed by PyTorch, as ``options`` configure them.

    A plain object: a face binds the state's parameters to its own ``nn.Module`` and passes the mode
    (train or eval) to ``forward``; it calls ``tensors_moved()`` after moving the parameters. Compiled, it
    holds the compile cache ``options.compile_cache`` names (``compile_cache``; None: none). Its CPU steps
    follow the process's thread policy (``threads.py``).
    """

    def __init__(
        self,
        training_model: onnx.ModelProto,
        state: TrainingState,
        eval_model: onnx.ModelProto | None,
        options: EngineOptions,
    ) -> None:
        started = time.perf_counter()
        self.options = options
        self.training_state = state
        self.compile_cache = None if options.compile_arguments is None else compile_cache_for(options.compile_cache)
        self._threads = process_threads()
        names = list(state.params)
        self.train_layout = training_layout(training_model, names)
        check_model(training_model, "training model", self.train_layout.user_outputs)
        if eval_model is not None:
            check_model(eval_model, "eval model")
            check_eval_pair(training_model, eval_model, names)
        self.trainable_parameter_names = [n for n in self.train_layout.params if state.params[n].requires_grad]
        self._trainable_name_tuple = tuple(self.trainable_parameter_names)  # compared with a fused step's optimizer
        self._matching_optimizer: OptimizerEngine | None = None  # the last optimizer train_and_update checked
        self._buffer = ParameterBuffer(state, training_model, self.train_layout.params, self.trainable_parameter_names)
        self.eval_layout = eval_layout(eval_model, names) if eval_model is not None else None
        if options.tensor_parallel is not None or options.sharding is not None:  # parameters cut into shards
            state.require_loaded("perform sharded or tensor-parallel training")
        self._tensor_parallel = (  # Megatron's weight pairs sharded across the tp ranks (eval gathers them)
            None
            if options.tensor_parallel is None
            else options.tensor_parallel.plan(training_model, self.train_layout, state)
        )
        self.train_graph = train_forward(
            training_model, self.train_layout, options, self.trainable_parameter_names, self._tensor_parallel
        )
        self.eval_graph: ForwardGraph | None = None
        if eval_model is not None and self.eval_layout is not None:
            shared = self.train_graph.constants
            self.eval_graph = eval_forward(
                eval_model, self.eval_layout, options, shared, self.compile_cache, self._threads
            )
        train_params = self.train_layout.params
        self._train_params = [state.params[n] for n in train_params]
        plan = ParameterPlan.of(train_params, self.trainable_parameter_names)
        self._frozen_train_names = plan.frozen_names(train_params)
        self._views: tuple | None = None  # (state generation, trainable, frozen, grads) for compiled steps
        self._eval_params = [state.params[n] for n in self.eval_layout.params] if self.eval_layout else []
        self._eval_aliases: list[torch.Tensor] = []  # _detached_eval_params
        self._gradient_reset = _GradientReset()
        state.to(options.device)
        self._programs: StepPrograms | None = None  # the programs of options.programs, run instead of the steps here
        self._train_program: TrainProgram | None = None  # their train step over the state
        if options.programs is not None:
            graphs = (self.train_graph, self.eval_graph)
            self._programs = options.programs.open(
                training_model, eval_model, graphs, state, self.trainable_parameter_names
            )
            self._train_program = self._programs.bind_train(state)
        ranks = rank_strategies(self.train_graph, self.train_layout, state, options, self._tensor_parallel)
        self._data_parallel, self._pipeline = ranks  # gradients combined across ranks; a pipeline across them
        self._sharded = ranks.data_parallel is not None and ranks.data_parallel.shards_parameters
        # the state's parameters became their shards, or this pipeline stage's (the others: placeholders)
        self._gathers_parameters = self._sharded or options.pipeline is not None
        if self._gathers_parameters:
            self._train_params = [state.params[n] for n in train_params]
            self._eval_params = [state.params[n] for n in self.eval_layout.params] if self.eval_layout else []
        self._precision: MixedPrecision | None = None  # autocast and loss scaling (precision.py)
        if options.mixed_precision is not None:
            group = None if self._data_parallel is None else self._data_parallel.group  # ranks agree on skipping
            self._precision = MixedPrecision(
                options.mixed_precision, state, loss_scale=options.loss_scale, process_group=group
            )
        self._one_graph = OneGraphSteps(  # the compiled train steps (compile=True)
            self.train_graph,
            self._train_params,
            state,
            self.trainable_parameter_names,
            plan,
            FrozenArguments(options.compile_arguments),
            self.compile_cache,
            self._threads,
            self._parameter_views,
        )
        log.info("read the training model (layout, checks, constants) in %.2f s", time.perf_counter() - started)

    @property
    def precision(self) -> MixedPrecision | None:
        """Autocast and loss scaling, or None (float32 throughout)."""
        return self._precision

    @property
    def data_parallel(self) -> DataParallel | None:
        """What averages the gradients across ranks, or None (one process)."""
        return self._data_parallel

    @property
    def pipeline(self) -> PipelineParallel | None:
        """The pipeline the train steps run as, one stage per rank, or None."""
        return self._pipeline

    # steps ------------------------------------------------------------------------------------
    def forward(self, inputs: Sequence[torch.Tensor], training: bool) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The differentiable forward of the train (``training``) or eval graph, no backward."""
        graph, params = self._mode_graph(training)
        with autocast_or_null(self.precision, self.device):
            if training and self._data_parallel is not None and self._sharded:
                outputs = self._data_parallel.forward(self._on_device(inputs))  # runs on the shards
            else:
                outputs = graph(self._on_device(inputs), params)
        return outputs[0] if len(outputs) == 1 else outputs

    def train_step(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Forward and backward; gradients accumulate into the parameters' ``.grad``."""
        program, reset = self._train_program, self._gradient_reset
        if program is not None:  # it checks its inputs and the state's tensors itself (package/bound.py)
            outputs = program(inputs if type(inputs) is list else list(inputs), reset.pending)
            reset.pending = False
            return outputs
        self.training_state.require_loaded("perform TrainStep")
        inputs = self._on_device(inputs)
        if self._pipeline is not None:
            outputs = self._pipeline.train_step(inputs, reset.pending)
            reset.pending = False
            return outputs
        if self.options.compiles_whole_step and self.trainable_parameter_names:
            return self._compiled_step(inputs, None)
        data_parallel = self._data_parallel  # a failing forward leaves the gradients alone
        if data_parallel is None:
            module = self.train_graph.module_for(inputs, self._train_params)
            products = self.train_graph.matrix_products(module)
            forward = partial(module, *inputs, *self._train_params)
        else:
            products, forward = None, partial(data_parallel.forward, inputs)
        device = self.device
        self._threads.follow_load(device)
        with blas_threads_for(products, device):
            with autocast_or_null(self.precision, device):
                outputs = forward()
            if self._gradient_reset.pending:
                flat = self.training_state.current_flat(self.trainable_parameter_names)
                grads = self._parameter_views()[2] if flat is None else [flat.grads]
                if self._sharded:  # shards (DTensors) and whole tensors: no one foreach over both
                    for grad in grads:
                        grad.zero_()
                elif grads:
                    torch._foreach_zero_(grads)  # in place: the gradient tensors are never replaced
                self._gradient_reset.pending = False
            loss = outputs[0]
            if loss.requires_grad:
                backward(loss, self.precision)
        outputs = tuple(output.detach() for output in outputs)
        return outputs if self.precision is None else float32_outputs(outputs)

    def train_and_update(self, inputs: Sequence[torch.Tensor], optimizer: OptimizerEngine) -> tuple[torch.Tensor, ...]:
        """ORT's full step: ``train_step``, ``optimizer.step()``, ``lazy_reset_grad()``.

        With ``compile`` the three run as one compiled graph.
        """
        if optimizer is not self._matching_optimizer:  # its state and names are fixed: checked once
            if optimizer.state is not self.training_state or optimizer.param_names != self._trainable_name_tuple:
                raise ValueError(
                    "train_and_update: the optimizer must update this module's training state and "
                    f"trainable parameters {self.trainable_parameter_names}; it updates "
                    f"{list(optimizer.param_names)}"
                )
            self._matching_optimizer = optimizer
        program = self._train_program
        if program is not None:  # the train program, then the optimizer's (its own or its kernel): one pass
            reset = self._gradient_reset
            outputs = program(inputs if type(inputs) is list else list(inputs), reset.pending)
            reset.pending = False
            optimizer.step()
            reset.pending = True
            return outputs
        if self.options.compiles_whole_step and optimizer.fuses_into_step and optimizer.loss_scaler is None:
            self.training_state.require_loaded("perform TrainStep")
            outputs = self._compiled_step(self._on_device(inputs, self._train_params[0].device), optimizer)
        else:
            outputs = self.train_step(inputs)
            optimizer.step()
        self.lazy_reset_grad()
        return outputs

    def _compiled_step(self, inputs: list[torch.Tensor], optimizer: OptimizerEngine | None) -> tuple[torch.Tensor, ...]:
        reduction = None if self._data_parallel is None else self._data_parallel.compiled_reduction()
        outputs = self._one_graph.run(inputs, optimizer, self._gradient_reset.pending, reduction, self.precision)
        self._gradient_reset.pending = False
        return outputs

    def _parameter_views(
        self, check_tensors: bool = True
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """Detached views of the trainable and frozen parameters, and the gradients, for compiled steps: made
        again at a new state generation and, with ``check_tensors`` (flat buffers check their own), where a
        parameter's data or gradient was replaced behind the state's back (``param.data = ...``,
        ``param.grad = ...``)."""
        generation = self.training_state.generation
        views = self._views
        if views is None or views[0] != generation or (check_tensors and not self._views_still_behind(views)):
            params = self.training_state.params
            trainable = [params[n].detach() for n in self.trainable_parameter_names]
            frozen = [params[n].detach() for n in self._frozen_train_names]
            grads = [params[n].grad for n in self.trainable_parameter_names]
            views = self._views = (generation, trainable, frozen, grads)
        return views[1:]

    def _views_still_behind(self, views: tuple) -> bool:
        """Whether ``views`` (``_parameter_views``') still share the parameters' data and gradients."""
        params = self.training_state.params
        names = self.trainable_parameter_names
        if any(params[n].data_ptr() != view.data_ptr() for n, view in zip(names, views[1])):
            return False
        if any(params[n].grad is not grad for n, grad in zip(names, views[3])):
            return False
        return all(params[n].data_ptr() == view.data_ptr() for n, view in zip(self._frozen_train_names, views[2]))

    def update_program(self, optimizer_model: onnx.ModelProto) -> UpdateProgram | None:
        """The programs' optimizer step of ``optimizer_model`` over this state (``compile="aot"``: compiled or
        loaded now); None without programs compiled ahead of time, or a package built from another optimizer
        model."""
        return None if self._programs is None else self._programs.bind_update(self.training_state, optimizer_model)

    def eval_step(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Forward of the eval graph (inference semantics), no gradients."""
        self.training_state.require_loaded("perform EvalStep")
        if self.eval_graph is None:
            raise ModelError("Eval model was not provided: evaluation needs the eval model (eval_model_uri).")
        inputs = self._on_device(inputs)
        if self._programs is not None:
            return self._programs.eval_step(inputs, self._detached_eval_params())
        params: Sequence[torch.Tensor]
        if self._gathers_parameters:  # gathered from every rank's shards or stages
            with torch.no_grad():
                params = [self.training_state.whole_parameter(name) for name in self._layout(False).params]
            module = self.eval_graph.module_for(inputs, params)
        else:
            module = self.eval_graph.module_for(inputs, self._eval_params)
            params = self._eval_params if self.eval_graph.compile_arguments is None else self._detached_eval_params()
        products = self.eval_graph.matrix_products(module)
        device = self.device
        self._threads.follow_load(device)
        with torch.no_grad(), blas_threads_for(products, device), autocast_or_null(self.precision, device):
            outputs = module(*inputs, *params)
        return outputs if self.precision is None else float32_outputs(outputs)

    def _detached_eval_params(self) -> list[torch.Tensor]:
        """Detached aliases of the eval graph's parameters (a precompiled graph takes plain tensors),
        made again when a parameter's tensor was replaced."""
        aliases = self._eval_aliases
        if len(aliases) != len(self._eval_params) or any(
            alias.data_ptr() != param.data_ptr() for alias, param in zip(aliases, self._eval_params)
        ):
            aliases = self._eval_aliases = [param.detach() for param in self._eval_params]
        return aliases

    def lazy_reset_grad(self) -> None:
        """Make the next train step overwrite the gradients instead of adding to them."""
        self._gradient_reset.pending = True

    def graph(self, training: bool) -> ForwardGraph:
        """The train (``training``) or eval graph; raises ModelError for an eval graph not given."""
        return self._mode_graph(training)[0]

    def _mode_graph(self, training: bool) -> tuple[ForwardGraph, list[nn.Parameter]]:
        if training:
            return self.train_graph, self._train_params
        if self.eval_graph is None:
            raise ModelError("Eval model was not provided: evaluation needs the eval model (eval_model_uri).")
        return self.eval_graph, self._eval_params

    def _on_device(self, inputs: Sequence[torch.Tensor], device: torch.device | None = None) -> list[torch.Tensor]:
        """``inputs``, the tensors among them moved to ``device`` (None: the parameters')."""
        device = self.device if device is None else device
        if device.type == "cpu":  # a tensor's is_cpu costs less than its device
            return [t.to(device) if isinstance(t, torch.Tensor) and not t.is_cpu else t for t in inputs]
        return [
            t.to(device, non_blocking=True) if isinstance(t, torch.Tensor) and t.device != device else t for t in inputs
        ]

    # names ------------------------------------------------------------------------------------
    def input_names(self, training: bool) -> list[str]:
        """User input names of the training graph (``training``) or eval graph."""
        return list(self._layout(training).user_inputs)

    def output_names(self, training: bool) -> list[str]:
        """User output names of the training graph (``training``) or eval graph."""
        return list(self._layout(training).user_outputs)

    def _layout(self, training: bool) -> GraphLayout:
        if training:
            return self.train_layout
        if self.eval_layout is None:
            raise ModelError("Eval model was not provided: it has no eval inputs or outputs.")
        return self.eval_layout

    # contiguous parameter buffers -------------------------------------------------------------
    def parameters_size(self, trainable_only: bool = True) -> int:
        """Number of elements of the (trainable) parameters."""
        return self._buffer.size(trainable_only)

    def contiguous_parameters(self, trainable_only: bool = False) -> torch.Tensor:
        """A 1-D float32 copy of the parameters, in the training graph's parameter order."""
        return self._buffer.copy_out(trainable_only, self.device)

    def copy_buffer_to_parameters(self, buffer: torch.Tensor, trainable_only: bool = True) -> None:
        """Copy a 1-D float32 buffer into the parameters (completes a nominal state)."""
        self._buffer.copy_in(buffer, trainable_only, self.device)

    # device -----------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """The device holding the parameters (cpu without any)."""
        return self.training_state.device

    def tensors_moved(self) -> None:
        """Follow the parameters to their new tensors (after ``nn.Module._apply`` moved or converted them):
        the optimizer's moments move to their parameters' devices, views and specialised graphs go."""
        self.training_state.follow_parameters()
        self._views = None
        self.train_graph.clear()
        self._one_graph.forget()
        if self.eval_graph is not None:
            self.eval_graph.clear()


class _GradientReset:
    """Whether the next train step overwrites the gradients (a plain object: cheap to flip every step)."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending = True  # ORT's gradients start at zero for each new Module: the first step overwrites
