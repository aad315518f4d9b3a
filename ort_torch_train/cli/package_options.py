"""``package``'s options (the command runs in ``cli/package.py``, imported when it runs)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ort_torch_train.cli.runner import deferred

DESCRIPTION = """\
Compile a set of training artifacts ahead of time (AOTInductor) into a package of steps: the train
step (forward, backward, gradient accumulation), the eval step and the optimizer's update, each a
program that loads with no compiler and no compilation. Module(..., compile="package:DIR") trains
through it. The axes the models leave symbolic (the batch) stay dynamic where torch can keep them so.
The package records the artifacts, torch version and CPU it was built for and refuses any other.
Compiling takes a C++ compiler and a while (tens of seconds for a small model)."""


def add_package_parser(
    commands: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter], positive_int: Callable[[str], int]
) -> None:
    """Register ``package`` and its options."""
    parser = commands.add_parser(
        "package",
        help="compile the train, eval and optimizer steps ahead of time into a package folder",
        description=DESCRIPTION,
        epilog="examples:\n"
        "  ort-torch-train package artifacts/ --out packaged/\n"
        "  ort-torch-train package artifacts/ --out packaged/ --example-size 32\n"
        "  ort-torch-train package artifacts/ --export-outputs logits,probabilities",
        formatter_class=formatter,
    )
    parser.add_argument("artifacts", metavar="ARTIFACTS_DIR", help="folder holding the training artifacts")
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="the package's folder (created if missing; default ARTIFACTS_DIR/package, where the runtime with no "
        "Python looks for the package of a model file it is given)",
    )
    parser.add_argument(
        "--export-outputs",
        action="append",
        default=[],
        metavar="NAMES",
        help="comma-separated output names the runtime with no Python can export for inference, besides the eval "
        "model's outputs before its loss (repeat for more sets)",
    )
    parser.add_argument(
        "--example-size",
        type=positive_int,
        default=8,
        metavar="N",
        help="size of each symbolic axis in the example inputs; the only size where an axis cannot stay "
        "dynamic (default 8, at least 2)",
    )
    parser.set_defaults(run=deferred("package", "package", "run_package"))
