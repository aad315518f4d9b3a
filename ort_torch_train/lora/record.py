"""What a LoRA rewrite did to a graph, kept in the model's metadata so that exports can undo or fold it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import onnx

LORA_KEY = "ort_torch_train.lora"


@dataclass(frozen=True)
class LoraUse:
    """One MatMul/Gemm reading a target weight, and the adapter branch added beside it."""

    base_node: str  # the MatMul/Gemm's name
    output: str  # the value the branch's Add now produces (the MatMul/Gemm's output before the rewrite)
    base_output: str  # the MatMul/Gemm's output after the rewrite
    scaled: str  # the scale Mul's output (the Add's second input)
    unscaled: str  # the B MatMul's output (the scale Mul's input)
    nodes: tuple[str, ...]  # the inserted nodes' names


@dataclass(frozen=True)
class LoraTarget:
    """A weight matrix with its adapter: ``x @ W_eff + scaling * (x @ A) @ B``; W_eff is W or W^T."""

    weight: str
    lora_a: str  # shape (in_features, r)
    lora_b: str  # shape (r, out_features)
    in_features: int
    out_features: int
    transposed: bool  # W is stored (out_features, in_features)
    gemm_alpha: float  # the base product's own factor (Gemm's alpha, else 1)
    uses: tuple[LoraUse, ...]
    column_offset: int = 0  # a projection of a packed weight: B covers out columns [offset, offset + out_features)
    columns_total: int = 0  # the packed weight's out_features (0: B covers the whole output)


@dataclass(frozen=True)
class LoraRecord:
    """The adapters of a graph and the frozen parameters cast from ``frozen_dtype`` where they are used."""

    rank: int
    alpha: float
    scaling: float
    targets: tuple[LoraTarget, ...]
    casts: tuple[tuple[str, str, int], ...]  # (parameter, its cast output, the graph's element type)

    def adapter_names(self) -> list[str]:
        """Every adapter tensor's name (A then B per target)."""
        return [name for target in self.targets for name in (target.lora_a, target.lora_b)]

    def to_json(self) -> str:
        """The record as JSON text."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> LoraRecord:
        """The record written by ``to_json``."""
        data = json.loads(text)
        targets = tuple(
            LoraTarget(**{**t, "uses": tuple(LoraUse(**{**u, "nodes": tuple(u["nodes"])}) for u in t["uses"])})
            for t in data["targets"]
        )
        casts = tuple((str(p), str(c), int(e)) for p, c, e in data["casts"])
        return cls(int(data["rank"]), float(data["alpha"]), float(data["scaling"]), targets, casts)


def read_record(model: onnx.ModelProto) -> LoraRecord | None:
    """The LoRA record in ``model``'s metadata, or None for a model without adapters."""
    text = next((prop.value for prop in model.metadata_props if prop.key == LORA_KEY), None)
    return None if text is None else LoraRecord.from_json(text)


def write_record(model: onnx.ModelProto, record: LoraRecord) -> None:
    """Store ``record`` in ``model``'s metadata (replacing any earlier one)."""
    drop_record(model)
    model.metadata_props.add(key=LORA_KEY, value=record.to_json())


def drop_record(model: onnx.ModelProto) -> None:
    """Remove the LoRA record from ``model``'s metadata."""
    kept = [prop for prop in model.metadata_props if prop.key != LORA_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
