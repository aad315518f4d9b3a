"""``evaluate``'s options (the command runs in ``cli/evaluate.py``, imported when it runs)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ort_torch_train.cli.runner import deferred

DESCRIPTION = """\
Evaluate a checkpoint on a data file with the eval model: the eval loss and the metrics asked for,
printed as text or JSON. Nothing is written: not the checkpoint, not a metrics file. The data are
read as `train --eval-data` reads them (an .npz, Parquet, Arrow, CSV or JSON-lines file; see
`train --help`, data layout), in chunks of --batch-size rows, the last one partial."""

EXAMPLES = """\
examples:
  ort-torch-train evaluate artifacts/ --checkpoint run/ckpt --data test.parquet --metric accuracy
  ort-torch-train evaluate artifacts/ --checkpoint run/ckpt.best --data test.npz --inputs x,y --json
  ort-torch-train evaluate artifacts/ --data test.csv --metric mae --metric rmse      (the untrained checkpoint)"""


def add_evaluate_parser(
    commands: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter], positive_int: Callable[[str], int]
) -> None:
    """Register ``evaluate`` and its options."""
    parser = commands.add_parser(
        "evaluate",
        help="evaluate a checkpoint on a data file (eval loss and metrics; writes nothing)",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=formatter,
    )
    parser.add_argument("artifacts", metavar="ARTIFACTS_DIR", help="folder holding the training and eval models")
    parser.add_argument(
        "--checkpoint", metavar="CKPT", help="the parameters to evaluate (default: ARTIFACTS_DIR/checkpoint)"
    )
    parser.add_argument("--data", required=True, metavar="DATA", help="the data file (formats as train's --data)")
    parser.add_argument("--inputs", metavar="KEY1,KEY2", help="arrays/columns for the eval model's inputs")
    parser.add_argument(
        "--batch-size", type=positive_int, default=32, metavar="N", help="rows per evaluated chunk (default 32)"
    )
    parser.add_argument(
        "--metric",
        action="append",
        metavar="NAME",
        help="accuracy, perplexity, mae, rmse, r2, or package.module:function (of outputs, batch); "
        "repeat for several; the eval loss is always reported",
    )
    parser.add_argument("--device", default="auto", help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(run=deferred("evaluate", "evaluate", "run_evaluate"))
