"""Loop and Scan run by Python at run time, for loops whose trip count is read at run time or that are
too long to unroll into the graph: the converted body is called once per iteration."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import fx, nn


def signature(tensors: Sequence[torch.Tensor]) -> tuple:
    """Shapes and dtypes of ``tensors``: what a converted body was specialised to."""
    return tuple((tuple(t.shape), t.dtype) for t in tensors)


class RunTimeLoop(nn.Module):
    """ONNX Loop run by Python: trip count and condition read at run time, the body called per iteration."""

    def __init__(self, body: fx.GraphModule, carried: int, scans: int):
        super().__init__()
        self.body, self.carried, self.scans = body, carried, scans

    def forward(
        self, trip_count: torch.Tensor | None, condition: torch.Tensor | None, *values: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        carried, operands = list(values[: self.carried]), values[self.carried :]
        if trip_count is None and condition is None:
            raise ValueError("Loop without a trip count or a condition never ends")
        limit = int(trip_count.reshape(())) if trip_count is not None else None
        going = bool(condition.reshape(())) if condition is not None else True
        expected, scans, iteration = signature(carried), [], 0
        while going and (limit is None or iteration < limit):
            outputs = self.body(torch.tensor(iteration), torch.tensor(going), *carried, *operands)
            carried = list(outputs[1 : 1 + self.carried])
            if signature(carried) != expected:
                raise ValueError(
                    f"Loop-carried values changed from {expected} to {signature(carried)}; "
                    "the body was converted for the first"
                )
            scans.append(outputs[1 + self.carried :])
            going, iteration = bool(outputs[0].reshape(())), iteration + 1
        if self.scans and not scans:
            raise ValueError("Loop ran no iteration, so its scan outputs have no known shape")
        return (*carried, *(torch.stack([s[k] for s in scans]) for k in range(self.scans)))


class RunTimeScan(nn.Module):
    """ONNX Scan run by Python, for scans too long to unroll: the body called per step on slices."""

    def __init__(
        self,
        body: fx.GraphModule,
        states: int,
        axes: list[int],
        directions: list[int],
        out_axes: list[int],
        out_directions: list[int],
    ):
        super().__init__()
        self.body, self.states = body, states
        self.axes, self.directions, self.out_axes, self.out_directions = axes, directions, out_axes, out_directions

    def forward(self, *values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        states = list(values[: self.states])
        scanned = values[self.states : self.states + len(self.axes)]
        operands = values[self.states + len(self.axes) :]
        slices = [
            source.unbind(axis)[:: -1 if direction else 1]
            for source, axis, direction in zip(scanned, self.axes, self.directions)
        ]
        expected = signature(states)
        columns: list[list[torch.Tensor]] = [[] for _ in self.out_axes]
        for step in zip(*slices):
            outputs = self.body(*states, *step, *operands)
            states = list(outputs[: self.states])
            if signature(states) != expected:
                raise ValueError(
                    f"Scan states changed from {expected} to {signature(states)}; the body was converted for the first"
                )
            for column, output in zip(columns, outputs[self.states :]):
                column.append(output)
        stacked = []
        for column, axis, direction in zip(columns, self.out_axes, self.out_directions):
            stacked.append(torch.stack(column[::-1] if direction else column, axis % (column[0].dim() + 1)))
        return (*states, *stacked)
