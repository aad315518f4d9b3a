"""The ``ort-torch-train`` command line: generate, inspect, train, evaluate, convert, export and package ONNX
Runtime training artifacts.

Every failure the user can act on (bad paths, npz keys, dtypes, shapes, files that are not what
they should be) ends as one line ``ort-torch-train: error: ...`` on stderr and exit status 1;
``--traceback`` shows the full Python traceback instead.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from typing import NoReturn

from ort_torch_train import __version__
from ort_torch_train.cli.config import add_config_option, expand_command_config, expand_config
from ort_torch_train.cli.convert_options import add_convert_parser
from ort_torch_train.cli.errors import CliError
from ort_torch_train.cli.evaluate_options import add_evaluate_parser
from ort_torch_train.cli.export_options import add_export_parser
from ort_torch_train.cli.generate_options import add_generate_parser
from ort_torch_train.cli.inspect_options import add_inspect_parser
from ort_torch_train.cli.native import add_native_parser
from ort_torch_train.cli.package_options import add_package_parser
from ort_torch_train.cli.runner import deferred
from ort_torch_train.cli.train_options import add_train_parser
from ort_torch_train.logs import enable

PROG = "ort-torch-train"

DESCRIPTION = """\
Train ONNX Runtime on-device training artifacts (training_model.onnx, eval_model.onnx,
optimizer_model.onnx, checkpoint) with PyTorch: the files ORT's generate_artifacts writes,
trained behind ORT's API."""

EPILOG = """\
examples:
  ort-torch-train generate model.onnx --requires-grad all --loss CrossEntropyLoss --output artifacts
  ort-torch-train inspect artifacts/
  ort-torch-train train artifacts/ --data train.npz --epochs 3 --output run/checkpoint
  ort-torch-train train artifacts/ --data train.parquet --max-steps 500 --output run/checkpoint
  ort-torch-train train artifacts/ --data train.parquet --max-steps 500 --resume run/checkpoint --output run/checkpoint
  ort-torch-train evaluate artifacts/ --checkpoint run/checkpoint --data test.parquet --metric accuracy
  ort-torch-train convert run/checkpoint model.safetensors
  ort-torch-train train artifacts/ --data train.npz --steps 100 --lora r=8,alpha=16,targets=all-linear
  ort-torch-train export artifacts/ --checkpoint run/checkpoint --output model.onnx --adapter task.onnx_adapter
  ort-torch-train package artifacts/ --out packaged/
  ort-torch-train native build --prefix ~/.local/ort-torch-train

Run `ort-torch-train COMMAND --help` for each command's options."""


class ArgumentParser(argparse.ArgumentParser):
    """Usage errors as one line, like every other error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description and epilog paragraphs as written; wider option column."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32)


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def learning_rate(text: str) -> float:
    """argparse type: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def _integer(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if abs(value) >= 2**63:  # step counts are int64 in checkpoints and in torch
        raise argparse.ArgumentTypeError(f"expected an integer below 2**63, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with its commands."""
    parser = ArgumentParser(prog=PROG, description=DESCRIPTION, epilog=EPILOG, formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--traceback", action="store_true", help="show Python tracebacks instead of one-line errors")
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log what conversion, compilation and checkpoint I/O do (-v info, -vv debug; "
        "or set ORT_TORCH_TRAIN_LOG=debug)",
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    add_generate_parser(commands, HelpFormatter, non_negative_int)
    add_inspect_parser(commands, HelpFormatter)
    add_config_option(
        add_train_parser(
            commands,
            HelpFormatter,
            positive_int,
            non_negative_int,
            learning_rate,
            deferred("train", "train", "run_train"),
        )
    )
    add_evaluate_parser(commands, HelpFormatter, positive_int)
    add_convert_parser(commands, HelpFormatter)
    add_export_parser(commands, HelpFormatter)
    add_package_parser(commands, HelpFormatter, positive_int)
    add_native_parser(commands, HelpFormatter)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status (0 success, 1 error, 2 usage, 130 interrupted)."""
    parser = build_parser()
    try:
        argv = expand_config(sys.argv[1:] if argv is None else list(argv), parser)
        argv = expand_command_config(argv, parser, "generate", positional="model")
    except CliError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if args.verbose:
        enable(logging.INFO if args.verbose == 1 else logging.DEBUG)
    try:
        args.run(args)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)  # train has saved its checkpoint by then
        return 130
    except BrokenPipeError:  # stdout closed early (`| head`): stop quietly, as other commands do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error when Python flushes at exit
        return 141
    except Exception as error:  # one line for the user; --traceback for the details
        if args.traceback:
            raise
        print(f"{PROG}: error: {error_message(error)}", file=sys.stderr)
        return 1
    return 0


def error_message(error: Exception) -> str:
    """The error as one line: the first line of its message, with its type where the message needs it."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"{error.strerror}: {error.filename!r}"
    text = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
    first = text.strip().splitlines()[0] if text.strip() else ""
    explained = (
        isinstance(error, CliError)
        or type(error) in (ValueError, RuntimeError)
        or (type(error).__module__.startswith("ort_torch_train"))
    )
    if first and explained:
        return first
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


if __name__ == "__main__":
    sys.exit(main())
