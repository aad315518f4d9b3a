"""Puts distributions installed in this interpreter into a fresh venv the way pip leaves them (their
RECORD's files under site-packages, dist-info included, the bytecode of those already imported here, and
their console scripts), as hard links: pip in that venv sees them installed, and a pip that replaced one
would unlink its links, never the files here."""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import os
import shutil
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

_CONSOLE_SCRIPT = """#!{python}
import sys
from {module} import {function}
if __name__ == "__main__":
    sys.exit({function}())
"""


def requirement_closure(names: list[str]) -> list[metadata.Distribution]:
    """The installed distributions ``names`` and everything they require here (extras left out)."""
    found: dict[str, metadata.Distribution] = {}
    pending = list(names)
    while pending:
        name = canonicalize_name(pending.pop())
        if name in found:
            continue
        found[name] = metadata.distribution(name)
        for line in found[name].requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(requirement.name)
    return list(found.values())


def venv_site_packages(venv: Path) -> Path:
    """The site-packages folder of ``venv`` (made by this interpreter's ``venv``)."""
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    assert site.is_dir(), f"{venv} has no site-packages at {site}"
    return site


def link_distributions(venv: Path, names: list[str]) -> list[str]:
    """Installs ``names`` and their requirements into ``venv`` as links to this interpreter's files;
    returns the distributions' names."""
    site = venv_site_packages(venv)
    distributions = requirement_closure(names)
    for distribution in distributions:
        for record in distribution.files or []:
            if str(record).startswith(".."):  # the console scripts: written below for this venv's python
                continue
            source = Path(str(distribution.locate_file(record)))
            if not source.is_file():  # a bytecode file RECORD lists that this install never wrote
                continue
            _link(source, site / record)
            if source.suffix == ".py":  # its bytecode, as pip's default install writes it (valid: same mtime)
                cached = Path(importlib.util.cache_from_source(str(source)))
                if cached.is_file():
                    _link(cached, site / record.parent / cached.parent.name / cached.name)
        for entry in distribution.entry_points.select(group="console_scripts"):
            script = venv / "bin" / entry.name
            script.write_text(_CONSOLE_SCRIPT.format(python=venv / "bin" / "python", **_target(entry.value)))
            script.chmod(0o755)
    return [str(distribution.metadata["Name"]) for distribution in distributions]


def _link(source: Path, target: Path) -> None:
    if target.exists():  # bytecode RECORD lists too (pip's own), linked with its source already
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:  # another file system: a copy
        shutil.copy2(source, target)


def _target(value: str) -> dict[str, str]:
    module, _, function = value.partition(":")
    assert function and "." not in function, f"entry point {value!r}: expected module:function"
    return {"module": module, "function": function}
