"""The private torch APIs this project uses, each named once here with the reason no public one serves.

The rest of the package reaches torch's internals only through these names, so a torch upgrade that
moves one breaks here. Not wrapped, as they are aten operators with stable schemas that torch's own
optimizers call: ``torch._foreach_*`` (one kernel launch for a list of tensors) and ``torch._fused_adamw_``
(AdamW's fused kernel). Loss scaling goes through the public ``torch.amp.GradScaler``.

Dynamo's and inductor's modules (and sympy, which they load) are imported on first use, through the
functions here: an eager training process never loads them (their import cost: docs/performance.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import threading
from collections.abc import Callable, Iterable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed._functional_collectives as functional_collectives
import torch.utils._pytree
from torch import Tensor
from torch._guards import TracingContext, tracing
from torch._ops import HigherOrderOperator
from torch.utils._python_dispatch import TorchDispatchMode

if TYPE_CHECKING:
    from torch._dynamo.aot_compile import AOTCompiledFunction
    from torch._dynamo.types import GuardFilterEntry as GuardFilterEntry  # noqa: F401  (precompiled.py's annotations)

__all__ = [
    # Dynamo, torch.compile's precompile (``torch.compile(...).aot_compile``): a compiled function saved
    # and loaded whole with its guards; a guard filter (its entries' type) keeps those a saved one can carry
    "aot_compile",
    "unserializable_guard_types",
    "fast_guard_check",
    "load_aot_compiled",
    "serialize_aot_compiled",
    # Dynamo: CUDA graphs replay only on inputs at fixed addresses
    "mark_static_address",
    # Dynamo: an input's axis compiled as a dynamic dimension from the first compilation (torch.compile's
    # own automatic dynamic shapes compile a second time first); its compile counters, which tests read
    "mark_dynamic",
    "compile_counters",
    # symbolic shapes: dynamic sizes traced with size-oblivious reasoning, so that size 1 is not specialised
    "size_one_kept_dynamic",
    # what torch.compile raises when it cannot trace a graph with its dynamic axes: it specialised one
    # (symbolic shapes' constraint violation) or an operator's tracing rule needs fixed sizes (Dynamo's errors)
    "dynamic_tracing_errors",
    # inductor: the options a mode stands for (torch.compile takes a mode or options, not both)
    "list_mode_options",
    # inductor: the C++ libraries its code caches built under its cache dir, which the compile cache carries
    "inductor_module",
    "inductor_cache_dir",
    # inductor: its vector ISA probe and the setting (``cpp.vec_isa_ok``) that skips it where a saved probe holds
    "inductor_config",
    # inductor: custom post-grad passes (the oneDNN linear pass) and the hash that keys them in its caches
    "custom_graph_pass",
    "hash_of_files",
    # Dynamo: a function whose result traces as a constant; torch.compiler.assume_constant_result sets
    # the same mark but imports Dynamo to do so
    "assume_constant_result",
    # FSDP's grad scaler, which all-reduces the inf/nan flag; its module loads DTensor and sympy
    "sharded_grad_scaler",
    # the CPU features a compiled library depends on, which torch reports only privately
    "cpu_features",
    # functorch: whether a transform is active; its interpreter stack has no public accessor
    "in_functorch_transform",
    # make_fx: whether it is tracing the running code (the package builder's steps); no public accessor
    "traced_by_make_fx",
    # the oneDNN kernel inductor runs for frozen weights' linear layers; no public op reaches it
    "onednn_linear_pointwise",
    # a dispatch mode recording the matrix products a graph runs, and the higher-order ops (torch.cond,
    # ...) it cannot look into: no public dispatch-mode API
    "TorchDispatchMode",
    "HigherOrderOperator",
    # collectives torch.compile can trace into a data-parallel step's graph
    "functional_collectives",
    # pytree: a module's outputs counted as torch.onnx.export flattens them
    "tree_leaves",
    # autograd: grad mode switched off for a block at a fraction of ``torch.no_grad()``'s cost (that one
    # builds three objects per use), for the compiled steps' per-call path
    "GradDisabled",
    # autograd: the saved-tensors hooks in force (checkpoint's, a caller's), which hooks nested inside
    # must hand on what they do not pack themselves; saved_tensors_hooks has no public accessor
    "current_saved_tensors_hooks",
    # storage: two storages exchange their memory, so that every tensor viewing one (a flat gradient
    # buffer and each parameter's ``.grad``) holds the other's values at once; no public API moves memory
    "swap_storage_memory",
    # storage: how many tensors (and storage objects) hold a storage, to tell whether anything besides
    # the ones known views it before its memory is freed; no public API counts them
    "storage_use_count",
    # dispatcher: autograd back on inside a custom op's kernel (which runs below autograd), for a backward
    # op that differentiates a kernel torch fuses (``adapters/rnn_fused.py``); no public API lifts it
    "autograd_dispatch",
    # Dynamo: functions written whole into the graphs torch.compile traces (``torch.compiler.allow_in_graph``,
    # which imports Dynamo: applied when a compilation starts, not when the function is defined)
    "written_whole",
    "allow_written_whole",
]

tree_leaves = torch.utils._pytree.tree_leaves


_WRITTEN_WHOLE: list[Callable[..., Any]] = []  # written_whole's functions that allow_written_whole has not applied yet


def written_whole(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, to be written whole into the graphs torch.compile traces, not traced into
    (``torch.compiler.allow_in_graph``, applied by ``allow_written_whole``)."""
    _WRITTEN_WHOLE.append(function)
    return function


def allow_written_whole() -> None:
    """``torch.compiler.allow_in_graph`` for the functions ``written_whole`` marked (before torch.compile)."""
    while _WRITTEN_WHOLE:
        torch.compiler.allow_in_graph(_WRITTEN_WHOLE.pop())


def autograd_dispatch() -> Any:
    """A context in which operators dispatch to autograd again, inside a kernel that runs below it."""
    excluded = torch._C._dispatch_tls_local_exclude_set()
    for key in ("AutogradFunctionality", "AutogradOther", "AutogradNestedTensor"):
        excluded = excluded.remove(getattr(torch._C.DispatchKey, key))
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), excluded)


class GradDisabled:
    """``with GradDisabled():`` runs its block with autograd's grad mode off, as ``torch.no_grad()`` does."""

    __slots__ = ("previous",)

    def __enter__(self) -> None:
        self.previous = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)

    def __exit__(self, *exception: object) -> None:
        torch._C._set_grad_enabled(self.previous)


def mark_static_address(tensor: Tensor) -> None:
    """Dynamo's ``mark_static_address``: the tensor keeps its address across calls (CUDA graphs)."""
    torch._dynamo.mark_static_address(tensor)


def mark_dynamic(tensor: Tensor, axis: int) -> None:
    """Dynamo's ``mark_dynamic``: the axis compiles as a dynamic dimension from the first compilation."""
    torch._dynamo.mark_dynamic(tensor, axis)


def size_one_kept_dynamic(enabled: bool) -> Any:
    """A context in which torch.compile traces dynamic sizes as ranging from 0 (``backed_size_oblivious``):
    the graph it compiles for sizes >= 2 serves size 1 too, instead of a guard sending size 1 to a graph
    of its own."""
    config: Any = importlib.import_module("torch.fx.experimental._config")  # a torch ConfigModule
    return config.patch(backed_size_oblivious=enabled)


def compile_counters() -> Any:
    """Dynamo's compile counters (``counters["stats"]["unique_graphs"]``, ...)."""
    return torch._dynamo.utils.counters


def dynamic_tracing_errors() -> tuple[type[Exception], ...]:
    """What torch.compile raises when it cannot trace a graph with its dynamic axes."""
    symbolic_shapes = importlib.import_module("torch.fx.experimental.symbolic_shapes")
    return symbolic_shapes.ConstraintViolationError, torch._dynamo.exc.TorchDynamoException


def unserializable_guard_types() -> Any:
    """The guard types a precompiled function cannot carry (Dynamo's guard manager's list)."""
    return importlib.import_module("torch._dynamo.guards").CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES


def inductor_module(name: str) -> ModuleType:
    """inductor's module ``torch._inductor.<name>`` (``codecache``, ``cpu_vec_isa``, ...)."""
    return importlib.import_module(f"torch._inductor.{name}")


def inductor_config() -> Any:
    """inductor's settings module (``torch._inductor.config``)."""
    return inductor_module("config")


def inductor_cache_dir() -> str:
    """The directory inductor caches its generated code and libraries in."""
    return inductor_module("runtime.cache_dir_utils").cache_dir()


def list_mode_options(mode: str, dynamic: bool) -> dict[str, Any]:
    """The inductor options a torch.compile mode stands for."""
    return torch._inductor.list_mode_options(mode, dynamic)


def hash_of_files(paths: Iterable[str]) -> bytes:
    """inductor's hash of source files, which keys a custom pass in its caches."""
    return inductor_module("custom_graph_pass").get_hash_for_files(tuple(paths))


def assume_constant_result(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, marked for Dynamo as returning a constant (``torch.compiler.assume_constant_result``)."""
    function._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return function


def sharded_grad_scaler(**arguments: Any) -> Any:
    """``torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler(**arguments)``."""
    return importlib.import_module("torch.distributed.fsdp.sharded_grad_scaler").ShardedGradScaler(**arguments)


class GraphPass(Protocol):
    """An inductor graph pass: run on a graph, keyed in inductor's caches by its ``uuid()``."""

    def __call__(self, graph: torch.fx.Graph) -> None: ...

    def uuid(self) -> bytes: ...

    def __hash__(self) -> int: ...


@functools.cache
def custom_graph_pass(name: str, apply: Callable[[torch.fx.Graph], None], uuid: Callable[[], bytes]) -> GraphPass:
    """An inductor ``CustomGraphPass`` named ``name`` that runs ``apply`` on a graph and is keyed in
    inductor's caches by ``uuid()``; one instance per arguments."""
    base = inductor_module("custom_graph_pass").CustomGraphPass
    members = {
        "__call__": lambda self, graph: apply(graph),
        "uuid": lambda self: uuid(),
        "__repr__": lambda self: f"{name}({uuid().hex()})",  # in precompiled steps' keys
    }
    graph_pass: GraphPass = type(name, (base,), members)()
    return graph_pass


def aot_compile(compiled: Any, args: tuple) -> Any:
    """``compiled`` (a torch.compile'd function) compiled ahead for the positional ``args``, its graphs
    looked up in and saved to AOTAutograd's cache (inductor's cache directory) by their content alone."""
    with _AUTOGRAD_KEYS_LOCK, _autograd_cache_keys_without_backend_id():
        return compiled.aot_compile((args, {}))


_AUTOGRAD_KEYS_LOCK = threading.RLock()  # the key function is swapped on the class: one compile at a time


@contextlib.contextmanager
def _autograd_cache_keys_without_backend_id() -> Iterator[None]:
    """AOTAutogradCache's keys leave out a graph's precompile backend id while this runs.

    Torch keys a precompiled graph by its backend id too, a fresh uuid for every graph, so such a graph
    never hits the cache it is saved to, though a hit is handled (the entry is recorded under the new
    id). With one id for all (precompiled graphs keep keys apart from torch.compile's others), a graph
    compiled before, by another process or another step alike, loads."""
    autograd_cache = importlib.import_module("torch._functorch._aot_autograd.autograd_cache")
    pickler: type = getattr(autograd_cache, "AOTAutogradCachePickler", object)
    reduce_config = getattr(pickler, "_reduce_aot_config", None)
    if reduce_config is None:  # another torch's internals: its own keys
        yield
        return

    def reduce_without_backend_id(self: Any, aot_config: Any) -> Any:
        if getattr(aot_config, "precompile_backend_id", None) is not None:
            aot_config = dataclasses.replace(aot_config, precompile_backend_id="precompiled")
        return reduce_config(self, aot_config)

    pickler._reduce_aot_config = reduce_without_backend_id  # type: ignore[attr-defined]
    try:
        yield
    finally:
        pickler._reduce_aot_config = reduce_config  # type: ignore[attr-defined]


def serialize_aot_compiled(compiled: Any, external: dict[str, object]) -> bytes:
    """The bytes of a precompiled function; the ``external`` closure objects are left out, by name."""
    return type(compiled).serialize(compiled, external).serialized_data


def load_aot_compiled(data: bytes, external: dict[str, object]) -> AOTCompiledFunction:
    """A precompiled function from ``serialize_aot_compiled``'s bytes, given its ``external`` objects."""
    compiled_function = importlib.import_module("torch._dynamo.aot_compile").AOTCompiledFunction
    with tracing(TracingContext(None)):  # unpickling the guards' sources installs guards
        return compiled_function.deserialize(data, None, external)


def fast_guard_check(compiled: Any) -> Callable[..., bool]:
    """``compiled.guard_check`` for positional arguments, without its per-call ``inspect`` binding: the
    guards read the function's locals, its closure and its arguments by name (its private artifacts)."""
    try:
        artifacts = compiled._artifacts
        manager, parameters, env = (
            artifacts.guard_manager,
            list(artifacts.signature.parameters.values()),
            artifacts.runtime_env,
        )
        closure = dict(zip(env.bytecode.co_freevars, (cell.cell_contents for cell in env.closure or ())))
    except (AttributeError, ValueError):  # another torch's internals: its own check
        return compiled.guard_check
    positional = [p.name for p in parameters if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    rest = [p.name for p in parameters if p.kind is inspect.Parameter.VAR_POSITIONAL]
    if manager is None or len(positional) + len(rest) != len(parameters):
        return compiled.guard_check

    def check(*args: Any) -> bool:
        if len(args) < len(positional) or (len(args) > len(positional) and not rest):
            return compiled.guard_check(*args)
        f_locals = dict(closure)
        f_locals.update(zip(positional, args))
        if rest:
            f_locals[rest[0]] = args[len(positional) :]
        return manager.check(f_locals)

    return check


def cpu_features() -> list[str]:
    """The CPU features torch reports as supported (``torch.cpu._is_*_supported``), sorted: what a
    compiled library built here needs from a CPU."""
    return sorted(
        name
        for name in dir(torch.cpu)
        if name.startswith("_is_") and name.endswith("_supported") and getattr(torch.cpu, name)()
    )


def in_functorch_transform() -> bool:
    """Whether a torch.func transform is active (True when this torch cannot tell): functorch's
    interpreter stack has no public accessor."""
    peek = getattr(torch._C._functorch, "peek_interpreter_stack", None)
    return peek is None or peek() is not None


def traced_by_make_fx() -> bool:
    """Whether make_fx is tracing the running code (its proxy dispatch mode is active): how the package
    builder traces a step ahead of time, where ``torch.compiler.is_compiling`` is False."""
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.PROXY) is not None


def onednn_linear_pointwise(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``x @ weight.T (+ bias)`` on oneDNN, strided inputs read as they are: the mkldnn kernel inductor
    uses for frozen weights, which no public op reaches."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def current_saved_tensors_hooks() -> tuple[Callable[[Tensor], Any], Callable[[Any], Tensor]] | None:
    """The innermost ``torch.autograd.graph.saved_tensors_hooks`` in force (pack, unpack), or None."""
    return torch._C._autograd._top_saved_tensors_default_hooks(False)


def swap_storage_memory(first: torch.UntypedStorage, second: torch.UntypedStorage) -> None:
    """Exchange the memory (data pointer and size) of two storages of one device."""
    first._swap_data_ptr_(second)  # type: ignore[attr-defined]


def storage_use_count(storage: torch.UntypedStorage) -> int:
    """The number of references to ``storage``'s storage (each tensor viewing it, each storage object)."""
    return torch._C._storage_Use_Count(storage._cdata)


def aoti_package_runner(path: str) -> Callable[[list[Tensor]], list[Tensor]]:
    """The program in the AOTInductor package ``path`` (a program folder, run in place; an archive file, unpacked
    into a temporary folder of the loader's), loaded by libtorch's C++ loader: a function of the flat list of its
    input tensors. ``torch._inductor.aoti_load_package`` wraps the same loader, but importing
    inductor and its pytree handling cost seconds at load and microseconds at every call."""
    return torch._C._aoti.AOTIModelPackageLoader(path, "model", False, 1, -1).run
