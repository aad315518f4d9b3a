"""Load ``ort_torch_train`` and its adapters from a checkout given by path (this one, or another commit's tree
for a "before" figure), ahead of any installed copy."""

from __future__ import annotations

import importlib.util
import sys


def import_checkout(root: str) -> None:
    """Make ``ort_torch_train`` and ``ort_torch_train.adapters`` the ones under ``root``; call it before anything
    imports the package."""
    sys.path.insert(0, root)
    import ort_torch_train  # noqa: F401  (the checkout's, then its adapters as ort_torch_train.adapters)

    spec = importlib.util.spec_from_file_location(
        "ort_torch_train.adapters", f"{root}/adapters/__init__.py", submodule_search_locations=[f"{root}/adapters"]
    )
    assert spec is not None and spec.loader is not None
    adapters = importlib.util.module_from_spec(spec)
    sys.modules["ort_torch_train.adapters"] = adapters
    spec.loader.exec_module(adapters)
