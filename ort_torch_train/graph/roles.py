"""Which artifact an ONNX model is (training, eval or optimizer model), to name one loaded in the wrong slot."""

from __future__ import annotations

import onnx

from ort_torch_train.errors import ModelError
from ort_torch_train.graph.layout import GRAD_BUFFER_SUFFIX, LAZY_RESET_GRAD

OPTIMIZER_INPUTS = ("params", "gradients")  # tensor sequences every optimizer model of ORT's layout takes
FILE_NAMES = {
    "training_model": "training_model.onnx",
    "eval_model": "eval_model.onnx",
    "optimizer_model": "optimizer_model.onnx",
}


def model_role(model: onnx.ModelProto) -> str:
    """``optimizer_model`` (ORT's optimizer layout: parameters and gradients as tensor sequences),
    ``training_model`` (gradient buffers) or ``eval_model``."""
    if _is_optimizer_model(model):
        return "optimizer_model"
    names = [value.name for value in model.graph.input]
    if LAZY_RESET_GRAD in names or any(name.endswith(GRAD_BUFFER_SUFFIX) for name in names):
        return "training_model"
    return "eval_model"


def check_slot(model: onnx.ModelProto, slot: str, argument: str) -> None:
    """Raise ModelError naming both when ``model`` is another artifact than ``slot`` takes.

    The training slot also takes an eval model (it is trained through autograd); an optimizer
    model fits no model slot and a training model is no eval model.
    """
    role = model_role(model)
    fits = role == slot or (slot == "training_model" and role == "eval_model")
    if not fits:
        # ORT's optimizer node comes last, after the gradient clip's
        op = model.graph.node[-1].op_type if role == "optimizer_model" and model.graph.node else None
        what = f"an optimizer model (it holds {op})" if op else f"a {role.replace('_', ' ')} (it has gradient buffers)"
        raise ModelError(
            f"{argument}: got {what}; expected the {slot.replace('_', ' ')} ({FILE_NAMES[slot]} of generate_artifacts)"
        )


def _is_optimizer_model(model: onnx.ModelProto) -> bool:
    sequences = {value.name for value in model.graph.input if value.type.WhichOneof("value") == "sequence_type"}
    return all(name in sequences for name in OPTIMIZER_INPUTS)
