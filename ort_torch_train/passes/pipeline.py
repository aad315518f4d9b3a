"""The rewrites a converted forward graph goes through before it runs: one pipeline for eager runs,
one for torch.compile, both applied by ``training/forward_graph.py``.

Each starts with the fusions (``fuse.py``: exported op sequences back into the torch calls they came
from) on the converted graph and on the converted subgraphs it calls (If/Loop/Scan bodies,
FlexAttention's mods). Then comes the restructuring a forward graph may ask for (recompute's
checkpointed segments, ``RESTRUCTURE``), and last the rewrites for one way of running the module,
which see its top graph only:

* eager: row-wise regions on 2-D activations (``fuse_rows.py``), then low-precision frozen parameters
  upcast inside the ops that read them (``frozen_upcasts.py``);
* compiled: reshapes merging a permute's axes read a row-major copy (``permuted_merges.py``), patch
  convolutions as matrix products (``patch_products.py``), small
  CPU attention as products inductor fuses (``small_attention.py``), then matrix products of
  low-precision frozen parameters upcast again for backward (``frozen_products.py``), then views
  rewritten so that inductor guards no dynamic size against 1 (``size_one_guards.py``).

Compiled graphs also get ``onednn_linear.cpu_matmuls()``, an inductor pass over the differentiated
graph (``training/compile/settings.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch
from torch import fx

from ort_torch_train.passes.frozen_products import products_upcast_twice
from ort_torch_train.passes.frozen_upcasts import upcast_where_used
from ort_torch_train.passes.fuse import fuse_graph
from ort_torch_train.passes.fuse_rows import fuse_row_regions
from ort_torch_train.passes.meta_keys import FUSIONS
from ort_torch_train.passes.patch_products import patch_products
from ort_torch_train.passes.permuted_merges import copy_permuted_merges
from ort_torch_train.passes.shape_values import shape_arithmetic_as_ints
from ort_torch_train.passes.size_one_guards import no_size_one_guards
from ort_torch_train.passes.small_attention import small_attention_products

GraphPass = Callable[[fx.GraphModule, torch.device], None]
"""Rewrites ``module``'s graph in place for a module that runs on ``device`` (``run_passes`` recompiles it)."""
Restructure = Callable[[fx.GraphModule], fx.GraphModule]


class _RestructureStep:
    """Where a pipeline applies the forward graph's restructuring, if it has one."""

    def __repr__(self) -> str:
        return "RESTRUCTURE"


RESTRUCTURE = _RestructureStep()
Step = GraphPass | _RestructureStep

log = logging.getLogger(__name__)


def fuse_converted(module: fx.GraphModule, device: torch.device) -> None:
    """The fusions of ``fuse.py`` on ``module``'s graph and on the converted subgraphs it calls (recompiled)."""
    for submodule in list(module.modules()):
        if isinstance(submodule, fx.GraphModule):
            fuse_graph(submodule)
            submodule.recompile()


EAGER_PASSES: tuple[Step, ...] = (fuse_converted, RESTRUCTURE, fuse_row_regions, upcast_where_used)
COMPILED_PASSES: tuple[Step, ...] = (
    fuse_converted,
    shape_arithmetic_as_ints,
    copy_permuted_merges,
    patch_products,
    RESTRUCTURE,
    small_attention_products,
    products_upcast_twice,
    no_size_one_guards,
)


def run_passes(
    module: fx.GraphModule, steps: Sequence[Step], device: torch.device, restructure: Restructure | None = None
) -> fx.GraphModule:
    """``module`` rewritten by ``steps`` in order (in place, except for ``restructure``) and recompiled."""
    for step in steps:
        if isinstance(step, _RestructureStep):
            if restructure is not None:
                module.recompile()
                module = restructure(module)
        else:
            step(module, device)
    module.recompile()
    log.debug("graph rewrites for %s: %s", device, dict(FUSIONS.get(module, {})))
    return module


def run_eager(module: fx.GraphModule, device: torch.device, restructure: Restructure | None = None) -> fx.GraphModule:
    """A converted ``module`` through ``EAGER_PASSES``."""
    return run_passes(module, EAGER_PASSES, device, restructure)


def run_compiled(
    module: fx.GraphModule, device: torch.device, restructure: Restructure | None = None
) -> fx.GraphModule:
    """A converted ``module`` through ``COMPILED_PASSES``."""
    return run_passes(module, COMPILED_PASSES, device, restructure)
