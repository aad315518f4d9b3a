"""``ort-torch-train package``: training artifacts compiled ahead of time into a package of steps."""

from __future__ import annotations

import argparse
from pathlib import Path

from ort_torch_train.cli.common import find_artifacts
from ort_torch_train.cli.errors import CliError
from ort_torch_train.training.package.build import DEFAULT_FOLDER, build_package


def run_package(args: argparse.Namespace) -> None:
    """Build the package and say what it holds."""
    paths = find_artifacts(args.artifacts)
    paths.require("training_model", args.artifacts)
    paths.require("checkpoint", args.artifacts)
    if args.example_size < 2:
        raise CliError(f"--example-size: expected at least 2 (sizes 0 and 1 specialise), got {args.example_size}")
    sets = [[name.strip() for name in names.split(",")] for names in args.export_outputs]
    if any(not all(names) for names in sets):
        raise CliError(f"--export-outputs: expected comma-separated output names, got {args.export_outputs}")
    out = args.out if args.out is not None else str(Path(args.artifacts) / DEFAULT_FOLDER)
    manifest = build_package(args.artifacts, out, example_size=args.example_size, export_outputs=sets)
    steps = [name for name, program in (("train", manifest.train), ("eval", manifest.eval)) if program is not None]
    if manifest.optimizer is not None:
        steps.append(f"optimizer ({manifest.optimizer_algorithm})")
    dynamic = sorted({e.name for e in manifest.train.inputs if None in e.shape})
    print(f"package {out}: steps {', '.join(steps)}; dynamic inputs {dynamic or 'none'}")
