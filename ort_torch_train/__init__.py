"""ort-torch-train: ONNX Runtime's on-device training API, executed by PyTorch.

Change ``from onnxruntime.training.api import ...`` to ``from ort_torch_train.api import ...``.
"""

__version__ = "0.1.0"

from ort_torch_train.logs import configure_from_environment as _configure_logging

_configure_logging()
