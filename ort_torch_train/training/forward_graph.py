"""A forward graph run as torch code: converted once per input signature and cached."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from weakref import WeakKeyDictionary

import onnx
import torch
from torch import fx

from ort_torch_train.adapters.registry import OpLibrary
from ort_torch_train.convert.constants import lift_initializers
from ort_torch_train.convert.graph import TensorSpec, convert_graph
from ort_torch_train.convert.meta_keys import MATRIX_PRODUCTS
from ort_torch_train.convert.registry import check_supported
from ort_torch_train.convert.string_inputs import numeric_inputs
from ort_torch_train.errors import IndexRangeError, InputError
from ort_torch_train.graph.layout import GraphLayout, declared_shape
from ort_torch_train.passes.pipeline import Restructure, run_compiled, run_eager
from ort_torch_train.progress import Phase
from ort_torch_train.training.compile.fallbacks import code_digest
from ort_torch_train.training.compile.settings import (
    Compiler,
    CompileSetting,
    compile_arguments,
    for_device,
    torch_compile,
)
from ort_torch_train.training.dynamic_shapes import (
    DynamicAxes,
    DynamicSetting,
    Group,
    SizeProbes,
    candidate_groups,
    check_requested_axes,
    dynamic_setting,
    follower_candidates,
    generalise,
    group_size,
    probe_inputs,
)
from ort_torch_train.training.input_checks import InputDeclaration, check_input, shape_index_error
from ort_torch_train.training.meta_keys import DYNAMIC_AXES, DYNAMIC_GROUPS, GRAPH_STRUCTURE, SIZE_PROBES

Signature = tuple[tuple[torch.Size, torch.dtype], ...]
Shapes = tuple[torch.Size, ...]
# the shape of each user input, an axis of a dynamic group given as ("group", its index, its largest
# size or None) and one that follows groups as ("follows", factor, their indices), and its dtype
Pattern = tuple[tuple[tuple[int | tuple, ...], torch.dtype], ...]


log = logging.getLogger(__name__)


class ForwardGraph:
    """``graph(user_inputs, params) -> outputs`` with ONNX semantics, specialised per input signature.

    A compiled specialisation serves every size along the axes ``dynamic`` lets vary (True: every axis
    the graph leaves symbolic; a dict: those axes by input name) where its conversion allows
    (``dynamic_shapes.py``). Eager runs convert the first two input signatures as they are (a last
    partial batch costs no probing) and generalise the third: a run whose shapes keep changing converts
    three times, not once per shape.

    Every conversion binds the same initializer tensors: ``constants`` (the values of the initializers
    ``graph`` reads but does not hold) or, without them, ``graph``'s own initializers taken out of it.
    """

    def __init__(
        self,
        graph: onnx.GraphProto,
        opsets: dict[str, int],
        layout: GraphLayout,
        *,
        training: bool,
        compile: CompileSetting = False,
        compiler: Compiler = torch_compile,
        module_transform: Restructure | None = None,
        cache_size: int = 16,
        dynamic: DynamicSetting = True,
        constants: Mapping[str, torch.Tensor] | None = None,
        library: OpLibrary | None = None,
    ) -> None:
        check_supported(graph, opsets, library)
        self.library = library  # the session's own operators (a custom-op library), converted first
        graph, self.string_casts = numeric_inputs(graph)  # string inputs parsed on the host (string_inputs.py)
        if constants is None:  # one copy of a constant weight, not the proto's and one per conversion
            graph, constants = lift_initializers(graph)
        self.graph, self.constants = graph, dict(constants)
        self.opsets = opsets
        self.layout = layout
        self.training = training
        self.compile_arguments = compile_arguments(compile)
        self.compiler = compiler  # (converted module, torch.compile's arguments) -> the compiled callable
        self.cache_size = cache_size
        by_name = {value.name: value for value in graph.input}
        self.declarations = tuple(
            InputDeclaration(name, by_name[name].type.tensor_type.elem_type, declared_shape(by_name[name]))
            for name in layout.user_inputs
        )
        self.dynamic = dynamic_setting(dynamic)
        check_requested_axes(self.dynamic, [(d.name, d.dims) for d in self.declarations])
        self._cache: OrderedDict[Hashable, Callable] = OrderedDict()
        # by variant and pattern: a build and the input shapes it was converted for
        self._dynamic_cache: OrderedDict[tuple[Hashable, Pattern], tuple[Callable, Shapes]] = OrderedDict()
        self._conversions: Counter[Hashable] = Counter()  # by variant
        self._probed: set[Hashable] = set()  # the variants whose sizes were probed
        self._matrix_products: WeakKeyDictionary[Callable, list[int] | None] = WeakKeyDictionary()  # by build
        self.module_transform = module_transform  # recompute's segments, between the graph rewrites

    def __call__(self, inputs: Sequence[torch.Tensor], params: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return self.module_for(inputs, params)(*inputs, *params)

    def module_for(self, inputs: Sequence[torch.Tensor], params: Sequence[torch.Tensor]) -> Callable:
        """The converted module for these inputs' shapes and dtypes (built on first use, then cached)."""
        if self.compile_arguments is None:  # eager: sizes probed once, for the third input signature
            dynamic = self._conversions["module"] >= 2 and "module" not in self._probed
        else:  # dynamic axes for a compiler that marks them (CompiledForward); plain torch.compile compiles per shape
            dynamic = self.compiler is not torch_compile
        return self.specialised(inputs, params, "module", self._compiled_if_asked, dynamic=dynamic)

    def specialised(
        self,
        inputs: Sequence[torch.Tensor],
        params: Sequence[torch.Tensor],
        variant: Hashable,
        build: Callable[[fx.GraphModule, torch.device], Callable],
        *,
        dynamic: bool = True,
    ) -> Callable:
        """``build(converted module, its device)`` for these inputs' shapes and dtypes, cached under ``variant``
        (``build`` prepares the module with ``eager_module`` or ``compiled_module``). With ``dynamic`` one
        build serves every size of its dynamic axes."""
        key: Hashable
        try:
            key = (variant, tuple((t.shape, t.dtype) for t in inputs))
        except AttributeError:
            key = None
        built = self._cache.get(key)
        if built is not None:
            return built
        if key is not None and self._dynamic_cache:
            built = self._dynamic_build(variant, inputs)
            if built is not None:
                self._remember(key, built)
                return built
        self.validate(inputs)
        log.info(
            "specialising the %s graph (%s) for inputs %s",
            "training" if self.training else "eval",
            variant,
            [(tuple(t.shape), str(t.dtype)) for t in inputs],
        )
        which = "training" if self.training else "eval"
        nodes = len(self.graph.node)
        with Phase(log, f"converting the {which} graph", total=nodes, done=f"converted the {which} graph") as phase:
            try:
                module = self._convert(inputs, params, phase.advance)
            except IndexRangeError as error:  # an index the example run computed from these shapes
                raise shape_index_error(self.declarations, inputs, error) from error
        if dynamic:
            with Phase(log, f"probing the {which} graph's dynamic axes (a conversion per axis group)"):
                probes = self._size_probes(inputs, params)
            if probes.groups:
                SIZE_PROBES.set(module, probes)
        device = params[0].device if params else inputs[0].device
        compiled = "" if self.compile_arguments is None else ", compilation set up"
        with Phase(log, f"preparing the {which} graph", done=f"prepared the {which} graph (graph passes{compiled})"):
            built = build(module, device)
        dynamic_axes = DYNAMIC_GROUPS.get(module, DynamicAxes())
        self._conversions[variant] += 1
        if dynamic:
            self._probed.add(variant)
        if dynamic_axes.groups:
            self._dynamic_cache[(variant, _pattern(inputs, dynamic_axes))] = (built, tuple(t.shape for t in inputs))
            while len(self._dynamic_cache) > self.cache_size:
                self._dynamic_cache.popitem(last=False)
        self._remember(key, built)
        return built

    def _convert(
        self, inputs: Sequence[torch.Tensor], params: Sequence[torch.Tensor], on_node: Callable[[], None] | None = None
    ) -> fx.GraphModule:
        specs = [TensorSpec(tuple(t.shape), t.dtype) for t in (*inputs, *params)]
        return convert_graph(
            self.graph,
            self.opsets,
            specs,
            training=self.training,
            examples=(*inputs, *params),
            constants=self.constants,
            library=self.library,
            on_node=on_node,
        )

    def _size_probes(self, inputs: Sequence[torch.Tensor], params: Sequence[torch.Tensor]) -> SizeProbes:
        """The conversions with each group of candidate dynamic axes at its probe size, larger groups first.
        A group changes size with the axes that follow it (``follower_candidates``): first with larger
        groups that could not change alone (labels flattened to batch x sequence), else alone, else with
        axes not asked for. One that cannot change stays fixed, unless it follows another group."""
        declared = [(d.name, d.dims) for d in self.declarations]
        candidates = candidate_groups(self.dynamic, declared, inputs)
        unasked = [group for group in candidate_groups(True, declared, inputs) if group not in candidates]
        grown: dict[Group, tuple[fx.GraphModule, Group]] = {}  # the probe and its followers
        failed: dict[Group, str] = {}  # the reason's text: an error's traceback would keep the probe's values alive
        for group in sorted(candidates, key=lambda group: group_size(inputs, group), reverse=True):
            tied = follower_candidates(group, [other for other in failed if other not in grown], inputs)
            for followers in (*tied, (), *follower_candidates(group, unasked, inputs)):
                try:
                    grown[group] = (self._convert(probe_inputs(inputs, group, followers), params), followers)
                    break
                except Exception as error:  # sizes tied to other ones: the probe's inputs do not run
                    if not followers:
                        failed[group] = str(error)
        following = {axis for _, followers in grown.values() for axis in followers}
        for group, reason in failed.items():
            if group not in grown and not set(group) <= following:
                log.info(
                    "dynamic shapes: the axes %s stay fixed: the graph does not run at another size (%s)", group, reason
                )
        groups = [group for group in candidates if group in grown]
        return SizeProbes(
            tuple(groups),
            tuple(grown[group][0] for group in groups),
            tuple(grown[group][1] for group in groups),
            tuple(tuple(t.shape) for t in inputs),
        )

    def _remember(self, key: Hashable, built: Callable) -> None:
        self._cache[key] = built
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def _dynamic_build(self, variant: Hashable, inputs: Sequence[torch.Tensor]) -> Callable | None:
        """The build of ``variant`` whose dynamic axes take these inputs' sizes, if any."""
        for (built_variant, pattern), (built, shapes) in self._dynamic_cache.items():
            # a compiled build's dynamic sizes serve size 1 too (``size_one_kept_dynamic``), an eager one's not
            smallest = 2 if getattr(built, "dynamic_axes", None) is None else 1
            if (
                built_variant == variant
                and _matches(pattern, inputs, smallest)
                and _still_dynamic(built, shapes, inputs)
            ):
                return built
        return None

    def eager_module(self, module: fx.GraphModule, device: torch.device) -> fx.GraphModule:
        """A converted ``module`` ready for eager runs on ``device``: the eager graph rewrites, this graph's
        ``module_transform`` among them, and moved to ``device``. With size probes (``specialised``), its
        literals that follow the sizes of dynamic axes become expressions of those sizes."""
        return self._prepared(module, device, run_eager, linear_rows=False)

    def compiled_module(self, module: fx.GraphModule, device: torch.device) -> fx.GraphModule:
        """A converted ``module`` ready for torch.compile on ``device``: the compiled graph rewrites, this
        graph's ``module_transform`` among them, and moved to ``device``. With size probes (``specialised``),
        its literals that follow the sizes of dynamic axes become expressions of those sizes, and
        its ``DYNAMIC_AXES`` name the axes to compile as dynamic dimensions."""
        return self._prepared(module, device, run_compiled, linear_rows=True)

    def _prepared(
        self,
        module: fx.GraphModule,
        device: torch.device,
        pipeline: Callable[[fx.GraphModule, torch.device, Restructure | None], fx.GraphModule],
        linear_rows: bool,
    ) -> fx.GraphModule:
        probes = SIZE_PROBES.pop(module, None)
        prepared = pipeline(module, device, self.module_transform).to(device)
        if probes is not None:
            GRAPH_STRUCTURE.set(prepared, code_digest(prepared))  # before its literals follow the sizes
            probed = tuple(pipeline(probe, device, self.module_transform) for probe in probes.modules)
            names = [declaration.name for declaration in self.declarations]
            dynamic = generalise(prepared, dataclasses.replace(probes, modules=probed), names, linear_rows)
            DYNAMIC_GROUPS.set(module, dynamic)
            DYNAMIC_GROUPS.set(prepared, dynamic)
            DYNAMIC_AXES.set(prepared, dynamic.axes)
        return prepared

    def _compiled_if_asked(self, module: fx.GraphModule, device: torch.device) -> Callable:
        built: Callable
        if self.compile_arguments is None:
            built = prepared = self.eager_module(module, device)
        else:
            prepared = self.compiled_module(module, device)
            built = self.compiler(prepared, for_device(self.compile_arguments, device))
        products: list[int] | None = MATRIX_PRODUCTS.get(prepared, None)
        self._matrix_products[built] = products
        return built

    def matrix_products(self, module: Callable) -> list[int] | None:
        """The matrix products (``convert/matrix_products.py``) of a graph ``module_for`` gave, which decide
        the BLAS threads of the steps that run it (``blas_threads.py``); None where they are not all known."""
        return self._matrix_products.get(module)

    def clear(self) -> None:
        """Forget every specialisation (after a device move)."""
        self._cache.clear()
        self._dynamic_cache.clear()
        self._conversions.clear()
        self._probed.clear()
        self._matrix_products.clear()

    def validate(self, inputs: Sequence[object]) -> None:
        """Raise a clear error unless ``inputs`` match the declared user inputs."""
        expected = len(self.declarations)
        if len(inputs) != expected:
            names = ", ".join(repr(d.name) for d in self.declarations)
            raise InputError(f"expected {expected} user inputs ({names}) in this order, got {len(inputs)}")
        for position, (declaration, value) in enumerate(zip(self.declarations, inputs)):
            check_input(declaration, position, value)


def _pattern(inputs: Sequence[torch.Tensor], dynamic: DynamicAxes) -> Pattern:
    largest = dict(dynamic.largest)
    place: dict[tuple[int, int], tuple] = {
        axis: ("group", index, largest.get(index)) for index, group in enumerate(dynamic.groups) for axis in group
    }
    place.update({f.axis: ("follows", f.factor, f.groups) for f in dynamic.followers})
    return tuple(
        (tuple(place.get((position, axis), size) for axis, size in enumerate(t.shape)), t.dtype)
        for position, t in enumerate(inputs)
    )


def _matches(pattern: Pattern, inputs: Sequence[torch.Tensor], smallest: int) -> bool:
    """Whether ``inputs`` have ``pattern``'s dtypes and fixed sizes, one size of ``smallest`` or more per
    group (at most its largest, if it has one), and the sizes that follow those."""
    if len(pattern) != len(inputs):
        return False
    sizes: dict[int, int] = {}
    following: list[tuple[int, tuple[int, ...], int]] = []
    for (shape, dtype), tensor in zip(pattern, inputs):
        if tensor.dtype != dtype or tensor.dim() != len(shape):
            return False
        for wanted, actual in zip(shape, tensor.shape):
            if isinstance(wanted, tuple) and wanted[0] == "follows":
                following.append((wanted[1], wanted[2], actual))
            elif isinstance(wanted, tuple):
                largest = wanted[2]
                if actual < smallest or (largest is not None and actual > largest):
                    return False
                if sizes.setdefault(wanted[1], actual) != actual:
                    return False
            elif wanted != actual:
                return False
    return all(actual == factor * math.prod(sizes[k] for k in groups) for factor, groups, actual in following)


def _still_dynamic(built: Callable, shapes: Shapes, inputs: Sequence[torch.Tensor]) -> bool:
    """Whether ``inputs`` have the sizes ``shapes`` along the axes of a compiled ``built`` that torch
    specialised (those not among its ``dynamic_axes`` any more); an uncompiled build keeps them all."""
    dynamic = getattr(built, "dynamic_axes", None)
    if dynamic is None:
        return True
    return all(
        tensor.shape[axis] == size or (position, axis) in dynamic
        for position, (tensor, shape) in enumerate(zip(inputs, shapes))
        for axis, size in enumerate(shape)
    )
