"""``Module``: the face of ``onnxruntime.training.api.Module`` over the training engine."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import onnx
import torch
from torch import nn

from ort_torch_train.adapters.registry import OpLibrary
from ort_torch_train.api.checkpoint_state import CheckpointState
from ort_torch_train.api.contiguous_parameters import ContiguousParameters
from ort_torch_train.api.ortvalue import from_tensors
from ort_torch_train.api.protocols import StepOptimizer
from ort_torch_train.api.step_inputs import StepInputs
from ort_torch_train.distributed.data_parallel import DataParallel
from ort_torch_train.distributed.pipeline_plan import PipelineOptions
from ort_torch_train.errors import DistributedError, InputTypeError, ModelError
from ort_torch_train.export.outputs import exportable_output_names
from ort_torch_train.graph.layout import GraphLayout, ModelSource, load_model
from ort_torch_train.graph.roles import check_slot
from ort_torch_train.lora.apply import add_lora_to_artifacts
from ort_torch_train.lora.config import LoraConfig
from ort_torch_train.lora.export import export_merged_model
from ort_torch_train.optim.engine import OptimizerEngine, UpdateProgram
from ort_torch_train.state.training_state import TrainingState
from ort_torch_train.training.binding import bind_parameters
from ort_torch_train.training.compile.cache import CompileCacheSetting
from ort_torch_train.training.dynamic_shapes import DynamicSetting
from ort_torch_train.training.engine import TrainingEngine
from ort_torch_train.training.forward_graph import ForwardGraph
from ort_torch_train.training.options import EngineOptions
from ort_torch_train.training.precision import MixedPrecision
from ort_torch_train.training.recompute import RecomputeSetting

if TYPE_CHECKING:  # pipelining loads Dynamo's shape machinery: imported where used
    from ort_torch_train.distributed.pipeline import PipelineParallel


class Module(ContiguousParameters, nn.Module):
    """Trains ONNX training artifacts with PyTorch, behind ORT's ``Module`` API.

    ``module(*inputs)`` is ORT's step: in train mode forward + backward (gradients accumulate
    until ``lazy_reset_grad()``), in eval mode the eval graph. numpy in -> numpy out, torch in ->
    torch out (on the module's device), OrtValue in -> OrtValue out. It is also an ``nn.Module``:
    ``parameters()``, ``state_dict()``, ``.to(device)`` and ``forward()`` (differentiable, no backward).
    ``compile=True`` (or a torch.compile mode such as "max-autotune", or a dict of torch.compile
    arguments such as ``{"options": {"cpp_wrapper": True}}``) runs each train step (forward and
    backward) as one torch.compile'd graph and the eval graph through torch.compile;
    ``step(optimizer, *inputs)`` puts the optimizer's update into the train step's graph too.
    ``compile="package:DIR"`` runs the train and eval steps through a package compiled ahead of time
    (``ort-torch-train package``; ``training/package/``) with no compilation, on the CPU in float32, and an
    Optimizer over the module runs the package's update where it was built from the same optimizer model.
    ``compile="aot"`` runs the same programs, each compiled the first time it is needed (train: the first
    train step; optimizer: when an Optimizer binds its update; eval: the first eval step) into the compile
    cache, from which a later Module or process with the same artifacts, torch and CPU loads them with no
    compilation (``training/package/on_demand.py``); CPU, float32, as a package.
    ``mixed_precision="bf16"|"fp16"`` runs the forward under ``torch.autocast`` with float32 master
    weights; "fp16" adds GradScaler's dynamic loss scaling (the Optimizer unscales, skips inf/nan
    steps and reports them; the scale is saved in the checkpoint's properties). ``recompute=k`` (or
    True: about sqrt(op count)) runs the train forward as k segments under torch.utils.checkpoint,
    keeping only the tensors between segments for backward (less activation memory, one more
    forward; see ``training/recompute.py``); with ``compile`` the train forward is compiled with
    its checkpointed segments (AOTAutograd recomputes them in the compiled backward) and the
    optimizer update runs after it, not in the same graph. ``session_options`` (an ORT
    SessionOptions) is accepted for compatibility and not used: CPU steps run on torch's threads, whose
    count follows the cores other processes leave free unless pinned (``set_threads``).
    Compiled steps are saved in and loaded from a per-user compile cache (``compile_cache``: None the
    default directory or the one ``load_compile_cache`` chose, a path another, False none, for this
    Module only; see ``training/compile/cache.py``).
    With ``compile``, ``dynamic`` (default True) lets the axes the ONNX graph leaves symbolic (batch,
    sequence) take any size >= 1 in one compiled step: a last partial batch, the eval set and new
    sequence lengths reuse it (a dict ``{input name: [axes]}`` picks the axes, False compiles each
    new shape on its own). Eager runs convert the graph for each of the first three input shapes
    only: the third serves the later ones alike. An axis whose size the converted graph needs as a constant stays
    fixed, with an INFO log line saying why (see docs/performance.md, "Dynamic shapes").
    ``distributed=True`` trains data-parallel on torch.distributed (``process_group``, default the
    default group): gradients are averaged across ranks at each train step, steps inside
    ``no_sync()`` accumulate locally (see ``distributed/data_parallel.py``); eval stays local.
    ``sharding="zero2"|"zero3"`` trains sharded on FSDP2 (implies ``distributed``): each rank keeps
    shards of the gradients and moments ("zero2") and of the parameters too, gathered per layer
    ("zero3"); see ``distributed/fully_sharded.py`` and docs/scaling.md.
    ``lora=LoraConfig(...)`` adds low-rank adapters beside the targeted weights: the state gains them
    as its only trainable parameters, the rest is frozen, and ``export_model_for_inferencing`` merges
    them (docs/lora.md).

    Args:
        train_model_uri: the training model (path, bytes or ModelProto; ONNX or ORT format, told by the content).
        state: the checkpoint state whose parameters the module trains (bound, not copied).
        eval_model_uri: the eval model, for eval mode and the exports (optional).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` (or a ``torch.device``) where parameters and steps live.
        session_options: ORT's SessionOptions, accepted for compatibility and not used.
        compile: ``True``, a torch.compile mode or a dict of torch.compile arguments: compiled steps;
            ``"package:DIR"``: the steps of a package built ahead of time; ``"aot"``: those programs compiled
            on demand into the compile cache.
        distributed: train data-parallel on torch.distributed (gradients averaged across ranks).
        process_group: the ranks' group with ``distributed`` (default: the default group).
        gradient_combination: with ``distributed``, "average" (default) or "adasum" (eager steps, a
            power-of-two number of ranks; docs/scaling.md).
        mixed_precision: ``"bf16"`` or ``"fp16"`` autocast with float32 master weights (None: off).
        recompute: activation recomputation: segment count, ``True`` (about sqrt of the op count) or None.
        lora: a ``LoraConfig``: add low-rank adapters, the only trainable parameters.
        compile_cache: where compiled steps are cached: None the default, a path, or False for none.
        dynamic: with ``compile``, which symbolic axes stay dynamic: True all, a dict of axes per input, False none.
        pipeline: a ``PipelineOptions``: train steps run as a pipeline, one stage per rank of ``process_group``
            (default: the default group), eager float32; each rank then holds its stage's parameters, gradients
            and moments only, and whole values, saves and eval steps are collectives (docs/scaling.md).
        custom_ops: operators of the session's own (an ``adapters.OpLibrary``, as the C API makes from a
            registered custom-op library), converted before the registry's.
        tensor_parallel_size: split Megatron's MLP pairs and attention heads across this many ranks of the default
            group, each rank holding its shard of their weights, gradients and moments (eager steps; with
            ``distributed`` the other ranks' factor is data parallel; docs/scaling.md).
        sharding: "zero2" or "zero3": sharded data parallelism on FSDP2 (recompute=True recomputes per
            layer unit; compiled, each layer unit compiles on its own, its checkpoint inside), or None.

    Examples:
        ```python
        import numpy as np
        from ort_torch_train.api import CheckpointState, Module, Optimizer

        state = CheckpointState.load_checkpoint("artifacts/checkpoint")  # the README Quick start's artifacts
        module = Module("artifacts/training_model.onnx", state, "artifacts/eval_model.onnx")
        optimizer = Optimizer("artifacts/optimizer_model.onnx", module)
        x = np.random.default_rng(0).standard_normal((16, 20), dtype=np.float32)
        y = x[:, :5].argmax(axis=1)
        module.train()
        loss = module(x, y)  # forward and backward: the gradients add up
        optimizer.step()
        module.lazy_reset_grad()
        module.eval()
        eval_loss = module(x, y)
        module.export_model_for_inferencing("example_inference.onnx", ["logits"])
        ```
    """

    def __init__(
        self,
        train_model_uri: ModelSource,
        state: CheckpointState | TrainingState,
        eval_model_uri: ModelSource | None = None,
        device: str = "cpu",
        session_options: Any = None,
        *,
        compile: bool | str | dict = False,
        distributed: bool = False,
        process_group: Any = None,
        mixed_precision: str | None = None,
        recompute: RecomputeSetting = None,
        lora: LoraConfig | None = None,
        compile_cache: CompileCacheSetting = None,
        dynamic: DynamicSetting = True,
        gradient_combination: str = "average",
        pipeline: PipelineOptions | None = None,
        custom_ops: OpLibrary | None = None,
        tensor_parallel_size: int = 1,
        sharding: str | None = None,
    ) -> None:
        training_model = load_model(train_model_uri, "training model")
        eval_model = load_model(eval_model_uri, "eval model") if eval_model_uri is not None else None
        check_slot(training_model, "training_model", "train_model_uri")
        if eval_model is not None:
            check_slot(eval_model, "eval_model", "eval_model_uri")
        options = EngineOptions.of(
            device=device,
            compile=compile,
            mixed_precision=mixed_precision,
            recompute=recompute,
            distributed=distributed,
            process_group=process_group,
            compile_cache=compile_cache,
            dynamic=dynamic,
            gradient_combination=gradient_combination,
            pipeline=pipeline,
            custom_ops=custom_ops,
            tensor_parallel_size=tensor_parallel_size,
            sharding=sharding,
        )
        if lora is not None:
            if not isinstance(lora, LoraConfig):
                raise InputTypeError(f"lora: expected an ort_torch_train.lora.LoraConfig, got {type(lora).__name__}")
            training_model, eval_model = add_lora_to_artifacts(
                training_model, eval_model, training_state_of(state), lora
            )
        super().__init__()
        self._engine = TrainingEngine(training_model, training_state_of(state), eval_model, options)
        bind_parameters(self, self._engine.training_state.params)
        eval_graph = self._engine.eval_graph  # each mode's user inputs, by ``self.training``: eval, train
        self._step_inputs: tuple[StepInputs | None, StepInputs] = (
            None if eval_graph is None else StepInputs(eval_graph, self._engine.input_names(False)),
            StepInputs(self._engine.train_graph, self._engine.input_names(True)),
        )
        self.checkpoint_state = state
        self.eval_model = eval_model
        self.session_options = session_options

    @property
    def _ddp_params_and_buffers_to_ignore(self) -> list[str]:
        """Read by DistributedDataParallel's constructor: a Module refuses to be wrapped."""
        raise DistributedError(
            "Module must not be wrapped in DistributedDataParallel (its call runs the backward "
            "inside DDP's forward, and Module.step would bypass DDP): construct it with "
            "Module(..., distributed=True) and keep ORT's loop"
        )

    # the engine's parts ------------------------------------------------------------------------
    @property
    def training_state(self) -> TrainingState:
        """The TrainingState whose parameters this module trains."""
        return self._engine.training_state

    @property
    def trainable_parameter_names(self) -> list[str]:
        """The trained parameters' names, in the training graph's order."""
        return self._engine.trainable_parameter_names

    @property
    def train_layout(self) -> GraphLayout:
        """The training graph's inputs and outputs (user inputs, parameters, outputs)."""
        return self._engine.train_layout

    @property
    def eval_layout(self) -> GraphLayout | None:
        """The eval graph's inputs and outputs, or None without an eval model."""
        return self._engine.eval_layout

    @property
    def train_graph(self) -> ForwardGraph:
        """The converted training graph."""
        return self._engine.train_graph

    @property
    def eval_graph(self) -> ForwardGraph | None:
        """The converted eval graph, or None without an eval model."""
        return self._engine.eval_graph

    @property
    def precision(self) -> MixedPrecision | None:
        """Autocast and loss scaling (``mixed_precision``), or None (float32 throughout)."""
        return self._engine.precision

    @property
    def data_parallel(self) -> DataParallel | None:
        """What averages the gradients across ranks (``distributed=True``), or None."""
        return self._engine.data_parallel

    @property
    def pipeline(self) -> PipelineParallel | None:
        """The pipeline the train steps run as (``pipeline``), one stage per rank, or None."""
        return self._engine.pipeline

    @property
    def device(self) -> torch.device:
        """The device holding the parameters."""
        return self._engine.device

    @property
    def distributed(self) -> bool:
        """Whether gradients are averaged across the ranks of a process group."""
        return self._engine.data_parallel is not None

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Train steps inside accumulate gradients locally; the next step outside averages them across ranks."""
        data_parallel = self._engine.data_parallel
        if data_parallel is None:
            raise DistributedError("Module.no_sync needs a distributed Module (Module(..., distributed=True))")
        with data_parallel.no_sync():
            yield

    def __call__(self, *user_inputs: Any) -> Any:
        training = self.training
        engine = self._engine
        inputs = self._step_inputs[training]
        if inputs is None:
            raise ModelError("Eval model was not provided: evaluation needs the eval model (eval_model_uri).")
        tensors, kind = inputs.tensors(user_inputs)
        with engine.training_state.lock:
            if not training:
                return from_tensors(engine.eval_step(tensors), kind)
            data_parallel = engine.data_parallel
            if data_parallel is None:
                return from_tensors(engine.train_step(tensors), kind)
            with data_parallel.collective_errors("Module train step"):
                return from_tensors(engine.train_step(tensors), kind)

    def step(self, optimizer: StepOptimizer, *user_inputs: Any) -> Any:
        """One full training step: ``module(*inputs)``, ``optimizer.step()``, ``module.lazy_reset_grad()``.

        Returns what ``module(*inputs)`` returns. With ``compile=True`` the forward, backward and
        update run as one compiled graph. Needs train mode.
        """
        if not self.training:
            raise RuntimeError("Module.step trains: call module.train() first (it is in eval mode)")
        engine_for_step = getattr(optimizer, "engine_for_step", None)
        if engine_for_step is None:  # a clear error for another object than StepOptimizer
            raise InputTypeError(f"optimizer: expected an ort_torch_train Optimizer, got {type(optimizer).__name__}")
        engine = self._engine
        tensors, kind = self._step_inputs[1].tensors(user_inputs)
        with engine.training_state.lock:
            data_parallel = engine.data_parallel
            if data_parallel is None:
                return from_tensors(engine.train_and_update(tensors, engine_for_step()), kind)
            with data_parallel.collective_errors("Module.step"):
                return from_tensors(engine.train_and_update(tensors, engine_for_step()), kind)

    # the engine's steps ------------------------------------------------------------------------
    def forward(self, *inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The differentiable forward of the current mode (train or eval graph), no backward."""
        return self._engine.forward(inputs, self.training)

    def train_step(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Forward and backward of the training graph; gradients accumulate into the parameters' ``.grad``."""
        return self._engine.train_step(inputs)

    def train_and_update(self, inputs: Sequence[torch.Tensor], optimizer: OptimizerEngine) -> tuple[torch.Tensor, ...]:
        """ORT's full step: ``train_step``, ``optimizer.step()``, ``lazy_reset_grad()`` (one graph with ``compile``)."""
        return self._engine.train_and_update(inputs, optimizer)

    def eval_step(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Forward of the eval graph (inference semantics), no gradients."""
        return self._engine.eval_step(inputs)

    def update_program(self, optimizer_model: onnx.ModelProto) -> UpdateProgram | None:
        """The update of this module's programs compiled ahead of time (``compile="package:DIR"``, where the
        package was built from ``optimizer_model``; ``compile="aot"``: compiled or loaded now) over its state; else
        None (the Optimizer then runs its own kernel)."""
        return self._engine.update_program(optimizer_model)

    def input_names(self, training: bool | None = None) -> list[str]:
        """User input names of the training graph (train mode) or eval graph (eval mode)."""
        return self._engine.input_names(self.training if training is None else training)

    def output_names(self, training: bool | None = None) -> list[str]:
        """User output names of the training graph (train mode) or eval graph (eval mode)."""
        return self._engine.output_names(self.training if training is None else training)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Module:
        super()._apply(fn, recurse)
        self._engine.tensors_moved()
        return self

    def lazy_reset_grad(self) -> None:
        """Make the next train step overwrite the gradients instead of adding to them."""
        with self._engine.training_state.lock:
            self._engine.lazy_reset_grad()

    def exportable_output_names(self) -> list[str]:
        """Names ``export_model_for_inferencing`` takes: the model's outputs before the loss, then the loss.

        ``output_names()`` lists only the loss, as in ORT. Any other value of the eval graph works too.
        """
        if self.eval_model is None:
            raise ModelError("Eval model was not provided: it has no outputs to export.")
        return exportable_output_names(self.eval_model, self.training_state.params)

    def export_model_for_inferencing(
        self, inference_model_uri: str | os.PathLike, graph_output_names: list[str]
    ) -> None:
        """Write the eval graph, cut to ``graph_output_names``, with the current parameters baked in."""
        export_merged_model(self.eval_model, self.training_state, inference_model_uri, graph_output_names)


def training_state_of(state: CheckpointState | TrainingState) -> TrainingState:
    """The core TrainingState behind a CheckpointState (or the TrainingState itself)."""
    if isinstance(state, CheckpointState):
        return state.training_state
    if isinstance(state, TrainingState):
        return state
    raise InputTypeError(f"state: expected a CheckpointState (or its TrainingState), got {type(state).__name__}")
