"""``import ort_torch_train`` and a conversion work with torchvision absent, broken or present."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.helpers.timeouts import scaled

PROBE = textwrap.dedent(
    """
    import json, sys
    {setup}
    import onnx
    import ort_torch_train.api
    from ort_torch_train.convert.registry import converter_for
    from ort_torch_train.onnx2torch_import import import_onnx2torch
    import_onnx2torch()
    converter_for("", "NonMaxSuppression", 17, False)  # a converter module that imports torchvision
    tv = sys.modules.get("torchvision")
    print(json.dumps({{"torchvision_in_sys_modules": tv is not None,
                       "torchvision_file": getattr(tv, "__file__", None)}}))
    """
)

BLOCK_TORCHVISION = """
import importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Block())
"""

BREAK_TORCHVISION = """
import importlib.abc, importlib.machinery
class Broken(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name == "torchvision":
            return importlib.machinery.ModuleSpec(name, self)
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        raise RuntimeError("operator torchvision::nms does not exist")
sys.meta_path.insert(0, Broken())
"""


def _probe(setup: str, extra_path: str | None = None) -> dict:
    code = PROBE.format(setup=setup)
    env_path = [extra_path] if extra_path else []
    command = [sys.executable, "-c", f"import sys; sys.path[:0] = {env_path!r}\n" + code]
    result = subprocess.run(command, capture_output=True, text=True, timeout=scaled(300))
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_absent_torchvision():
    seen = _probe(BLOCK_TORCHVISION)
    assert seen["torchvision_in_sys_modules"] is False  # no stand-in left behind


@pytest.mark.slow
def test_broken_torchvision():
    seen = _probe(BREAK_TORCHVISION)
    assert seen["torchvision_in_sys_modules"] is False


@pytest.mark.slow
def test_working_torchvision_is_used(tmp_path):
    package = tmp_path / "torchvision"
    (package / "ops").mkdir(parents=True)
    (package / "__init__.py").write_text("from . import ops\n")
    (package / "ops" / "__init__.py").write_text(
        "def nms(*a): pass\ndef box_convert(*a, **k): pass\ndef roi_align(*a, **k): pass\n"
    )
    seen = _probe("", str(tmp_path))
    assert seen["torchvision_in_sys_modules"] is True
    assert seen["torchvision_file"] == str(package / "__init__.py")


@pytest.mark.slow
@pytest.mark.parametrize("setup", [BLOCK_TORCHVISION, BREAK_TORCHVISION])
def test_stand_in_never_reaches_the_user(setup):
    code = (
        setup + "\nimport ort_torch_train.convert.registry, sys\n"
        "from ort_torch_train.onnx2torch_import import import_onnx2torch\nimport_onnx2torch()\n"
        "try:\n    import torchvision\n    print('imported')\nexcept Exception as e:\n    print(type(e).__name__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", "import sys\n" + code], capture_output=True, text=True, timeout=scaled(300)
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] in ("ModuleNotFoundError", "RuntimeError")
