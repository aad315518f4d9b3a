"""The native C and C++ training API: ``libort_torch_train`` answers ONNX Runtime's ``OrtTrainingApi``.

The C sources and headers ship in this package (``src/``, ``include/``); ``build`` compiles them on the
user's machine (``ort-torch-train native build --prefix DIR``) and ``bridge`` is what the library calls
through the embedded interpreter. See docs/native.md.
"""

from ort_torch_train.native.build import Flags, NativeBuildError, build, flags

__all__ = ["Flags", "NativeBuildError", "build", "flags"]
