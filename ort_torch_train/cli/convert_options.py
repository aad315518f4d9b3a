"""``convert``'s options (the command runs in ``cli/convert.py``, imported when it runs)."""

from __future__ import annotations

import argparse

from ort_torch_train.cli.runner import deferred

FORMATS = ("ort", "safetensors", "pt")

DESCRIPTION = """\
Convert model parameters between an ORT checkpoint (the `checkpoint` file of the artifacts, or one
saved by training), a safetensors file and a torch state_dict saved with torch.save (read back with
torch.load(weights_only=True)). The format follows the extension (.safetensors; .pt or .pth; anything
else is an ORT checkpoint) unless --from/--to say otherwise.

Only parameter values are converted. An ORT checkpoint also records which parameters are trained,
properties and optimizer state, which safetensors and state_dicts lack: converting INTO an ORT
checkpoint takes them from --template (an ORT checkpoint or an artifacts folder, e.g. the one the
parameters came from). The names must match the template's exactly and every dtype and shape must
equal it; the template's trainability and properties are kept, its optimizer state is not written
(it belongs to other values)."""

EXAMPLES = """\
examples:
  ort-torch-train convert run/checkpoint model.safetensors
  ort-torch-train convert run/checkpoint model.pt
  ort-torch-train convert model.safetensors run/checkpoint2 --template artifacts/
  ort-torch-train convert weights.bin model.safetensors --from pt"""


def add_convert_parser(commands: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    """Register ``convert`` and its options."""
    parser = commands.add_parser(
        "convert",
        help="convert parameters between ORT checkpoint, safetensors and torch state_dict files",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=formatter,
    )
    parser.add_argument("src", metavar="SRC", help="file to read")
    parser.add_argument("dst", metavar="DST", help="file to write (replaced atomically)")
    parser.add_argument(
        "--from", dest="from_format", choices=FORMATS, help="format of SRC (default: from its extension)"
    )
    parser.add_argument("--to", dest="to_format", choices=FORMATS, help="format of DST (default: from its extension)")
    parser.add_argument(
        "--template",
        metavar="CHECKPOINT_OR_DIR",
        help="ORT checkpoint or artifacts folder giving trainability and properties "
        "(needed for ort output, ignored otherwise)",
    )
    parser.set_defaults(run=deferred("convert", "convert", "run_convert"))
