"""ORT's on-device training checkpoint file ("ODTC" FlatBuffers, version 2): read and write.

Schema (onnxruntime/core/flatbuffers/schema/ort_training_checkpoint.fbs; Tensor from ort.fbs)::

    table Checkpoint { version:int32; module_state:ModuleState;
                       optimizer_groups:[OptimizerGroup]; property_bag:PropertyBag; }
    table ModuleState { requires_grad_params:[Tensor]; frozen_params:[Tensor];
                        is_nominal_state:bool; has_external_data:bool; }
    table Tensor { name:string; doc_string:string; dims:[int64]; data_type:int32 (ONNX numbering);
                   raw_data:[uint8]; string_data:[string]; external_data_offset:int64 = -1; }
    table OptimizerGroup { group_name:string; step:int64; initial_learning_rate:float;
                           optimizer_states:[ParameterOptimizerState]; }
    table ParameterOptimizerState { param_name:string; momentums:[Tensor]; }
    table PropertyBag { ints:[IntProperty]; floats:[FloatProperty]; strings:[StringProperty]; }

Two layouts, both byte-identical to ORT 1.19's for the same content: ORT's ``save_checkpoint``
(tensors sorted by name; the default) and ``generate_artifacts``' (``artifact=True``: tensors in the
record's order, no optimizer-group vector, parameters only).

External data (ORT >= 1.18): ``ModuleState.has_external_data`` is true and tensors carry an
``external_data_offset`` (>= 0) instead of ``raw_data``: their bytes lie in the side file
``<checkpoint>.data`` (see ``external_data_path``) at that offset, placed in the order the tensors are
written, each aligned to 8 bytes for INT64/DOUBLE and 4 bytes otherwise (zero padding). ORT's
generate_artifacts uses it when the parameters exceed ``EXTERNAL_DATA_THRESHOLD`` (tensors under
64 bytes stay inline); ORT's save puts all parameters there when the state was loaded from such a
checkpoint (no size threshold: 1.9 GB saved inline), and keeps optimizer moments inline. Loading
such a checkpoint from bytes is not possible (as in ORT).
"""

from __future__ import annotations

import os
from pathlib import Path

from .odtc_read import decode_checkpoint
from .odtc_walk import CHECKPOINT_VERSION, FILE_IDENTIFIER
from .odtc_write import ExternalDataPlan, check_record, data_bytes, encode_checkpoint
from .pair import Writer, commit_pair, data_file_path, replace_inline
from .records import CheckpointRecord, OptimizerGroupRecord
from .source import read_source
from .tensor_bytes import tensor_to_bytes

__all__ = [
    "ARTIFACT_MIN_EXTERNAL_BYTES",
    "CHECKPOINT_VERSION",
    "EXTERNAL_DATA_THRESHOLD",
    "FILE_IDENTIFIER",
    "CheckpointRecord",
    "OptimizerGroupRecord",
    "checkpoint_to_bytes",
    "external_data_path",
    "read_checkpoint",
    "write_checkpoint",
]

EXTERNAL_DATA_THRESHOLD = 1800 * 1024 * 1024  # bytes of parameter data (ORT's generate_artifacts)
ARTIFACT_MIN_EXTERNAL_BYTES = 64  # ORT's kMinimumSizeForExternalData


def external_data_path(checkpoint_path: str | os.PathLike) -> Path:
    """The side file holding tensor data of a checkpoint with external data."""
    return data_file_path(Path(checkpoint_path))


def read_checkpoint(
    source: str | os.PathLike | bytes | bytearray | memoryview,
) -> CheckpointRecord:
    """Read an ORT checkpoint from a file path or from its bytes.

    Raises FileNotFoundError / IsADirectoryError for a bad path and CheckpointError for anything
    that is not a valid version-2 ODTC checkpoint (a device or FIFO at the path included). A pair
    with external data is read from descriptors opened once: saves running meanwhile cannot mix it.
    """
    return read_source(source, decode_checkpoint)


def checkpoint_to_bytes(record: CheckpointRecord, *, artifact: bool = False) -> bytes:
    """The checkpoint as one self-contained ODTC buffer (no external data; must fit in 2 GiB).

    Laid out like ORT's save_checkpoint (tensors sorted by name), or with artifact=True like
    ORT's generate_artifacts (tensors in the record's order; parameters only).
    """
    return bytes(encode_checkpoint(record, artifact=artifact))


def write_checkpoint(
    record: CheckpointRecord,
    path: str | os.PathLike,
    external_data_threshold: int = EXTERNAL_DATA_THRESHOLD,
    *,
    artifact: bool = False,
) -> None:
    """Write the checkpoint to path atomically (layouts as in checkpoint_to_bytes).

    Parameter data goes to "<path>.data" when record.has_external_data is set (ORT's rule on
    save) or the parameters' data exceeds the threshold (ORT's rule in generate_artifacts, where
    tensors under 64 bytes stay inline). Optimizer moments stay inline, as in ORT, unless they
    exceed the threshold themselves. Everything that can fail on the content fails before any file
    is touched; with external data both files are replaced as one unit (see ``pair``), and temp
    files left by killed saves are removed.
    """
    check_record(record, artifact)
    param_bytes = data_bytes(record, include_optimizer=False)
    moment_bytes = data_bytes(record) - param_bytes
    external = not record.is_nominal and (record.has_external_data or param_bytes > external_data_threshold)
    if not external:
        replace_inline(Path(path), encode_checkpoint(record, artifact=artifact))
        return
    plan = ExternalDataPlan(
        momentums=moment_bytes > external_data_threshold, min_bytes=ARTIFACT_MIN_EXTERNAL_BYTES if artifact else 0
    )
    encoded = encode_checkpoint(record, plan, artifact)

    def write_data(file: Writer) -> None:
        position = 0
        for offset, tensor in plan.chunks:
            file.write(b"\0" * (offset - position))
            data = tensor_to_bytes(tensor)
            file.write(data)
            position = offset + len(data)

    commit_pair(Path(path), encoded, write_data)
