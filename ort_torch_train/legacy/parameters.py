"""``TrainingParameters``: the configuration of the legacy ``onnxruntime.TrainingSession``.

Defaults are ORT's (``orttraining_pybind_state.cc``, struct ``TrainingParameters``, ORT 1.13). Like
the pybind class, an instance accepts only the known attribute names (a typo raises AttributeError).
``check_supported`` raises NotImplementedError for the settings this project cannot honour.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from ort_torch_train.legacy.optimizers import LEGACY_OPTIMIZERS
from ort_torch_train.training.recompute_patterns import RecomputePlan

OPTIMIZERS = tuple(LEGACY_OPTIMIZERS)  # the training_optimizer_name values

SLICED_REASON = (
    "ORT's sliced_* name the graph inputs and outputs that its pipeline cuts into micro-batches (their axes "
    "and micro-batch shapes); tensor parallelism (horizontal_parallel_size) slices weights, found by pattern, "
    "and the pipeline here splits every input on axis 0 (num_pipeline_micro_batches), so no per-tensor "
    "schema describes what either does (docs/scaling.md, Legacy settings that cannot apply)"
)
# setting -> (value that is honoured, why any other value is not)
UNSUPPORTED_SETTINGS: dict[str, tuple[Any, str]] = {
    "use_memory_efficient_gradient": (
        False,
        "ORT's memory-efficient gradient graph is not implemented "
        "(the recompute settings and Module(recompute=k) save activation "
        "memory with torch.utils.checkpoint)",
    ),
    "set_gradients_as_graph_outputs": (False, "gradients as graph outputs are not implemented"),
    "sliced_schema": ({}, SLICED_REASON),
    "sliced_axes": ({}, SLICED_REASON),
    "sliced_tensor_names": ([], SLICED_REASON),
    "model_after_graph_transforms_path": ("", "ORT's intermediate training graphs are not produced here"),
    "model_with_gradient_graph_path": ("", "ORT's intermediate training graphs are not produced here"),
    "model_with_training_graph_path": ("", "ORT's intermediate training graphs are not produced here"),
}


class TrainingParameters:
    """Configuration of a legacy TrainingSession (``onnxruntime.TrainingParameters``).

    ``use_mixed_precision`` runs the forward under fp16 autocast with float32 weights and loss scaling:
    ``loss_scale`` 0 is dynamic (GradScaler semantics: 2**16, x2 after 2000 clean steps, x0.5 and the
    update skipped on inf/nan gradients), > 0 a static scale (inf/nan updates are skipped too).
    ``use_fp16_moments`` stores the Adam/Lamb moments in float16 (the update math stays float32).
    ``propagate_cast_ops_*`` are accepted and have no effect (autocast decides the casts).
    ``gelu_recompute``, ``attn_dropout_recompute`` and ``transformer_layer_recompute`` (with
    ``number_recompute_layers``: 0 = every layer but the last, ORT's default) recompute those
    subgraphs in backward with torch.utils.checkpoint (``training/recompute_patterns.py``); with
    ``deepspeed_zero_stage`` 2 or 3, ``transformer_layer_recompute`` makes each numbered layer one sharding
    unit, its parameters gathered together (``distributed/layer_units.py``).
    """

    __slots__ = (
        "loss_output_name",
        "weights_to_train",
        "weights_not_to_train",
        "immutable_weights",
        "training_optimizer_name",
        "lr_params_feed_name",
        "optimizer_attributes_map",
        "optimizer_int_attributes_map",
        "optimizer_initial_state",
        "gradient_accumulation_steps",
        "enable_grad_norm_clip",
        "loss_scale",
        "use_mixed_precision",
        "use_fp16_moments",
        "propagate_cast_ops_level",
        "propagate_cast_ops_allow",
        "gelu_recompute",
        "attn_dropout_recompute",
        "transformer_layer_recompute",
        "number_recompute_layers",
        "world_rank",
        "world_size",
        "data_parallel_size",
        "allreduce_post_accumulation",
        "deepspeed_zero_stage",
        "enable_adasum",
        "pipeline_parallel_size",
        "num_pipeline_micro_batches",
        "pipeline_cut_info_string",
        "horizontal_parallel_size",
        *UNSUPPORTED_SETTINGS,
    )

    def __init__(self) -> None:
        self.loss_output_name: str = ""
        self.weights_to_train: set[str] = set()
        self.weights_not_to_train: set[str] = set()
        # op type -> [(input index, scalar value)]: scalar float initializers left untrained
        self.immutable_weights: dict[str, list[tuple[int, float]]] = {}
        self.training_optimizer_name: str = ""
        self.lr_params_feed_name: str = "Learning_Rate"
        self.optimizer_attributes_map: dict[str, dict[str, float]] = {}
        self.optimizer_int_attributes_map: dict[str, dict[str, int]] = {}
        self.optimizer_initial_state: dict[str, dict[str, Any]] = {}
        self.gradient_accumulation_steps: int = 1
        self.enable_grad_norm_clip: bool = True
        self.loss_scale: float = 0.0
        self.use_mixed_precision: bool = False
        self.use_fp16_moments: bool = False
        self.propagate_cast_ops_level: int = 1
        self.propagate_cast_ops_allow: list[str] = []
        self.gelu_recompute: bool = False
        self.attn_dropout_recompute: bool = False
        self.transformer_layer_recompute: bool = False
        self.number_recompute_layers: int = 0
        # data parallelism on torch.distributed (legacy/distributed.py)
        self.world_rank: int = 0
        self.world_size: int = 1
        self.data_parallel_size: int = 1
        self.allreduce_post_accumulation: bool = False
        self.deepspeed_zero_stage: int = (
            0  # 1: optimizer state sharded (legacy/zero.py); 2, 3: FSDP2 (legacy/sharded.py)
        )
        self.enable_adasum: bool = False  # gradients combined by Adasum (distributed/adasum.py), eager only
        # pipeline parallelism on torch.distributed.pipelining (legacy/pipeline.py)
        self.pipeline_parallel_size: int = 1
        self.num_pipeline_micro_batches: int = 1
        self.pipeline_cut_info_string: str = ""
        self.horizontal_parallel_size: int = 1  # Megatron tensor parallel (distributed/tensor_parallel.py)
        for name, (default, _) in UNSUPPORTED_SETTINGS.items():
            setattr(self, name, type(default)(default))  # fresh containers per instance

    def set_optimizer_initial_state(self, state: Mapping[str, Mapping[str, Any]]) -> None:
        """Initial optimizer state per weight: ``{weight: {"Moment_1"|"Moment_2"|"Update_Count": array}}``."""
        if not isinstance(state, Mapping) or not all(isinstance(v, Mapping) for v in state.values()):
            raise TypeError(
                "set_optimizer_initial_state: expected {weight name: {state name: array}}, "
                f"got {type(state).__name__}"
            )
        self.optimizer_initial_state = {weight: dict(values) for weight, values in state.items()}

    def __repr__(self) -> str:
        changed = {
            name: getattr(self, name) for name in self.__slots__ if getattr(self, name) != getattr(_DEFAULTS, name)
        }
        return f"TrainingParameters({', '.join(f'{k}={v!r}' for k, v in changed.items())})"


_DEFAULTS = TrainingParameters()


def check_supported(parameters: TrainingParameters) -> None:
    """Raise NotImplementedError for a setting this project cannot honour, ValueError for a bad one."""
    if not isinstance(parameters, TrainingParameters):
        raise TypeError(
            f"parameters: expected an ort_torch_train.legacy.TrainingParameters, got {type(parameters).__name__}"
        )
    for name, (honoured, reason) in UNSUPPORTED_SETTINGS.items():
        value = getattr(parameters, name)
        if bool(value) if isinstance(honoured, (dict, list)) else value != honoured:
            raise NotImplementedError(
                f"TrainingParameters.{name} = {value!r} is not supported: {reason} (only {honoured!r} is)"
            )
    optimizer = parameters.training_optimizer_name
    stage = parameters.deepspeed_zero_stage
    if stage not in (0, 1, 2, 3):
        raise NotImplementedError(
            f"TrainingParameters.deepspeed_zero_stage = {stage!r} is not supported: stages 0 (no sharding), "
            "1 (optimizer state sharded), 2 and 3 (FSDP2: gradients, and for 3 the weights, sharded too) are"
        )
    if stage and optimizer == "LambOptimizer":
        raise NotImplementedError(
            f"TrainingParameters.deepspeed_zero_stage = {stage} with LambOptimizer is not "
            "supported: LAMB's per-weight trust ratio is not element-wise; use "
            "AdamOptimizer or SGDOptimizer, or stage 0"
        )
    if optimizer and optimizer not in OPTIMIZERS:
        raise ValueError(
            f"TrainingParameters.training_optimizer_name: Failed to get Optimizer builder for "
            f"{optimizer!r}; expected one of {list(OPTIMIZERS)} (or '' for no optimizer)"
        )
    if not parameters.loss_scale >= 0:
        raise ValueError(f"TrainingParameters.loss_scale must be >= 0 (0: dynamic), got {parameters.loss_scale!r}")
    layers = parameters.number_recompute_layers
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 0:
        raise ValueError(
            f"TrainingParameters.number_recompute_layers must be an int >= 0 (0: every transformer "
            f"layer but the last), got {layers!r}"
        )
    steps = parameters.gradient_accumulation_steps
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"TrainingParameters.gradient_accumulation_steps must be an int >= 1, got {steps!r}")
    if not parameters.loss_output_name:
        raise ValueError("TrainingParameters.loss_output_name is empty: name the graph output that holds the loss")


def recompute_plan(parameters: TrainingParameters) -> RecomputePlan:
    """What the recompute settings ask to recompute (falsy when nothing)."""
    layers = parameters.transformer_layer_recompute
    if parameters.number_recompute_layers and not layers:
        warnings.warn(
            f"TrainingParameters.number_recompute_layers = {parameters.number_recompute_layers} has no "
            "effect without transformer_layer_recompute = True (as in ORT)",
            stacklevel=3,
        )
    return RecomputePlan(
        gelu=bool(parameters.gelu_recompute),
        attention_dropout=bool(parameters.attn_dropout_recompute),
        transformer_layers=parameters.number_recompute_layers if layers else None,
    )
