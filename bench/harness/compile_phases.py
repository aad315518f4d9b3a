"""Where a process's compilations went, in torch's own compile timers (``torch._dynamo.utils``'s
``compilation_time_metrics``, which ``dynamo_timed`` fills) and in the graphs inductor was handed.

The phases, which add up to the compile time and do not overlap:
- dynamo: tracing the Python function into a graph and building its guards (Dynamo's whole compile,
  ``_compile.compile_inner``, or ``aot_compile``'s ``fullgraph_capture``, less the backend calls nested
  in it: the forward's, timed around inductor's ``compile_fx``);
- aot_autograd: the backend's work before inductor lowers a graph: pre-grad passes, AOT autograd's
  functionalisation and joint tracing, the partitioner (the backend calls, forward and a plain
  ``torch.compile``'s lazily compiled backward, less inductor's time in them);
- inductor: ``compile_fx_inner``, every graph AOT autograd hands to inductor (lowering, code
  generation, the C++ compiler).
"""

from __future__ import annotations

import time
from typing import Any


class CompileAccount:
    """Counts, from its creation on, the nodes of each graph Dynamo hands to inductor (``dynamo_graph_nodes``),
    of each ATen graph AOT autograd hands to inductor's inner compile (``aten_graph_nodes``: a forward and
    a backward, or one graph holding both), what those nodes do (``aten_graph_kinds``, ``node_kinds``) and the seconds of those backend calls (inductor unchanged)."""

    def __init__(self) -> None:
        import torch._inductor.compile_fx as compile_fx

        self.dynamo_graph_nodes: list[int] = []
        self.aten_graph_nodes: list[int] = []
        self.aten_graph_kinds: list[dict[str, int]] = []
        self.backend_s = 0.0
        outer, inner, depth = compile_fx.compile_fx, compile_fx.compile_fx_inner, [0]

        def counted_inner(graph: Any, *args: Any, **kwargs: Any) -> Any:
            self.aten_graph_nodes.append(len(graph.graph.nodes))
            self.aten_graph_kinds.append(node_kinds(graph.graph))
            return inner(graph, *args, **kwargs)

        def counted(graph: Any, *args: Any, **kwargs: Any) -> Any:
            top = not depth[0]  # compile_fx calls itself once more under inductor options: counted once
            if top:
                self.dynamo_graph_nodes.append(len(graph.graph.nodes))
                if len(args) < 2 and "inner_compile" not in kwargs:
                    kwargs["inner_compile"] = counted_inner
            depth[0] += 1
            started = time.perf_counter()
            try:
                return outer(graph, *args, **kwargs)
            finally:
                depth[0] -= 1
                if top:
                    self.backend_s += time.perf_counter() - started

        compile_fx.compile_fx = counted

    def phases(self, step_s: float, conversion_s: float = 0.0) -> dict:
        """The compile phases so far (seconds, module docstring), ``conversion_s`` (the ONNX graph's
        conversion, timed by the caller), and ``rest``: what of ``step_s`` (a step's wall time, the
        compilations in it) none of them holds (running the step, the optimizer, Python around them)."""
        from torch._dynamo.utils import compilation_time_metrics

        def total(timer: str) -> float:
            return sum(compilation_time_metrics.get(timer, []))

        inductor = total("compile_fx_inner")
        captured = total("_compile.compile_inner") + total("fullgraph_capture")  # the forward's backend nested
        phases = {
            "conversion": conversion_s,
            "dynamo": captured - self.backend_s,
            "aot_autograd": self.backend_s + total("backward._backward_impl") - inductor,
            "inductor": inductor,
        }
        phases["rest"] = step_s - sum(phases.values())
        return {name: round(seconds, 2) for name, seconds in phases.items()}


def timers() -> dict[str, float]:
    """Every one of torch's compile timers so far, summed over its calls (seconds)."""
    from torch._dynamo.utils import compilation_time_metrics

    return {name: round(sum(values), 3) for name, values in sorted(compilation_time_metrics.items())}


def node_kinds(graph: Any) -> dict[str, int]:
    """The nodes of an ATen graph by what they do: ``checks`` (runtime asserts: index checks, size checks),
    ``shape`` (arithmetic on sizes: symbolic sizes and Python operators on them), ``update`` (an optimizer
    update traced from ``ort_torch_train/optim``), ``io`` (inputs and outputs) and ``compute`` (the rest)."""
    import operator

    import torch

    asserts = {"_assert_async", "_assert_scalar", "_assert_tensor_metadata", "_functional_assert_async"}
    kinds: dict[str, int] = {}
    for node in graph.nodes:
        target = node.target
        name = getattr(target, "__name__", str(target)).split(".")[0]
        if node.op in ("placeholder", "output"):
            kind = "io"
        elif name in asserts or "assert" in name:
            kind = "checks"
        elif name in ("sym_size", "sym_numel", "sym_stride") or not (
            isinstance(target, torch._ops.OpOverload) or target is operator.getitem
        ):
            kind = "shape"
        elif "/optim/" in (node.meta.get("stack_trace") or ""):
            kind = "update"
        else:
            kind = "compute"
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds
