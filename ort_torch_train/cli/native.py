"""``ort-torch-train native``: build the C/C++ training library (or, ``--packaged``, the runtime with no Python) and
print the flags programs need."""

from __future__ import annotations

import argparse
import shlex
from typing import Any


def add_native_parser(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    """Register ``native build`` and ``native flags``."""
    parser = commands.add_parser(
        "native",
        help="build the C/C++ training API library (libort_torch_train)",
        description="Build libort_torch_train (ONNX Runtime's OrtTrainingApi answered by this engine) from the "
        "sources in the package, with the system C compiler; print the flags a program needs. See docs/native.md.",
        formatter_class=formatter,
    )
    actions = parser.add_subparsers(title="actions", metavar="ACTION", required=True)
    build = actions.add_parser("build", help="compile the library into PREFIX/lib, headers into PREFIX/include")
    build.add_argument("--prefix", required=True, help="install folder (created)")
    packaged_help = "the runtime with no Python (libort_torch_train_packaged: packages of steps, libtorch only)"
    build.add_argument("--packaged", action="store_true", help=packaged_help)
    build.set_defaults(run=_run_build)
    show = actions.add_parser("flags", help="print the compile and link flags for a library built under PREFIX")
    show.add_argument("--prefix", required=True, help="the folder given to native build")
    show.add_argument("--cflags", action="store_true", help="only the compile flags")
    show.add_argument("--libs", action="store_true", help="only the link flags")
    show.add_argument("--packaged", action="store_true", help=packaged_help)
    show.set_defaults(run=_run_flags)


def _run_build(args: argparse.Namespace) -> None:
    from ort_torch_train.native import build
    from ort_torch_train.native.packaged_build import build_packaged

    built = build_packaged(args.prefix) if args.packaged else build(args.prefix)
    print(f"built {built.library}")
    _print_flags(built.cflags, built.libs)


def _run_flags(args: argparse.Namespace) -> None:
    from ort_torch_train.native import flags
    from ort_torch_train.native.packaged_build import packaged_flags

    found = packaged_flags(args.prefix) if args.packaged else flags(args.prefix)
    if not found.library.exists():
        again = " --packaged" if args.packaged else ""
        raise FileNotFoundError(f"no {found.library}: run `ort-torch-train native build{again} --prefix {args.prefix}`")
    both = not (args.cflags or args.libs)
    print(shlex.join((found.cflags if both or args.cflags else []) + (found.libs if both or args.libs else [])))


def _print_flags(cflags: list[str], libs: list[str]) -> None:
    print("cflags: " + shlex.join(cflags))
    print("libs: " + shlex.join(libs))
