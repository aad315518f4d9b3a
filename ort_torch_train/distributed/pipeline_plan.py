"""Pipeline parallelism's plan: the options (``PipelineOptions``) and the forward graph cut into stages.

A cut is given as ORT's legacy ``pipeline_cut_info_string`` does: cuts separated by ``,``, the edges
of one cut by ``:``, an edge a tensor name, optionally followed by ``-`` and its consumer nodes'
names separated by ``/`` (``"t1,t2:t3-node_a/node_b"``: two cuts, the second of two edges). Stage
``k`` holds the graph's nodes, in the graph's order, from just after cut ``k - 1`` up to the last
producer of cut ``k``'s tensors; every value a later stage reads crosses the cut (the graph's user
inputs enter stage 0 and travel with the activations). A parameter read by nodes of several stages
(a tied embedding) is an input of each of them. Without cuts the stages are balanced by the number of
parameter elements each one reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import onnx
import torch

from ort_torch_train.convert.subgraphs import node_reads
from ort_torch_train.errors import ModelError

SCHEDULES = ("gpipe", "1f1b")
_PASS_THROUGH = ("Identity", "Cast")


@dataclass(frozen=True)
class CutEdge:
    """One edge of a cut: a tensor of the graph, for all its consumers or only those named."""

    tensor: str
    consumers: tuple[str, ...] = ()


Cut = tuple[CutEdge, ...]


def parse_cut_info(text: str) -> tuple[Cut, ...]:
    """The cuts of an ORT ``pipeline_cut_info_string`` (see the module doc); raises ValueError naming an
    empty cut, edge, tensor or consumer."""
    if not isinstance(text, str):
        raise ValueError(f"pipeline cuts: expected a string in ORT's cut format, got {type(text).__name__}")
    if not text:
        return ()
    cuts = []
    for cut_text in text.split(","):
        edges = []
        for edge_text in cut_text.split(":"):
            tensor, dash, consumers = edge_text.partition("-")
            names = tuple(consumers.split("/")) if dash else ()
            if not tensor or any(not name for name in names):
                raise ValueError(
                    f"pipeline cuts: {text!r} has an empty tensor or consumer name in the edge {edge_text!r} "
                    "(expected 'tensor' or 'tensor-consumer1/consumer2', edges joined by ':', cuts by ',')"
                )
            edges.append(CutEdge(tensor, names))
        cuts.append(tuple(edges))
    return tuple(cuts)


@dataclass(frozen=True)
class PipelineOptions:
    """How a training graph runs as a pipeline: ``stages`` ranks, each batch split into ``micro_batches``,
    cut at ``cuts`` (ORT's cut string or a sequence of tensor names, one per cut; empty: balanced by
    parameter count) and run by the ``schedule`` "gpipe" or "1f1b" (torch.distributed.pipelining's
    ScheduleGPipe and Schedule1F1B). Checked when made; raises ValueError naming the bad field."""

    stages: int
    micro_batches: int = 1
    cuts: str | Sequence[str] = ""
    schedule: str = "gpipe"

    def __post_init__(self) -> None:
        for field in ("stages", "micro_batches"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"pipeline {field}: expected an int >= 1, got {value!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"pipeline schedule: expected one of {SCHEDULES}, got {self.schedule!r}")
        if not isinstance(self.cuts, str):
            names = tuple(self.cuts)
            if not all(isinstance(name, str) and name for name in names):
                raise ValueError(f"pipeline cuts: expected tensor names (non-empty strings), got {self.cuts!r}")
            object.__setattr__(self, "cuts", ",".join(names))
        count = len(self.cut_list)
        if count and count != self.stages - 1:
            raise ValueError(
                f"pipeline cuts: {self.stages} stages need {self.stages - 1} cuts, got {count} ({self.cuts!r})"
            )

    @property
    def cut_list(self) -> tuple[Cut, ...]:
        """The parsed cuts (empty: balanced by parameter count)."""
        return parse_cut_info(str(self.cuts))


@dataclass(frozen=True)
class StageGraph:
    """One stage: its ONNX graph ``(inputs..., params...) -> outputs``, the names of each, and the
    constants it reads."""

    graph: onnx.GraphProto
    inputs: tuple[str, ...]
    params: tuple[str, ...]
    outputs: tuple[str, ...]
    constants: Mapping[str, torch.Tensor]


def loss_reduction(graph: onnx.GraphProto, loss: str) -> str:
    """ "mean" or "sum": how the node computing ``loss`` reduces over the batch; raises ModelError when
    the graph does not say (micro-batches then cannot add up to the full batch's loss)."""
    producers = {output: node for node in graph.node for output in node.output}
    node = producers.get(loss)
    while node is not None and node.op_type in _PASS_THROUGH:
        node = producers.get(node.input[0])
    if node is not None:
        if node.op_type == "ReduceMean":
            return "mean"
        if node.op_type == "ReduceSum":
            return "sum"
        if node.op_type in ("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"):
            attributes = {a.name: a for a in node.attribute}
            reduction = attributes["reduction"].s.decode() if "reduction" in attributes else "mean"
            weighted = "ignore_index" in attributes or (len(node.input) > 2 and bool(node.input[2]))
            if reduction == "sum" or (reduction == "mean" and not weighted):
                return reduction
    found = "a graph input" if node is None else f"{node.op_type} node {node.name!r}"
    raise ModelError(
        f"pipeline micro_batches > 1: the loss {loss!r} comes from {found}, not a mean or sum over the batch "
        "(ReduceMean, ReduceSum, or SoftmaxCrossEntropyLoss/NegativeLogLikelihoodLoss with reduction "
        "'sum', or 'mean' without weights or ignore_index), so micro-batch losses cannot add up to the "
        "batch's; use micro_batches=1"
    )


def cut_graph(
    graph: onnx.GraphProto,
    user_inputs: Sequence[str],
    params: Mapping[str, int],
    constants: Mapping[str, torch.Tensor],
    options: PipelineOptions,
) -> list[StageGraph]:
    """``graph`` (a forward graph: user inputs, then parameters, in; user outputs out) cut into
    ``options.stages`` stages; ``params`` maps each parameter input to its element count."""
    nodes = list(graph.node)
    reads = [node_reads(node) for node in nodes]
    cuts = options.cut_list
    if cuts:
        ends = _named_cut_ends(nodes, cuts)
    else:
        ends = _balanced_cut_ends(nodes, reads, params, options.stages)
    ends.append(len(nodes) - 1)
    starts = [0, *(end + 1 for end in ends[:-1])]
    outputs = [value.name for value in graph.output]
    stage_of = {}  # value name -> the stage producing it (user inputs: stage 0)
    for name in user_inputs:
        stage_of[name] = 0
    for stage, (start, end) in enumerate(zip(starts, ends)):
        for node in nodes[start : end + 1]:
            for output in node.output:
                if output:
                    stage_of[output] = stage
    last_reader: dict[str, int] = {name: len(ends) for name in outputs}  # graph outputs: past the last stage
    stage_params: list[list[str]] = [[] for _ in ends]  # a parameter read by two stages is in both
    for stage, (start, end) in enumerate(zip(starts, ends)):
        for read in reads[start : end + 1]:
            for name in read:
                if name in params:
                    if name not in stage_params[stage]:
                        stage_params[stage].append(name)
                elif name in stage_of:
                    last_reader[name] = max(last_reader.get(name, 0), stage)
    stages = []
    carried = list(user_inputs)
    for stage, (start, end) in enumerate(zip(starts, ends)):
        produced_so_far = [name for name in stage_of if stage_of[name] <= stage]
        crossing = (
            outputs
            if stage == len(ends) - 1
            else [name for name in produced_so_far if last_reader.get(name, -1) > stage]
        )
        stage_nodes = nodes[start : end + 1]
        read_here = set().union(*reads[start : end + 1]) if stage_nodes else set()
        stage_constants = {name: constants[name] for name in read_here if name in constants}
        ordered_params = tuple(name for name in params if name in stage_params[stage])
        stages.append(_stage_graph(graph, stage, stage_nodes, carried, ordered_params, crossing, stage_constants))
        carried = list(crossing)
    return stages


def _producers(nodes: Sequence[onnx.NodeProto]) -> dict[str, int]:
    return {output: index for index, node in enumerate(nodes) for output in node.output if output}


def _named_cut_ends(nodes: Sequence[onnx.NodeProto], cuts: Sequence[Cut]) -> list[int]:
    """The index of each cut's last node: the last producer of its tensors."""
    producers = _producers(nodes)
    ends: list[int] = []
    for number, cut in enumerate(cuts):
        end = -1
        for edge in cut:
            index = producers.get(edge.tensor)
            if index is None:
                valid = [output for node in nodes for output in node.output if output]
                sample = valid[:: max(1, len(valid) // 6)][:6]
                raise ModelError(
                    f"pipeline cut {number}: {edge.tensor!r} is not an edge of the graph (a tensor a node "
                    f"produces); valid ones include {sample}"
                )
            consumers = {node.name for node in nodes if edge.tensor in node.input}
            unknown = [name for name in edge.consumers if name not in consumers]
            if unknown:
                raise ModelError(
                    f"pipeline cut {number}: {unknown} do not consume {edge.tensor!r}; its consumers are "
                    f"{sorted(consumers)}"
                )
            end = max(end, index)
        if ends and end <= ends[-1]:
            raise ModelError(
                f"pipeline cut {number} ({cut[0].tensor!r}) comes before or at cut {number - 1} in the "
                "graph's order: name the cuts from the inputs to the loss"
            )
        if end == len(nodes) - 1:
            raise ModelError(f"pipeline cut {number} ({cut[0].tensor!r}) is the graph's last node: its stage is empty")
        ends.append(end)
    return ends


def _balanced_cut_ends(
    nodes: Sequence[onnx.NodeProto], reads: Sequence[set[str]], params: Mapping[str, int], stages: int
) -> list[int]:
    """Cut ends that give the stages about equal numbers of parameter elements: cut ``k`` after the first
    node where the elements read so far reach ``k / stages`` of all."""
    seen: set[str] = set()
    readers = []  # (node index, elements read by nodes up to it)
    total = 0
    for index, read in enumerate(reads):
        new = [name for name in read if name in params and name not in seen]
        if new:
            seen.update(new)
            total += sum(params[name] for name in new)
            readers.append((index, total))
    if len(readers) < stages:
        raise ModelError(
            f"pipeline stages: {stages} stages need at least {stages} nodes that read parameters; the graph has "
            f"{len(readers)}: it allows at most {max(1, len(readers))} stages"
        )
    ends: list[int] = []
    position = 0
    for cut in range(1, stages):
        target = total * cut / stages
        while position < len(readers) - (stages - cut) and readers[position][1] < target:
            position += 1
        ends.append(readers[position][0])
        position += 1
    return ends


def _stage_graph(
    graph: onnx.GraphProto,
    stage: int,
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[str],
    params: Sequence[str],
    outputs: Sequence[str],
    constants: Mapping[str, torch.Tensor],
) -> StageGraph:
    declared = {value.name: value for value in (*graph.input, *graph.value_info, *graph.output)}
    part = onnx.GraphProto(name=f"{graph.name}_stage{stage}")
    part.node.extend(nodes)
    for name in (*inputs, *params):
        part.input.append(declared[name] if name in declared else onnx.ValueInfoProto(name=name))
    for name in outputs:
        part.output.append(declared[name] if name in declared else onnx.ValueInfoProto(name=name))
    return StageGraph(part, tuple(inputs), tuple(params), tuple(outputs), dict(constants))
