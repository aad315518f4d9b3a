"""What the conversion pass must know about operators: randomness, shape dependence, inputs written in place."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_RANDOM = {
    ("", "Dropout"),
    ("", "RandomNormal"),
    ("", "RandomNormalLike"),
    ("", "RandomUniform"),
    ("", "RandomUniformLike"),
    ("", "Bernoulli"),
    ("", "Multinomial"),
    ("com.microsoft", "BitmaskDropout"),
    ("com.microsoft", "BiasDropout"),
    ("com.microsoft", "BitmaskBiasDropout"),
}

# Output shapes depend on input VALUES, not only on input shapes.
_DATA_DEPENDENT = {"NonZero", "Unique", "Compress", "NonMaxSuppression", "Loop", "If", "Scan", "StringSplit"}

# Positions of inputs whose values decide output shapes (static only when those are constant).
_SHAPE_VALUE_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,),
    "Expand": (1,),
    "Tile": (1,),
    "Slice": (1, 2, 3, 4),
    "Pad": (1, 2, 3),
    "Resize": (1, 2, 3),
    "Upsample": (1,),
    "TopK": (1,),
    "Range": (0, 1, 2),
    "ConstantOfShape": (0,),
    "OneHot": (1,),
    "Split": (1,),
    "Squeeze": (1,),
    "Unsqueeze": (1,),
    "CenterCropPad": (1,),
    "Col2Im": (1, 2),
    "AffineGrid": (1,),
    "DFT": (1, 2),
    "STFT": (1, 3),
    "HannWindow": (0,),
    "HammingWindow": (0,),
    "BlackmanWindow": (0,),
    "MelWeightMatrix": (0, 1),
    "MaxUnpool": (2,),
    "ReduceSum": (1,),
    "ReduceMean": (1,),
    "ReduceMax": (1,),
    "ReduceMin": (1,),
    "ReduceProd": (1,),
    "ReduceL1": (1,),
    "ReduceL2": (1,),
    "ReduceLogSum": (1,),
    "ReduceLogSumExp": (1,),
    "ReduceSumSquare": (1,),
}


# Positions of inputs a node updates in place when run: a training BatchNorm's running mean and variance
# (adapters/normalization.py).
_WRITTEN_INPUTS: dict[tuple[str, str], tuple[int, ...]] = {
    ("", "BatchNormalization"): (3, 4),
    ("com.microsoft", "BatchNormInternal"): (3, 4),
}


def inputs_written_in_place(domain: str, op_type: str, inputs: Sequence[str]) -> list[str]:
    """The names of the node's inputs that running it updates in place."""
    return [inputs[i] for i in _WRITTEN_INPUTS.get((domain, op_type), ()) if i < len(inputs) and inputs[i]]


def is_random(domain: str, op_type: str) -> bool:
    """Whether the operator draws random numbers (never folded into a constant)."""
    return (domain, op_type) in _RANDOM


def output_shapes_static(domain: str, op_type: str, inputs: Sequence[str], values: Mapping[str, Any]) -> bool:
    """Whether the node's output shapes follow from input shapes alone (given the constants)."""
    if domain == "" and op_type in _DATA_DEPENDENT:
        return False
    value_inputs = _SHAPE_VALUE_INPUTS.get(op_type, ()) if domain == "" else ()
    for position, name in enumerate(inputs):
        if not name:
            continue
        value = values[name]
        if not value.static_shape or (position in value_inputs and not value.const):
            return False
    return True
