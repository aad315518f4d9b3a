"""``python -m ort_torch_train.install`` never lets pip choose torch: with none installed it stops and
says how to install the one the user wants; an unknown ``--extra`` is an error listing the known ones."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ort_torch_train.install import known_extras, main

ROOT = Path(__file__).resolve().parents[2]


def test_without_torch_it_stops_before_pip_and_says_how_to_install_torch(tmp_path) -> None:
    metadata = Path(str(importlib.metadata.distribution("ort-torch-train")._path))  # type: ignore[attr-defined]
    shutil.copytree(metadata, tmp_path / "path" / metadata.name)  # the package's metadata, without torch's
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path / "path")]), "PIP_NO_INDEX": "1"}
    # -S: no site-packages, so neither torch nor pip is there (nothing could be installed if it went ahead)
    done = subprocess.run(
        [sys.executable, "-S", "-m", "ort_torch_train.install"], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 1, done.stderr
    assert "no torch is installed" in done.stderr and "pip install torch --index-url" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_an_unknown_extra_is_an_error_listing_the_known_ones(capsys) -> None:
    assert {"data", "cli"} <= set(known_extras())
    with pytest.raises(SystemExit) as refused:
        main(["--extra", "data", "--extra", "dta", "--print"])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert "unknown --extra dta; the extras are " + ", ".join(known_extras()) in err


def test_known_extras_are_listed(capsys) -> None:
    main(["--extra", "data", "--print"])
    assert "pyarrow" in capsys.readouterr().out
