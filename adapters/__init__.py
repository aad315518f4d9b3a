"""Op converters that onnx2torch lacks or gets wrong for training graphs, one file per op family.

Shipped as ``ort_torch_train.adapters``. Importing the package registers every converter.
"""

from . import (  # noqa: E402,F401  (registers converters)
    activations,
    attention,
    bitwise,
    constants,
    conv,
    detection,
    dropout,
    elementwise,
    gather_block_quantized,
    group_norm,
    group_query_attention,
    indexing,
    instance_norm,
    linear,
    losses,
    math_ops,
    matmul,
    matmul_nbits,
    ml_ops,
    normalization,
    optional,
    padding,
    pooling,
    quantize,
    random_ops,
    reduce,
    resize,
    rnn,
    sequence_mixers,
    sequences,
    shape_ops,
    signal,
    spatial,
    tensor_ops,
    training_ops,
    unsigned,
)
from .registry import (
    ConversionContext,
    OpFacts,
    OpLibrary,
    declare,
    find_converter,
    normalize_domain,
    op_facts,
    register,
)

__all__ = [
    "ConversionContext",
    "OpFacts",
    "OpLibrary",
    "declare",
    "find_converter",
    "normalize_domain",
    "op_facts",
    "register",
]
