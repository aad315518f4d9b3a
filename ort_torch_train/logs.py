"""Logging under the ``ort_torch_train`` logger: silent unless asked.

Library code only logs (conversion, specialisation, compilation, checkpoint I/O); it never prints.
``ORT_TORCH_TRAIN_LOG=debug`` (or info, warning, ...) or the CLI's ``-v`` attach a stderr handler.
"""

from __future__ import annotations

import logging
import os

LOGGER_NAME = "ort_torch_train"
ENV_VARIABLE = "ORT_TORCH_TRAIN_LOG"


def enable(level: int | str = logging.DEBUG) -> logging.Logger:
    """Show the package's log records at ``level`` and above on stderr (once; later calls set the level)."""
    logger = logging.getLogger(LOGGER_NAME)
    if isinstance(level, str):
        name = level.strip().upper()
        if not isinstance(logging.getLevelName(name), int):
            raise ValueError(f"{ENV_VARIABLE}={level!r}: expected one of debug, info, warning, error")
        level = logging.getLevelName(name)
    if not any(getattr(handler, "_ort_torch_train", False) for handler in logger.handlers):
        handler = _BarAwareHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s", "%H:%M:%S"))
        handler._ort_torch_train = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(level)
    return logger


class _BarAwareHandler(logging.StreamHandler):
    """A stderr handler that writes through ``tqdm.write``: a progress bar is cleared first and redrawn
    below the record, so the two never share a line."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.stream)
        except Exception:
            self.handleError(record)


def configure_from_environment() -> None:
    """Apply ``ORT_TORCH_TRAIN_LOG`` when set; otherwise leave logging to the application."""
    logging.getLogger(LOGGER_NAME).addHandler(logging.NullHandler())
    level = os.environ.get(ENV_VARIABLE)
    if level:
        enable(level)
