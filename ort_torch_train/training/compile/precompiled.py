"""Compiled steps as torch's AOT-precompiled functions, carried across processes whole, Dynamo's tracing included.

A ``CompiledTrainStep`` (and a ``CompiledForward``: the eval graph) compiles with
``torch.compile(...).aot_compile`` and calls the result behind its guards, without Dynamo's frame
evaluation. The guards kept are those a saved step can carry,
less those on values fixed for the step's life: none on globals, object identity, the step's immutable
closure values or torch's pytree registry (``_guard_filter``); the step's key stands for them.
With a compile cache (``cache.py``: the engine's, passed down to each step), each step's serialized form
(``save_compiled_function``'s bytes) is saved under a key naming the model, the update and the input
signature (``cache_entries.py``). A later process finding
its key loads the step instead of tracing it; a step that does not load or whose guards reject the
inputs is compiled again, with a log line. The module, update and other closure objects are the
process's own (``external_data``), never pickled.
"""

from __future__ import annotations

import hashlib
import logging
import re
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ort_torch_train.torch_internals import (
    aot_compile,
    dynamic_tracing_errors,
    fast_guard_check,
    list_mode_options,
    load_aot_compiled,
    serialize_aot_compiled,
    unserializable_guard_types,
)
from ort_torch_train.training.compile.cache_entries import CompileCache
from ort_torch_train.training.compile.settings import torch_compile
from ort_torch_train.training.dynamic_shapes import marked_args

if TYPE_CHECKING:
    from ort_torch_train.torch_internals import GuardFilterEntry

log = logging.getLogger(__name__)

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")  # reprs naming an object's address differ between processes
_ROOT = re.compile(r"[A-Za-z_]\w*")  # the variable a guard's source starts from


def step_key(
    module: torch.nn.Module, parts: Sequence[object], args: Sequence[object], dynamic: Sequence[tuple[int, int]] = ()
) -> str:
    """A digest of torch's version, the module (code, submodule settings, constant tensors), ``parts``
    and the shapes, dtypes and devices of the tensors in ``args``, less the sizes along the ``dynamic``
    axes ((i, axis): of the i-th tensor)."""
    digest = hashlib.sha256(torch.__version__.encode())
    for name, submodule in module.named_modules():
        digest.update(f"{name}:{type(submodule).__qualname__}".encode())
        digest.update(str(getattr(submodule, "code", "")).encode())
        for key, value in sorted(vars(submodule).items()):
            if key in ("_parameters", "_modules", "_graph", "_code", "meta") or "hook" in key or key.startswith("__"):
                continue
            _update(digest, key, value)
    for part in parts:
        digest.update(_ADDRESS.sub("", repr(part)).encode())
    varying = set(dynamic)
    for position, tensor in enumerate(_tensors(args)):
        shape = tuple("?" if (position, axis) in varying else size for axis, size in enumerate(tensor.shape))
        stride = tensor.is_contiguous() if "?" in shape else tensor.stride()
        digest.update(f"{shape}:{stride}:{tensor.dtype}:{tensor.device}:{tensor.requires_grad}".encode())
    return digest.hexdigest()


def specialised_dynamic_axis(error: BaseException) -> bool:
    """Whether torch's ``error`` says it specialised an axis marked dynamic (its message or its cause's)."""
    while error is not None:
        if "specialized it to be a constant" in str(error):
            return True
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    return False


def precompiled_step(
    step: Callable,
    module: torch.nn.Module,
    parts: Sequence[object],
    external: Mapping[str, object],
    args: tuple,
    compile_arguments: Mapping[str, Any],
    fallback: Callable,
    what: str = "train step",
    dynamic: Sequence[tuple[int, int]] = (),
    cache: CompileCache | None = None,
) -> GuardedStep | None:
    """``step`` compiled ahead for ``args`` (or, with a compile ``cache``, loaded from the step saved
    under ``step_key(module, parts, args, dynamic)``, else saved there), behind its guards: inputs they
    reject go to ``fallback``. None when torch cannot precompile this step. ``what`` names the step in log
    lines; ``dynamic`` the axes compiled as dynamic dimensions (``step_key``)."""
    key = None if cache is None else step_key(module, parts, args, dynamic)
    external_data = {name: value for name, value in external.items() if value is not None}  # one id for all Nones
    if cache is not None and key is not None:
        data = cache.load_step(key, what)
        if data is not None:
            loaded = _load(data, external_data, args, key, what)
            if loaded is not None:
                return GuardedStep(loaded, fallback, what)
    try:
        compiled = aot_compile(
            torch_compile(step, _with_guard_filter(compile_arguments, step)), marked_args(args, dynamic)
        )
    except Exception as error:  # a backend or mode without precompile support: the usual compilation
        # the usual compilation would specialise the dynamic axes too: the caller compiles for fixed shapes
        if dynamic and isinstance(error, dynamic_tracing_errors()) and specialised_dynamic_axis(error):
            raise
        log.info("cannot precompile the %s (%s); compiling it without precompile", what, error)
        return None
    if cache is not None and key is not None:
        try:
            data = serialize_aot_compiled(compiled, external_data)
        except Exception as error:
            log.info("cannot serialize the precompiled %s %s (%s); it will not be saved", what, key[:12], error)
        else:
            cache.save_step(key, data, what)
    return GuardedStep(compiled, fallback, what)


@dataclass(frozen=True)
class Precompile:
    """A step's ``precompiled_step`` arguments known before its first call."""

    step: Callable
    module: torch.nn.Module
    external: Mapping[str, object]
    compile_arguments: Mapping[str, Any]
    what: str
    dynamic: tuple[tuple[int, int], ...] = ()  # (input position, axis) compiled as dynamic dimensions
    cache: CompileCache | None = None  # where the step is loaded from and saved to; None: nowhere

    def replacing(self, fallback: Callable, parts: Sequence[object], args: tuple) -> Callable:
        """The precompiled (or saved) step for ``args``, else ``fallback`` (torch cannot precompile it)."""
        found = precompiled_step(
            self.step,
            self.module,
            parts,
            self.external,
            args,
            self.compile_arguments,
            fallback,
            self.what,
            self.dynamic,
            self.cache,
        )
        return fallback if found is None else found


def _with_guard_filter(compile_arguments: Mapping[str, Any], step: Callable) -> dict[str, Any]:
    """``compile_arguments`` with ``_guard_filter(step)`` among the options, a ``mode`` given as the
    options it stands for (torch.compile takes a mode or options, not both)."""
    arguments = dict(compile_arguments)
    options = dict(arguments.pop("options", None) or {})
    mode = arguments.pop("mode", None)
    if mode is not None:
        options = {**list_mode_options(mode, dynamic=False), **options}
    return {**arguments, "options": {**options, "guard_filter_fn": _guard_filter(step)}}


def _load(data: bytes, external: dict[str, object], args: tuple, key: str, what: str) -> Any:
    try:
        loaded = load_aot_compiled(data, external)
        matches = loaded.guard_check(*args)
    except Exception as error:
        log.warning("the saved %s %s does not load (%s); compiling it again", what, key[:12], error)
        return None
    if not matches:
        log.warning("the saved %s %s does not match these inputs; compiling it again", what, key[:12])
        return None
    log.info("loaded the saved %s %s", what, key[:12])
    return loaded


class GuardedStep:
    """A precompiled step behind its guards: inputs they reject run ``fallback`` (a torch.compile'd step)."""

    __slots__ = ("compiled", "fallback", "what", "rejected", "_check")

    def __init__(self, compiled: Any, fallback: Callable, what: str) -> None:
        self.compiled, self.fallback, self.what, self.rejected = compiled, fallback, what, False
        self._check = fast_guard_check(compiled)

    def __call__(self, *args: Any) -> Any:
        if self._check(*args):
            return self.compiled.fn(*args)
        if not self.rejected:
            self.rejected = True
            log.warning("the precompiled %s's guards reject these inputs; compiling them", self.what)
        return self.fallback(*args)


def _guard_filter(step: Callable) -> Callable[[Sequence[GuardFilterEntry]], list[bool]]:
    """``_serializable``, less the guards on ``step``'s immutable closure values (tuples of constants,
    frozen dataclasses: the parameter plan, the flat layout: fixed for the step's life and named by its
    key) and on torch's pytree registry (the steps take lists and
    tuples, whose flattening no registration changes; importing a library that registers its classes,
    as ``transformers`` does, would otherwise reject every later call)."""
    fixed = {
        name for name, cell in zip(step.__code__.co_freevars, step.__closure__ or ()) if _immutable(cell.cell_contents)
    }

    def keep(entries: Sequence[GuardFilterEntry]) -> list[bool]:
        return [
            kept and _root(entry.name) not in fixed and "_pytree" not in entry.name
            for kept, entry in zip(_serializable(entries), entries)
        ]

    return keep


def _root(source: str) -> str:
    match = _ROOT.match(source)
    return "" if match is None else match[0]


def _immutable(value: object) -> bool:
    if isinstance(value, tuple):
        return all(_immutable(item) for item in value)
    params = getattr(value, "__dataclass_params__", None)  # a dataclass's settings
    if params is not None and not isinstance(value, type):
        return bool(params.frozen)
    return value is None or isinstance(value, (bool, int, float, str))


def _serializable(entries: Sequence[GuardFilterEntry]) -> list[bool]:
    """The guards a saved step can keep: no globals, none on object identity or on a class defined
    in a function (the fx module's); the step's key stands for what those checked."""
    return [
        not (
            entry.is_global
            or entry.guard_type in unserializable_guard_types()
            or (entry.guard_type in ("TYPE_MATCH", "BUILTIN_MATCH") and "<locals>" in type(entry.value).__qualname__)
        )
        for entry in entries
    ]


def _update(digest: Any, key: str, value: object) -> None:
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"{key}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, dict):
        for inner_key, inner in value.items():
            _update(digest, f"{key}.{inner_key}", inner)
    elif not callable(value):
        digest.update(_ADDRESS.sub("", f"{key}={value!r}").encode())


def _tensors(value: object) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def with_own_code(function: Callable) -> types.FunctionType:
    """``function`` (a Python function) with a code object of its own: Dynamo counts recompilations per
    code object, and each (signature, update) pair is a step of its own, not a recompilation."""
    if not isinstance(function, types.FunctionType):
        raise TypeError(f"expected a Python function, got {function!r}")
    return types.FunctionType(
        function.__code__.replace(),
        function.__globals__,
        function.__name__,
        function.__defaults__,
        function.__closure__,
    )
