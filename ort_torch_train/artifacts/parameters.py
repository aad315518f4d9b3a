"""Checking generate_artifacts' name arguments against the base model, and picking the parameters."""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from ort_torch_train.artifacts.graph_edit import value_names
from ort_torch_train.errors import ModelError


def check_arguments(
    base: onnx.ModelProto,
    requires_grad: Sequence[str] | None,
    frozen_params: Sequence[str] | None,
    additional_output_names: Sequence[str] | None,
    loss_input_names: Sequence[str] | None,
) -> tuple[set[str], set[str]]:
    """Raise a clear error for any name the model lacks; return the (trainable, frozen) name sets."""
    initializers = [init.name for init in base.graph.initializer]
    if not initializers:
        raise ModelError(
            "the model has no initializers, so it has no parameters to train (export it with its "
            "weights as initializers, e.g. torch.onnx.export(..., export_params=True))"
        )
    trainable = _names("requires_grad", requires_grad, initializers, "initializer")
    frozen = _names("frozen_params", frozen_params, initializers, "initializer")
    if trainable & frozen:
        raise ModelError(
            "A parameter cannot be frozen and require gradient computation at the same time "
            f"{sorted(trainable & frozen)}"
        )
    if not trainable and not frozen:
        raise ModelError(
            "no parameters selected: requires_grad and frozen_params are both empty (ORT's generator "
            "treats None as 'no parameter', not 'all'); pass requires_grad=[...], e.g. from "
            f"{_listing(initializers)}"
        )
    values = sorted(value_names(base.graph))
    _names("additional_output_names", additional_output_names, values, "value")
    _names("loss_input_names", loss_input_names, values, "value")
    return trainable, frozen


def selected_parameters(
    model: onnx.ModelProto, trainable: set[str], frozen: set[str]
) -> tuple[list[onnx.TensorProto], list[onnx.TensorProto]]:
    """The (trainable, frozen) initializers, each in the model's initializer order."""
    inits = model.graph.initializer
    return [i for i in inits if i.name in trainable], [i for i in inits if i.name in frozen]


def _names(argument: str, names: Sequence[str] | None, known: Sequence[str], what: str) -> set[str]:
    if names is None:
        return set()
    if isinstance(names, (str, bytes)):
        raise TypeError(f"{argument} must be a list of names, got the string {names!r}")
    known_set = set(known)
    for name in names:
        if name not in known_set:
            raise ModelError(f"{argument}: {name!r} is not among the model's {what}s, which include {_listing(known)}")
    return set(names)


def _listing(names: Sequence[str], shown: int = 6) -> str:
    listed = ", ".join(repr(name) for name in names[:shown])
    return f"{listed}, ... ({len(names)} in all)" if len(names) > shown else listed
