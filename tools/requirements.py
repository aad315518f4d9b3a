"""Print the project's requirements from pyproject.toml, one per line, for the Makefile's install.

``requirements.py EXTRA...`` prints the dependencies and the named extras except onnx2torch;
``requirements.py --onnx2torch`` prints only the onnx2torch pin. onnx2torch is installed without its
dependencies because it declares torchvision, which the project never uses and which, from PyPI,
does not match a CPU torch (``operator torchvision::nms does not exist``); its real needs (torch,
onnx, numpy) are the project's own dependencies.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def requirement_name(requirement: str) -> str:
    """The normalised distribution name of a requirement string."""
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def main(argv: list[str]) -> None:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    requirements = list(project["dependencies"])
    if argv == ["--onnx2torch"]:
        print("\n".join(r for r in requirements if requirement_name(r) == "onnx2torch"))
        return
    for extra in argv:
        requirements += project["optional-dependencies"][extra]
    print("\n".join(r for r in requirements if requirement_name(r) != "onnx2torch"))


if __name__ == "__main__":
    main(sys.argv[1:])
