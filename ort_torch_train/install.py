"""Install ort-torch-train's dependencies next to the torch already installed, without torchvision.

``pip install ort-torch-train`` lets pip follow onnx2torch's own requirement on torchvision: pip then
takes the newest torchvision, which pins a newer torch, and replaces the user's torch (a CPU build by
a CUDA one); pinning torch instead gives a torchvision that cannot be imported beside a CPU torch.
The project never uses torchvision. So the package is installed with ``--no-deps`` and then::

    python -m ort_torch_train.install              # the dependencies, the installed torch kept
    python -m ort_torch_train.install --print      # only list them
    python -m ort_torch_train.install --extra data # and an extra's (data, cli, docs, ...)

onnx2torch goes in with ``--no-deps``; every other requirement goes through pip with the installed
torch's exact version as a constraint, so pip can neither upgrade nor replace it.
Only the standard library is used: this runs before the dependencies are there.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
import tempfile
from pathlib import Path

DISTRIBUTION = "ort-torch-train"
_NO_DEPS = ("onnx2torch",)  # declares torchvision, which it imports only for two converters
EXPECTED_PIP_CHECK = "onnx2torch 1.5.15 requires torchvision, which is not installed."  # the README says so


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _extra_of(requirement: str) -> str | None:
    found = re.search(r"""extra\s*==\s*["']([^"']+)["']""", requirement)
    return found.group(1) if found else None


def requirements(extras: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """The installed distribution's requirements, split into (installed with pip's resolver,
    installed with ``--no-deps``). ``extras`` adds those extras' requirements, their markers dropped."""
    declared = importlib.metadata.requires(DISTRIBUTION) or []
    resolved: list[str] = []
    no_deps: list[str] = []
    for requirement in declared:
        extra = _extra_of(requirement)
        if extra is not None:
            if extra not in extras:
                continue
            requirement = requirement.split(";", 1)[0].strip()
        (no_deps if _name(requirement) in _NO_DEPS else resolved).append(requirement)
    return resolved, no_deps


def _installed_torch() -> str | None:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


NO_TORCH = f"""\
{DISTRIBUTION}: no torch is installed in this environment ({sys.executable}); pip would pick one (often a
CUDA build with its nvidia packages). Install the torch build you want first, then run this again:
    {sys.executable} -m pip install torch --index-url https://download.pytorch.org/whl/cpu    # CPU
    {sys.executable} -m pip install torch                                                    # CUDA (Linux)
(https://pytorch.org/get-started/locally/ lists the others)"""


def known_extras() -> list[str]:
    """The extras the installed distribution declares."""
    return sorted(importlib.metadata.metadata(DISTRIBUTION).get_all("Provides-Extra") or [])


def install(extras: tuple[str, ...] = ()) -> None:
    """Install the requirements with this interpreter's pip, keeping the installed torch (SystemExit
    when there is none: the user chooses its build)."""
    torch = _installed_torch()
    if torch is None:
        raise SystemExit(NO_TORCH)
    resolved, no_deps = requirements(extras)
    pip = [sys.executable, "-m", "pip", "install"]
    # pip's closing conflict check would call onnx2torch missing (installed next) an ERROR: not shown
    quiet = ["--no-warn-conflicts"] if no_deps else []
    with tempfile.TemporaryDirectory() as directory:
        constraints = Path(directory, "constraints.txt")
        constraints.write_text(f"torch=={torch}\n")
        subprocess.run([*pip, *quiet, "-c", str(constraints), *resolved], check=True)
    if no_deps:  # last, without a check: its torchvision requirement is the one `pip check` then reports
        subprocess.run([*pip, "--no-deps", *no_deps], check=True)
        print(f'{DISTRIBUTION}: done; `pip check` says "{EXPECTED_PIP_CHECK}": expected (torchvision is never used)')


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ort_torch_train.install", description=__doc__.split("\n")[0])
    parser.add_argument("--extra", action="append", default=[], help="also an extra's requirements (repeatable)")
    parser.add_argument("--print", action="store_true", help="list the requirements instead of installing them")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.extra) - set(known_extras()))
    if unknown:
        parser.error(f"unknown --extra {', '.join(unknown)}; the extras are {', '.join(known_extras())}")
    if args.print:
        resolved, no_deps = requirements(tuple(args.extra))
        print("\n".join(resolved + [f"{r}  # --no-deps" for r in no_deps]))
        return
    install(tuple(args.extra))


if __name__ == "__main__":
    main()
