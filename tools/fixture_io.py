"""Deterministic writers and readers used by make_fixtures.py.

Everything written here must be byte-identical across reruns: npz archives get a fixed zip
timestamp (numpy's own savez stamps the current time), JSON is written with sorted-free but
stable insertion order, and ONNX graphs / ORT checkpoints are summarised into plain JSON.
"""

from __future__ import annotations

import io
import json
import math
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnxruntime.tools.ort_format_model.ort_flatbuffers_py.fbs import Checkpoint as FbsCheckpoint

_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)

# ONNX TensorProto numbering, as used by the checkpoint's Tensor.data_type field.
_DTYPE_NAMES = {v: k for k, v in onnx.TensorProto.DataType.items()}


# Run-specific text (paths, object addresses) replaced in recorded error messages.
SCRUB: dict[str, str] = {}


def scrub(message: str) -> str:
    """Make an error message rerun-stable: no fixture/temp paths, no object addresses."""
    for text, placeholder in SCRUB.items():
        message = message.replace(text, placeholder)
    message = re.sub(re.escape(tempfile.gettempdir()) + r"/tmp[A-Za-z0-9_]+", "<tmpdir>", message)
    return re.sub(r" at 0x[0-9a-fA-F]+", " at 0x...", message)


def no_aslr_prefix() -> list[str]:
    """`setarch <arch> -R` (run without address randomisation) when it works here, else [] with a warning."""
    setarch = shutil.which("setarch") or "setarch"
    prefix = [setarch, platform.machine(), "-R"]
    try:
        ok = subprocess.run(prefix + ["true"], capture_output=True).returncode == 0
    except OSError:
        ok = False
    if not ok:
        print(
            "warning: `setarch -R` unavailable; gradient-clipping optimizer variants may differ in the "
            "last bits between reruns",
            file=sys.stderr,
        )
    return prefix if ok else []


def save_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Write an .npz loadable by np.load, with a fixed timestamp so reruns are identical."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for key, value in arrays.items():
            info = zipfile.ZipInfo(f"{key}.npy", date_time=_ZIP_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.asanyarray(value), allow_pickle=False)
            zf.writestr(info, buf.getvalue())


def _jsonable(value: Any) -> Any:
    """Convert numpy scalars/arrays and tuples to JSON types; non-finite floats to strings."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, (np.bool_,)):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return f if math.isfinite(f) else repr(f)
    return value


def save_json(path: Path, obj: Any) -> None:
    """Write pretty JSON (1-space indent like the refcorpus) with a trailing newline."""
    path.write_text(json.dumps(_jsonable(obj), indent=1) + "\n")


# ----------------------------------------------------------------------------- ONNX summaries


def _value_info_dict(vi: onnx.ValueInfoProto) -> dict:
    """Describe a graph input/output: tensor dtype+shape, or a sequence of tensors."""
    t = vi.type
    if t.HasField("sequence_type"):
        elem = t.sequence_type.elem_type.tensor_type
        return {
            "name": vi.name,
            "kind": "sequence",
            "elem": {"kind": "tensor", "dtype": _DTYPE_NAMES.get(elem.elem_type, elem.elem_type), "shape": None},
        }
    tt = t.tensor_type
    shape = None
    if tt.HasField("shape"):
        shape = [
            d.dim_param if d.dim_param else (d.dim_value if d.HasField("dim_value") else None) for d in tt.shape.dim
        ]
    return {"name": vi.name, "kind": "tensor", "dtype": _DTYPE_NAMES.get(tt.elem_type, tt.elem_type), "shape": shape}


def _attr_value(attr: onnx.AttributeProto) -> Any:
    """Attribute value as JSON; tensors are summarised (dtype, dims, small values inline)."""
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, onnx.TensorProto):
        arr = numpy_helper.to_array(value)
        out: dict = {"tensor_dtype": _DTYPE_NAMES[value.data_type], "dims": list(value.dims)}
        if arr.size <= 16:
            out["values"] = arr.tolist()
        return out
    if isinstance(value, onnx.GraphProto):
        return {"graph": value.name, "num_nodes": len(value.node)}
    if isinstance(value, list):
        return [v.decode() if isinstance(v, bytes) else v for v in value]
    return value


def node_dict(node: onnx.NodeProto) -> dict:
    """A node as JSON: op_type, domain, name, inputs, outputs, attributes."""
    return {
        "op_type": node.op_type,
        "domain": node.domain or "ai.onnx",
        "name": node.name,
        "inputs": list(node.input),
        "outputs": list(node.output),
        "attributes": {a.name: _attr_value(a) for a in node.attribute},
    }


# Default-domain ops whose attributes and wiring matter to a re-implementation.
_KEY_OPS = {
    "LayerNormalization",
    "BatchNormalization",
    "Dropout",
    "SoftmaxCrossEntropyLoss",
    "Conv",
    "MaxPool",
    "Gemm",
    "Softmax",
    "ConvGrad",
    "MaxPoolGrad",
}


def graph_summary(path: Path) -> dict:
    """Summarise one ONNX file the way the refcorpus graphs.json does (plus key default-domain nodes)."""
    model = onnx.load(str(path))
    g = model.graph
    counts = Counter(f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in g.node)
    return {
        "ir_version": model.ir_version,
        "opset_import": {(o.domain or "ai.onnx"): o.version for o in model.opset_import},
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "num_nodes": len(g.node),
        "op_counts": dict(sorted(counts.items())),
        "inputs": [_value_info_dict(v) for v in g.input],
        "outputs": [_value_info_dict(v) for v in g.output],
        "initializers": [
            {"name": i.name, "dtype": _DTYPE_NAMES[i.data_type], "dims": list(i.dims)} for i in g.initializer
        ],
        "com_microsoft_nodes": [node_dict(n) for n in g.node if n.domain == "com.microsoft"],
        "other_domain_nodes": [node_dict(n) for n in g.node if n.domain not in ("", "ai.onnx", "com.microsoft")],
        "key_default_domain_nodes": [
            node_dict(n) for n in g.node if n.domain in ("", "ai.onnx") and n.op_type in _KEY_OPS
        ],
        "file_bytes": path.stat().st_size,
    }


def optimizer_node_summary(path: Path) -> dict:
    """The optimizer model's op types and the attributes actually stored on each node."""
    model = onnx.load(str(path))
    return {
        "inputs": [v.name for v in model.graph.input],
        "outputs": [v.name for v in model.graph.output],
        "nodes": [
            {
                "op_type": n.op_type,
                "domain": n.domain,
                "inputs": list(n.input),
                "attributes": {a.name: _attr_value(a) for a in n.attribute},
            }
            for n in model.graph.node
        ],
    }


# ----------------------------------------------------------------------------- checkpoints


def _fbs_str(b: bytes | None) -> str | None:
    return None if b is None else b.decode("utf-8")


def _fbs_tensor(t, with_data: bool) -> dict:
    """One flatbuffers Tensor as JSON (dims, dtype, byte count; values only when asked)."""
    dims = [int(t.Dims(j)) for j in range(t.DimsLength())]
    out = {
        "name": _fbs_str(t.Name()),
        "dims": dims,
        "data_type": _DTYPE_NAMES.get(t.DataType(), t.DataType()),
        "raw_data_bytes": t.RawDataLength(),
        "external_data_offset": int(t.ExternalDataOffset()),
    }
    if with_data:
        out["array"] = fbs_tensor_array(t)
    return out


def fbs_tensor_array(t) -> np.ndarray:
    """Decode a float32/int64 flatbuffers Tensor's raw_data into an ndarray."""
    dtype = {1: np.float32, 7: np.int64, 11: np.float64, 9: np.bool_}[t.DataType()]
    raw = t.RawDataAsNumpy() if t.RawDataLength() else np.zeros(0, np.uint8)
    dims = [int(t.Dims(j)) for j in range(t.DimsLength())]
    return np.frombuffer(raw.tobytes(), dtype=dtype).reshape(dims).copy()


def read_checkpoint(path: Path, with_data: bool = False) -> dict:
    """Parse an ORT training checkpoint (ODTC flatbuffer) with ORT's own generated bindings."""
    buf = Path(path).read_bytes()
    ck = FbsCheckpoint.Checkpoint.GetRootAs(buf, 0)
    ms = ck.ModuleState()
    out: dict = {
        "file_bytes": len(buf),
        "file_identifier": buf[4:8].decode("ascii", "replace"),
        "version": ck.Version(),
        "module_state": None,
        "optimizer_groups": [],
        "property_bag": None,
    }
    if ms is not None:
        out["module_state"] = {
            "requires_grad_params": [
                _fbs_tensor(ms.RequiresGradParams(j), with_data) for j in range(ms.RequiresGradParamsLength())
            ],
            "frozen_params": [_fbs_tensor(ms.FrozenParams(j), with_data) for j in range(ms.FrozenParamsLength())],
            "is_nominal_state": bool(ms.IsNominalState()),
            "has_external_data": bool(ms.HasExternalData()),
        }
    for g in range(ck.OptimizerGroupsLength()):
        grp = ck.OptimizerGroups(g)
        states = []
        for s in range(grp.OptimizerStatesLength()):
            st = grp.OptimizerStates(s)
            states.append(
                {
                    "param_name": _fbs_str(st.ParamName()),
                    "momentums": [_fbs_tensor(st.Momentums(m), with_data) for m in range(st.MomentumsLength())],
                }
            )
        out["optimizer_groups"].append(
            {
                "group_name": _fbs_str(grp.GroupName()),
                "step": int(grp.Step()),
                "initial_learning_rate": float(grp.InitialLearningRate()),
                "optimizer_states": states,
            }
        )
    bag = ck.PropertyBag()
    if bag is not None:
        out["property_bag"] = {
            "ints": [
                {"name": _fbs_str(bag.Ints(j).Name()), "value": int(bag.Ints(j).Value())}
                for j in range(bag.IntsLength())
            ],
            "floats": [
                {"name": _fbs_str(bag.Floats(j).Name()), "value": float(bag.Floats(j).Value())}
                for j in range(bag.FloatsLength())
            ],
            "strings": [
                {"name": _fbs_str(bag.Strings(j).Name()), "value": _fbs_str(bag.Strings(j).Value())}
                for j in range(bag.StringsLength())
            ],
        }
    return out


def optimizer_groups_summary(ck: dict) -> list[dict]:
    """Compact per-group view like refcorpus' final_checkpoint_optimizer_groups."""
    return [
        {
            "group_name": g["group_name"],
            "step": g["step"],
            "initial_learning_rate": g["initial_learning_rate"],
            "params": [s["param_name"] for s in g["optimizer_states"]],
            "momentum_names": [m["name"] for m in g["optimizer_states"][0]["momentums"]]
            if g["optimizer_states"]
            else [],
        }
        for g in ck["optimizer_groups"]
    ]


def optimizer_state_arrays(ck: dict, prefix: str = "") -> dict[str, np.ndarray]:
    """`optim_state__<group>__<param>__<momentum>` arrays from a checkpoint read with_data=True."""
    arrays = {}
    for g in ck["optimizer_groups"]:
        for s in g["optimizer_states"]:
            for m in s["momentums"]:
                arrays[f"{prefix}optim_state__{g['group_name']}__{s['param_name']}__{m['name']}"] = m["array"]
    return arrays


def strip_arrays(obj: Any) -> Any:
    """Drop the decoded 'array' entries from a read_checkpoint(with_data=True) result."""
    if isinstance(obj, dict):
        return {k: strip_arrays(v) for k, v in obj.items() if k != "array"}
    if isinstance(obj, list):
        return [strip_arrays(v) for v in obj]
    return obj
