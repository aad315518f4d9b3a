"""Exceptions raised by ort-torch-train.

Each one also derives from RuntimeError, the type onnxruntime-training raises, so code written
against ORT keeps catching them, while Python code can catch the precise builtin type.
"""


class CheckpointError(RuntimeError, ValueError):
    """A checkpoint file or buffer is missing, malformed, or does not match what was expected."""


class InputError(RuntimeError, ValueError):
    """A user input does not match the model's declared input (count, dtype, rank, dimension)."""


class InputTypeError(RuntimeError, TypeError):
    """A user input has the wrong Python or element type."""


class ModelError(RuntimeError, ValueError):
    """An ONNX model (training, eval or optimizer) cannot be used as given."""


class UnsupportedOperatorError(ModelError, NotImplementedError):
    """A graph holds an operator that no converter handles."""


class NominalStateError(RuntimeError):
    """An operation needs parameter values but the checkpoint state is nominal."""


class PropertyError(RuntimeError, TypeError, ValueError):
    """A checkpoint property name or value cannot be stored as ORT stores properties."""


class SafetensorsError(CheckpointError):
    """A safetensors file is malformed or does not match the tensors it should load into."""


class ParameterDataError(RuntimeError, ValueError):
    """Data given for a parameter does not match its name set, shape or element type."""


class UnsupportedTypeError(TypeError, ValueError):
    """An element type or dtype has no equivalent on the other side (ONNX <-> torch)."""


class DistributedError(RuntimeError):
    """Distributed training is misused or failed: no process group, ranks out of step, a rank lost."""


class SpecialFileError(RuntimeError, ValueError):
    """A path names a device, FIFO, socket or directory where a regular file is needed."""


class PathOutsideError(RuntimeError, ValueError):
    """A path the product would write leaves the folder the user named (``..``, absolute, or a symlink)."""


class IndexRangeError(RuntimeError, IndexError):
    """An index read from the data lies outside the range its operator allows: ``value``, outside ``valid``
    (low, high), where they are known."""

    def __init__(self, message: str, value: int | None = None, valid: tuple[int, int] | None = None) -> None:
        super().__init__(message)
        self.value = value
        self.valid = valid


class GraphSizeError(ModelError, MemoryError):
    """A graph would allocate or unroll more than can be done: a tensor or loop of an impossible size."""


class OrtFormatModelError(ModelError):
    """A model in ONNX Runtime's own format (.ort, FlatBuffers) that is damaged or holds what cannot be read."""


class PackageError(RuntimeError, ValueError):
    """A packaged step (``ort-torch-train package``) that cannot serve here: built from other artifacts, with
    another torch or for another CPU, or an incomplete or malformed package."""
