"""Import onnx2torch whether torchvision is present, absent or broken.

onnx2torch imports torchvision at module import only for its NonMaxSuppression and RoiAlign
converters. When the real torchvision cannot be imported (absent, or a CUDA build next to a CPU
torch), a stand-in is placed in ``sys.modules`` only for the duration of that import and removed
afterwards, so the user's environment never sees a fake torchvision.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import types
from collections.abc import Callable
from types import ModuleType
from typing import NoReturn


def _real_torchvision_importable() -> bool:
    before = set(sys.modules)
    try:
        importlib.import_module("torchvision")
        return True
    except Exception:  # a broken build raises RuntimeError, OSError, ...
        for name in set(sys.modules) - before:
            if name == "torchvision" or name.startswith("torchvision."):
                del sys.modules[name]
        return False


def _unavailable(name: str) -> Callable[..., NoReturn]:
    def fail(*args: object, **kwargs: object) -> NoReturn:
        raise RuntimeError(f"torchvision.ops.{name} is needed by this graph but torchvision cannot be imported")

    return fail


def _stand_ins() -> dict[str, ModuleType]:
    ops = types.ModuleType("torchvision.ops")
    for name in ("nms", "box_convert", "roi_align"):
        setattr(ops, name, _unavailable(name))
    root = types.ModuleType("torchvision")
    vars(root)["ops"] = ops
    for module in (root, ops):
        module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, loader=None)
    return {"torchvision": root, "torchvision.ops": ops}


def import_onnx2torch() -> ModuleType:
    """Return the onnx2torch module, importing it safely on first use."""
    if "onnx2torch" in sys.modules:
        return sys.modules["onnx2torch"]
    if _real_torchvision_importable():
        return importlib.import_module("onnx2torch")
    stand_ins = _stand_ins()
    sys.modules.update(stand_ins)
    try:
        return importlib.import_module("onnx2torch")
    finally:
        for name in stand_ins:
            if sys.modules.get(name) is stand_ins[name]:
                del sys.modules[name]
