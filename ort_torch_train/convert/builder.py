"""The state of one conversion pass: the fx graph being built and what is known of each ONNX value."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from operator import getitem
from typing import Any

import onnx
import torch
from torch import fx, nn

from ort_torch_train.adapters.registry import OpLibrary, SubgraphConverter
from ort_torch_train.convert.subgraphs import names_read, node_reads


@dataclass
class Value:
    """One ONNX value during conversion."""

    example: Any  # a tensor (or a non-tensor a converter returned), None for an absent optional
    const: bool
    static_shape: bool
    counted: bool = False  # a constant folded from a Range (position ids and what integer ops make of them)


class Builder:
    """State of one conversion pass. ``convert_node`` converts one more node into it, ``convert_subgraph``
    a graph attribute into a module of its own (both the conversion's, so that If, Loop and Scan can
    use them).

    ``values`` holds a value's example only while a node still to convert (or the graph's outputs) reads
    it: the examples of a whole forward are never held at once.
    """

    def __init__(
        self,
        graph: onnx.GraphProto,
        opsets: dict[str, int],
        training: bool,
        node_converter: Callable[[Builder, onnx.NodeProto, int], None],
        convert_subgraph: SubgraphConverter,
        library: OpLibrary | None = None,
    ) -> None:
        self.onnx_graph = graph
        self.library = library  # the session's own operators, converted before the registry's
        self.opsets = opsets
        self.training = training
        self.convert_subgraph = convert_subgraph
        self._node_converter = node_converter
        self.fx_graph = fx.Graph()
        self.root = nn.Module()
        self.constants = nn.Module()
        self.root.add_module("constants", self.constants)
        self.values: dict[str, Value] = {}
        self.fx_nodes: dict[str, fx.Node] = {}
        self.multi_outputs: dict[str, tuple[fx.Node, int]] = {}
        self.consumed = names_read(graph)
        self._reads_to_come: Counter[str] = Counter()
        self.expect_reads(graph)
        self._module_names: set[str] = set()
        # multiply-accumulates of the products the nodes' runs dispatch; None once some are not known
        self.matrix_products: list[int] | None = []
        # nodes with static output shapes and only floating-point run-time inputs may run on meta tensors
        self.shape_only_runs = False

    def convert_node(self, node: onnx.NodeProto, index: int) -> None:
        """Convert ``node`` (the ``index``-th of the graph) into this pass's graph."""
        self._node_converter(self, node, index)
        self.reads_done(node_reads(node), node.output)

    def expect_reads(self, graph: onnx.GraphProto) -> None:
        """Count the reads of ``graph``'s nodes (their subgraphs' outer names included) and outputs as to come."""
        for node in graph.node:
            self._reads_to_come.update(node_reads(node))
        self._reads_to_come.update(output.name for output in graph.output)

    def reads_done(self, names: Iterable[str], defined: Iterable[str] = ()) -> None:
        """Count one read of each of ``names`` as done, and forget the examples of those and of the just
        ``defined`` names that nothing reads any more."""
        names = list(names)
        self._reads_to_come.subtract(names)
        for name in (*names, *defined):
            if self._reads_to_come[name] <= 0:
                self.values.pop(name, None)

    # values -------------------------------------------------------------------------------
    def fx_value(self, name: str) -> fx.Node | None:
        """The fx node carrying ``name`` ('' gives None), materialising constants lazily."""
        if name == "":
            return None
        if name in self.fx_nodes:
            return self.fx_nodes[name]
        if name in self.multi_outputs:
            producer, index = self.multi_outputs[name]
            node = self.fx_graph.call_function(getitem, (producer, index))
        else:
            node = self.constant(self.values[name].example)
        self.fx_nodes[name] = node
        node.meta["val"] = meta_value(self.values[name].example)
        return node

    def fx_input(self, name: str) -> fx.Node:
        """The fx node carrying ``name``, a present value."""
        node = self.fx_value(name)
        if node is None:
            raise ValueError("an absent optional value has no fx node")
        return node

    def constant(self, value: torch.Tensor) -> fx.Node:
        """A ``get_attr`` node reading ``value``, registered as a new constant buffer."""
        buffer_name = f"c{len(self.constants._buffers)}"
        self.constants.register_buffer(buffer_name, value)
        return self.fx_graph.get_attr(f"constants.{buffer_name}")

    def alias(self, output: str, source: str) -> None:
        """Make ``output`` another name of ``source``."""
        self.values[output] = self.values[source]
        if source in self.fx_nodes or source in self.multi_outputs or not self.values[source].const:
            self.fx_nodes[output] = self.fx_input(source)

    def module_name(self, node: onnx.NodeProto, index: int) -> str:
        """A new submodule name for ``node``, the ``index``-th of the graph."""
        base = re.sub(r"\W", "_", node.name or node.op_type).strip("_") or node.op_type
        name = f"n{index}_{base}"[:80]
        while name in self._module_names:
            name += "_"
        self._module_names.add(name)
        return name


def meta_value(example: Any) -> torch.Tensor | None:
    """Shape and dtype of an example value without its data (fx's ``meta["val"]``), for fusion passes."""
    return example.to("meta") if isinstance(example, torch.Tensor) else None
