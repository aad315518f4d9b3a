"""Small value types of the onnxruntime session API: NodeArg, ModelMetadata, RunOptions."""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx

from ort_torch_train.dtypes import ort_tensor_type


@dataclass(frozen=True)
class NodeArg:
    """A graph input or output as ``onnxruntime.NodeArg`` describes it."""

    name: str
    type: str  # "tensor(float)", ...
    shape: list[int | str | None]  # a dim's value, its symbolic name, or None when unknown

    @classmethod
    def from_value_info(cls, value: onnx.ValueInfoProto) -> NodeArg:
        """The NodeArg of a declared graph input or output."""
        tensor_type = value.type.tensor_type
        shape = [
            dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or None) for dim in tensor_type.shape.dim
        ]
        return cls(value.name, ort_tensor_type(tensor_type.elem_type), shape)


@dataclass(frozen=True)
class ModelMetadata:
    """``onnxruntime.ModelMetadata``: the model's descriptive fields."""

    producer_name: str
    graph_name: str
    domain: str
    description: str
    graph_description: str
    version: int
    custom_metadata_map: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_model(cls, model: onnx.ModelProto) -> ModelMetadata:
        """The metadata ``model`` declares."""
        return cls(
            model.producer_name,
            model.graph.name,
            model.domain,
            model.doc_string,
            model.graph.doc_string,
            model.model_version,
            {prop.key: prop.value for prop in model.metadata_props},
        )


@dataclass
class RunOptions:
    """The ``onnxruntime.RunOptions`` fields a legacy TrainingSession reads (ORT's own object works too).

    ``only_execute_path_to_fetches``: run only what the requested outputs need (no optimizer update
    unless they need it); ``training_mode=False``: evaluation (dropout off, no gradients).
    """

    only_execute_path_to_fetches: bool = False
    training_mode: bool = True
