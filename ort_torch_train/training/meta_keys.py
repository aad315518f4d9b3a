"""The facts the training layer keeps in a converted module's torch.fx ``meta`` dict (``module_meta.py``)."""

from __future__ import annotations

from ort_torch_train.module_meta import MetaKey
from ort_torch_train.training.dynamic_shapes import Axis, DynamicAxes, SizeProbes

# on a converted module until it is prepared: its probe conversions (``ForwardGraph.specialised``)
SIZE_PROBES: MetaKey[SizeProbes] = MetaKey("size_probes")
# on a converted module and on its prepared form: the dynamic axes the probes found (``dynamic_shapes.py``)
DYNAMIC_GROUPS: MetaKey[DynamicAxes] = MetaKey("dynamic_groups")
# on a prepared module: the (input position, axis) pairs to compile as dynamic dimensions
DYNAMIC_AXES: MetaKey[tuple[Axis, ...]] = MetaKey("dynamic_axes")
# on a prepared module with dynamic axes: the digest of its code before they were generalised, shared by
# the conversions of one graph for other sizes (``compile/fallbacks.py``: the key of the axes torch specialised)
GRAPH_STRUCTURE: MetaKey[str] = MetaKey("graph_structure")
