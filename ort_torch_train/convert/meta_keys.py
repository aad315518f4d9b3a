"""The facts a converted graph keeps in torch.fx ``meta`` dicts (``module_meta.py``) for the passes and steps."""

from __future__ import annotations

from ort_torch_train.module_meta import MetaKey

# on a converted module: the multiply-accumulates of each BLAS product its forward runs, in graph order
# (``matrix_products.py``), or None where they are not all known
MATRIX_PRODUCTS: MetaKey[list[int] | None] = MetaKey("matrix_products")
# on a graph input's placeholder: whether its example needed a gradient (noted only when examples are given)
INPUT_REQUIRES_GRAD: MetaKey[bool] = MetaKey("requires_grad")
# on a converted subgraph: the calls one run makes (``control_flow.graph_work``), counted once
GRAPH_WORK: MetaKey[int] = MetaKey("work")
