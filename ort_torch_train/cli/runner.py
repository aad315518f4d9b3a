"""Commands run by name: a command's module (and torch, onnx, ... with it) is imported only when the
command runs, so that ``--help``, ``--version`` and usage errors answer without them."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

from ort_torch_train.cli.errors import CliError

Runner = Callable[[argparse.Namespace], None]

REQUIREMENTS = {  # the packages a command cannot run without, and how to get them
    "torch": "pip install torch (https://pytorch.org: the CPU or CUDA build)",
    "onnx": "pip install onnx",
    "numpy": "pip install numpy",
    "onnx2torch": "pip install onnx2torch",
}


class DeferredCommand:
    """The runner of ``command``: ``module.function(args)``, the module imported at the call.

    A package the command needs that cannot be imported (when the module loads, or later in the run) is a
    CliError naming the command, the package and how to install it.
    """

    def __init__(self, command: str, module: str, function: str) -> None:
        self.command = command
        self.module = module
        self.function = function

    def __call__(self, args: argparse.Namespace) -> None:
        try:  # the run too: a command that needs torch only for some inputs imports it then
            run: Runner = getattr(importlib.import_module(self.module), self.function)
            run(args)
        except ImportError as error:
            missing = (error.name or "").partition(".")[0]
            if missing not in REQUIREMENTS:
                raise
            raise CliError(
                f"`ort-torch-train {self.command}` needs {missing}, which cannot be imported ({error}): "
                f"{REQUIREMENTS[missing]}"
            ) from error


def deferred(command: str, module: str, function: str) -> Runner:
    """The runner of ``command`` that imports ``ort_torch_train.cli.<module>`` when it runs."""
    return DeferredCommand(command, f"ort_torch_train.cli.{module}", function)
