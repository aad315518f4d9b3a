"""The facts the graph rewrites keep in a module's torch.fx ``meta`` dict (``module_meta.py``)."""

from __future__ import annotations

from collections import Counter

from ort_torch_train.module_meta import MetaKey

# how many times each rewrite fired on the module, by the rewrite's name
FUSIONS: MetaKey[Counter[str]] = MetaKey("fusions")
