"""A step's user inputs: the values a ``Module`` call takes turned into the tensors its graph declares."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ort_torch_train.api.kv_cache import with_empty_past
from ort_torch_train.api.ortvalue import to_tensors
from ort_torch_train.convert.string_inputs import parse_string_inputs
from ort_torch_train.training.forward_graph import ForwardGraph


class StepInputs:
    """The user inputs ``names`` of one mode's ``graph``: ``tensors(values)`` gives them as torch tensors and the
    kind of output to give back (``to_tensors``): string arrays feeding only a Cast parsed as ORT's Cast does,
    left-out ``past_key_values.*`` inputs empty."""

    __slots__ = ("_as_given", "_graph", "names")

    def __init__(self, graph: ForwardGraph, names: list[str]) -> None:
        self._graph = graph
        self.names = tuple(names)
        # a call with this many values or more, and no string input to parse, passes them as given
        self._as_given = None if graph.string_casts else len(graph.declarations)

    def tensors(self, values: tuple[Any, ...]) -> tuple[list[torch.Tensor], str]:
        """The tensors of ``values`` (one per user input, in order) and the kind of value they came as."""
        as_given = self._as_given
        if as_given is not None and len(values) >= as_given:  # the usual call
            return to_tensors(values, self.names)
        graph = self._graph
        parsed: Sequence[Any] = parse_string_inputs(
            with_empty_past(values, graph.declarations), self.names, graph.string_casts
        )
        return to_tensors(parsed, self.names)
