"""The optimizer models of ORT's generator (``onnxblock.optim``), and ``OptimType``.

Layout: the graph inputs the algorithm's record names (``optim/algorithm.py``): ``learning_rate:
float[1]``, ``step: int64[1]``, then tensor sequences (``params``, ``gradients``,
``first_order_moments`` (+ ``second_order_moments`` for AdamW)); one node of the record's op type
(``com.microsoft`` ``AdamWOptimizer`` or ``SGDOptimizerV2``) on the record's node inputs, optionally
fed by ``InplaceClipGradNorm``; one bool[1] output, the updated flag.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from enum import Enum

import onnx

from ort_torch_train.artifacts.blocks import Block, building
from ort_torch_train.artifacts.graph_edit import ORT_MAX_IR_VERSION, ORT_MAX_OPSET, register_graph_outputs
from ort_torch_train.optim.adamw import ADAMW_ALGORITHM
from ort_torch_train.optim.algorithm import MS_DOMAIN, OptimizerAlgorithm
from ort_torch_train.optim.sgd import SGD_ALGORITHM

Parameters = tuple[Sequence[onnx.TensorProto], Sequence[onnx.TensorProto]]  # (trainable, frozen)


class OptimType(Enum):
    """The built-in optimizers, for ``generate_artifacts(optimizer=...)``."""

    AdamW = 1
    SGD = 2


class ClipGradNorm(Block):
    """``com.microsoft.InplaceClipGradNorm(gradients, max_norm)``: clips the gradient sequence by L2 norm."""

    def __init__(self, max_norm: float) -> None:
        super().__init__()
        self._max_norm = float(max_norm)

    def build(self, gradients_name: str) -> str:
        """The block's output name(s), its nodes added to the model being built."""
        (clipped,) = self.add_node(
            "InplaceClipGradNorm",
            [gradients_name],
            outputs=["clip_grad_norm_output"],
            domain=MS_DOMAIN,
            max_norm=self._max_norm,
        )
        self._model.graph.value_info.append(
            onnx.helper.make_tensor_sequence_value_info(clipped, onnx.TensorProto.FLOAT, None)
        )
        return clipped


class _Optimizer(Block):
    """An optimizer graph of ``algorithm``'s layout; subclasses name the node's output and attributes."""

    algorithm: OptimizerAlgorithm
    updated_flag: str  # the node's output, the graph's

    def __init__(self, clip_grad: ClipGradNorm | None = None) -> None:
        super().__init__()
        self._clip_grad = clip_grad
        self._attributes: dict[str, float | int] = {}  # the node's

    def build(self, parameters: Parameters) -> str:
        """The optimizer node's output name; its inputs are ``parameters``' values, gradients and moments."""
        trainable, _ = parameters
        elem_type = trainable[0].data_type
        graph = self._model.graph
        scalars = {"learning_rate": onnx.TensorProto.FLOAT, "step": onnx.TensorProto.INT64}
        for name in self.algorithm.graph_inputs:
            graph.input.append(
                onnx.helper.make_tensor_value_info(name, scalars[name], [1])
                if name in scalars
                else onnx.helper.make_tensor_sequence_value_info(name, elem_type, None)
            )
        gradients = self._clip_grad("gradients") if self._clip_grad is not None else "gradients"
        inputs = [gradients if name == "gradients" else name for name in self.algorithm.node_inputs]
        (flag,) = self.add_node(
            self.algorithm.op_type,
            inputs,
            outputs=[self.updated_flag],
            domain=self.algorithm.domain,
            **self._attributes,
        )
        graph.output.append(onnx.helper.make_tensor_value_info(flag, onnx.TensorProto.BOOL, [1]))
        return flag


class AdamW(_Optimizer):
    """``com.microsoft.AdamWOptimizer`` with onnxblock's defaults (adam_mode=1: the HF/transformers AdamW;
    ``adam_mode=0`` is torch.optim.AdamW's math)."""

    algorithm = ADAMW_ALGORITHM
    updated_flag = "adamw.updated_flag"

    def __init__(
        self,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        clip_grad: ClipGradNorm | None = None,
        adam_mode: int = 1,
    ) -> None:
        super().__init__(clip_grad)
        if adam_mode not in (0, 1):
            raise ValueError(f"adam_mode: expected 0 (torch.optim.AdamW) or 1 (HF AdamW), got {adam_mode!r}")
        if adam_mode == 0 and not bias_correction:
            raise ValueError("adam_mode 0 (torch.optim.AdamW) needs bias_correction=True, as ORT's kernel does")
        self._attributes = {
            "alpha": float(betas[0]),
            "beta": float(betas[1]),
            "epsilon": float(eps),
            "weight_decay": float(weight_decay),
            "correct_bias": 1 if bias_correction else 0,
            "adam_mode": adam_mode,
        }


class SGD(_Optimizer):
    """``com.microsoft.SGDOptimizerV2(learning_rate, params, gradients)``: ``w -= lr * g``."""

    algorithm = SGD_ALGORITHM
    updated_flag = "update_completed"


OPTIMIZER_BLOCKS = {OptimType.AdamW: AdamW, OptimType.SGD: SGD}


def build_optimizer_model(
    block: Block, parameters: Parameters, opset: int | None, counter: Iterator[int]
) -> onnx.ModelProto:
    """The optimizer model ``block`` builds for ``parameters`` on an empty model (ORT's ``empty_base``).

    The default-domain opset is the base model's, capped at 21 (the graph has no default-domain node).
    """
    model = onnx.ModelProto(ir_version=ORT_MAX_IR_VERSION, producer_name="orttraining")
    model.graph.name = "graph"
    model.opset_import.extend(
        [
            onnx.helper.make_opsetid(MS_DOMAIN, 1),
            onnx.helper.make_opsetid("", min(opset or ORT_MAX_OPSET, ORT_MAX_OPSET)),
        ]
    )
    with building(model, counter):
        outputs = block(parameters)
    model = onnx.shape_inference.infer_shapes(model)
    register_graph_outputs(model, [outputs] if isinstance(outputs, str) else list(outputs))
    return model
