"""Where an ORT checkpoint is read from: a file (with its external data file, read through descriptors opened
once) or bytes in memory. Needs no torch."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ..errors import CheckpointError, SpecialFileError
from .odtc_walk import ExternalReader
from .pair import PairReader

Decoded = TypeVar("Decoded")


class ExternalDataFile:
    """A checkpoint's external data file, read through the pair's open descriptor; every read bounds-checked."""

    def __init__(self, checkpoint_path: Path | None, pair: PairReader | None = None) -> None:
        self.checkpoint_path = checkpoint_path
        self.pair = pair
        self.checked = False
        self.total_read = 0

    def __call__(self, offset: int, nbytes: int, what: str) -> bytearray:
        if self.checkpoint_path is None or self.pair is None:
            raise CheckpointError(
                "External data is present in the checkpoint but the checkpoint path is not "
                "provided. External data with loading from buffer is not supported."
            )
        pair, path = self.pair, self.pair.data_file
        if pair.data_fd is None:
            raise CheckpointError(
                f"Failed to open checkpoint's external data file: {str(path)!r} (the "
                f"checkpoint {str(self.checkpoint_path)!r} declares external data)."
            )
        if not self.checked:
            pair.check_data_file()
            self.checked = True
        size = pair.data_size
        if offset + nbytes > size:
            raise CheckpointError(
                f"Failed reading external checkpoint data. {what} needs bytes [{offset}, "
                f"{offset + nbytes}) of {str(path)!r}, which holds {size} bytes."
            )
        self.total_read += nbytes
        if self.total_read > size:
            raise CheckpointError(
                f"Checkpoint is invalid. Tensors share external data: together they read more "
                f"than the {size} bytes of {str(path)!r}."
            )
        return pair.read_data(offset, nbytes)


def read_source(
    source: str | os.PathLike | bytes | bytearray | memoryview,
    decode: Callable[[bytes | bytearray | memoryview, ExternalReader], Decoded],
) -> Decoded:
    """``decode`` run on a checkpoint's bytes (a file's, or the bytes given) and its external data reader.

    Raises FileNotFoundError / IsADirectoryError for a bad path and CheckpointError for a device or FIFO
    at the path. A pair with external data is read from descriptors opened once: saves running meanwhile
    cannot mix it.
    """
    if isinstance(source, bytes | bytearray | memoryview):
        return decode(source, ExternalDataFile(None))
    if not isinstance(source, str | os.PathLike):
        raise TypeError(f"checkpoint source must be a path or bytes, got {type(source).__name__}")
    path = Path(source)
    try:
        pair = PairReader(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"checkpoint file {str(path)!r} does not exist") from None
    except IsADirectoryError:
        raise IsADirectoryError(f"checkpoint path {str(path)!r} is a directory, expected a file") from None
    except SpecialFileError as error:
        raise CheckpointError(str(error)) from None
    with pair:
        return decode(pair.checkpoint_bytes(), ExternalDataFile(path, pair))
