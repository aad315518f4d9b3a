"""``compile="aot"``: the steps' programs a package holds (train, optimizer, eval), each compiled ahead of time
(``program_build.py``) the first time it is needed and kept in the compile cache (``training/compile/cache.py``).

The train program compiles at the first train step, the optimizer program when an Optimizer binds its update (from
the optimizer model it was given), the eval program at the first eval step. A program's cache entry is keyed by what
changes it: its role, the digests of the models it comes from, this project's source, the parameters it takes
(names, dtypes, shapes: after LoRA), its inputs as compiled (the ``dynamic`` setting's axes any size) and the
converters of custom operators; the entry's fingerprint holds torch's build, Python and the CPU (``platform_fingerprint``). A
later Module or process with the same key loads the program with no compilation. Entries are signed files read as
untrusted input (``cache_store.py``): one refused, or one torch's loader cannot load, is compiled again and
replaced. The programs a Module runs live in its scratch folder (``scratch.py``), removed with it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import CodeType

import onnx
from torch import Tensor

from ort_torch_train.adapters import registry
from ort_torch_train.errors import InputError, ModelError, PackageError
from ort_torch_train.scratch import ScratchFolder
from ort_torch_train.state.training_state import TrainingState
from ort_torch_train.torch_internals import aoti_package_runner
from ort_torch_train.training.compile.cache import CompileCacheSetting, compile_cache_store
from ort_torch_train.training.compile.cache_store import CacheStore, RefusedEntry, platform_fingerprint
from ort_torch_train.training.compile.step_spec import ParameterPlan
from ort_torch_train.training.forward_graph import ForwardGraph
from ort_torch_train.training.package import program_build as built
from ort_torch_train.training.package.bound import BoundTrainStep, BoundUpdate, ProgramBinding, Runner, checked_inputs
from ort_torch_train.training.package.manifest import Program, TensorEntry, model_digest, tensor_entries
from ort_torch_train.training.package.programs import pack_program, unpack_program

log = logging.getLogger(__name__)
AHEAD_OF_TIME = "aot"  # compile="aot"
ENTRY_KIND = "aot-program"  # the compile cache's kind of entry for a program
FORMAT = "ort-torch-train aot program 2"  # 2: a flat optimizer program
SCRATCH_PREFIX = "ort_torch_train_programs_"  # the folders of the programs a Module loaded, in TMPDIR


def ahead_of_time(compile: object, compile_cache: CompileCacheSetting) -> AheadOfTime | None:
    """The source of ``compile="aot"``'s programs, cached as ``compile_cache`` says; None for another setting."""
    return AheadOfTime(compile_cache) if isinstance(compile, str) and compile == AHEAD_OF_TIME else None


@dataclass(frozen=True)
class AheadOfTime:
    """Programs compiled on demand into the compile cache ``compile_cache`` names (a ``ProgramsSource``)."""

    compile_cache: CompileCacheSetting

    def open(
        self,
        training_model: onnx.ModelProto,
        eval_model: onnx.ModelProto | None,
        graphs: tuple[ForwardGraph, ForwardGraph | None],
        state: TrainingState,
        trainable: list[str],
    ) -> OnDemandSteps:
        """The programs of these models, graphs and parameters, none compiled yet."""
        store = compile_cache_store(self.compile_cache)
        return OnDemandSteps(training_model, eval_model, graphs, state, trainable, store)


class OnDemandSteps:
    """The train, eval and optimizer programs of ``graphs`` (train, eval) over ``state``'s parameters, compiled
    or loaded from ``store`` (None: no cache) when first needed."""

    def __init__(
        self,
        training_model: onnx.ModelProto,
        eval_model: onnx.ModelProto | None,
        graphs: tuple[ForwardGraph, ForwardGraph | None],
        state: TrainingState,
        trainable: list[str],
        store: CacheStore | None,
    ) -> None:
        self._train_graph, self._eval_graph = graphs
        self._store = store
        self._scratch = ScratchFolder(SCRATCH_PREFIX)  # the programs loaded
        self._digests = {"training": model_digest(training_model)}
        if eval_model is not None:
            self._digests["eval"] = model_digest(eval_model)
        graph_names = list(self._train_graph.layout.params)
        self._trainable = list(trainable)
        self._frozen = ParameterPlan.of(graph_names, trainable).frozen_names(graph_names)
        self._parameters = [built.tensor_entry(n, state.params[n]) for n in (*self._trainable, *self._frozen)]
        self._binding = ProgramBinding(self._scratch.path, self._parameters, len(self._trainable))
        self._eval: tuple[Program, Runner] | None = None
        self._updates: dict[str, tuple[Program, Runner, dict[str, object]]] = {}  # by optimizer model digest

    @property
    def trainable_names(self) -> list[str]:
        """The trainable parameters' names, in the order the steps take them."""
        return list(self._trainable)

    @property
    def frozen_names(self) -> list[str]:
        """The frozen parameters' names, in the order the train step takes them."""
        return list(self._frozen)

    def bind_train(self, state: TrainingState) -> TrainOnFirstCall:
        """The train step over ``state``'s parameters and gradients, its program compiled (or loaded) at its
        first call."""
        return TrainOnFirstCall(functools.partial(self._train_step, state))

    def _train_step(self, state: TrainingState, inputs: Sequence[Tensor]) -> BoundTrainStep:
        graph = self._train_graph
        example = built.examples(graph, given=_counted(graph, inputs, "TrainStep"))
        parts = {"model": self._digests["training"], "inputs": example.entries, "graph": _graph_parts(graph)}
        program, run, _ = self._program(
            "train", parts, lambda path: (built.train_program(graph, state.params, self._trainable, path, example), {})
        )
        return self._binding.train(state, program, run)

    def bind_update(self, state: TrainingState, optimizer_model: onnx.ModelProto) -> BoundUpdate:
        """The optimizer step of ``optimizer_model`` over ``state``'s trainable parameters, gradients and moments,
        its program compiled (or loaded) now."""
        trainable = [state.params[name] for name in self._trainable]

        def build(path: Path) -> tuple[Program, dict[str, object]]:
            update = built.optimizer_program(optimizer_model, trainable, path)
            return update.program, {"moments": list(update.moments)}

        digest = model_digest(optimizer_model)
        known = self._updates.get(digest)  # another Optimizer over this module, of the same model
        program, run, extra = known or self._program("optimizer", {"model": digest}, build)
        self._updates[digest] = (program, run, extra)
        moments = extra.get("moments")
        if not isinstance(moments, list) or not all(isinstance(name, str) for name in moments):
            raise PackageError(f"compile='aot': the optimizer program's record names no moments ({moments!r})")
        return self._binding.update(state, program, run, moments)

    def eval_step(self, inputs: Sequence[Tensor], params: Sequence[Tensor]) -> tuple[Tensor, ...]:
        """The eval graph's outputs, its program compiled (or loaded) at the first call."""
        if self._eval is None:
            graph = self._eval_graph
            if graph is None:
                raise ModelError("Eval model was not provided: evaluation needs the eval model (eval_model_uri).")
            example = built.examples(graph, given=_counted(graph, inputs, "EvalStep"))
            held = dict(zip(graph.layout.params, params))
            entries = [built.tensor_entry(name, tensor) for name, tensor in held.items()]
            parts = {
                "model": self._digests["eval"],
                "training": self._digests["training"],  # the eval graph shares the training model's constants
                "inputs": example.entries,
                "parameters": entries,
                "graph": _graph_parts(graph),
            }
            program, run, _ = self._program(
                "eval", parts, lambda path: (built.eval_program(graph, held, path, example), {})
            )
            self._eval = (program, run)
        program, run = self._eval
        return tuple(run([*checked_inputs(program, inputs, "EvalStep"), *params]))

    def _program(
        self, role: str, parts: Mapping[str, object], build: Callable[[Path], tuple[Program, dict[str, object]]]
    ) -> tuple[Program, Runner, dict[str, object]]:
        """The ``role`` program keyed by ``parts``: loaded from the cache, else compiled by ``build(path)`` (its
        program and what else its entry records) and saved there."""
        key = _key(role, {**parts, "parameters": parts.get("parameters", self._parameters)})
        path = self._scratch.path / f"{role}-{key[:16]}"  # one folder per program: a loaded one stays as it is
        fingerprint = platform_fingerprint()
        loaded = None if self._store is None else self._load(role, key, fingerprint, path)
        if loaded is not None:
            return loaded
        started = time.perf_counter()
        program, extra = build(path)
        run = aoti_package_runner(os.fspath(path))
        log.info("compile='aot': compiled the %s program %s in %.1f s", role, key[:12], time.perf_counter() - started)
        if self._store is not None:
            record = {**extra, "program": asdict(program)}
            try:
                self._store.write(ENTRY_KIND, key, fingerprint, pack_program(path), record)
            except OSError as error:  # a cache is an optimisation
                log.warning("compile cache: could not save the %s program %s (%s)", role, key[:12], error)
            else:
                log.info("compile cache: saved the %s program %s in %s", role, key[:12], self._store.directory)
        return program, run, extra

    def _load(
        self, role: str, key: str, fingerprint: str, path: Path
    ) -> tuple[Program, Runner, dict[str, object]] | None:
        """The ``role`` program saved under ``key``; None on a miss, or for an entry refused or that does not load
        (logged: it is compiled again)."""
        assert self._store is not None
        try:
            found = self._store.read(ENTRY_KIND, key, fingerprint)
        except RefusedEntry as refused:
            log.warning("compile cache: refused the saved %s program %s (%s); compiling it", role, key[:12], refused)
            return None
        if found is None:
            log.info("compile cache miss: no saved %s program %s; compiling it", role, key[:12])
            return None
        header, payload = found
        try:
            recorded = header["program"]
            program = Program(
                str(recorded["file"]),
                tensor_entries(recorded["inputs"]),
                tuple(str(name) for name in recorded["outputs"]),
            )
            unpack_program(payload, path, durable=False)  # the Module's scratch folder
            run = aoti_package_runner(os.fspath(path))
        except Exception as error:  # a malformed record, or torch's loader's many errors: compiled again
            log.warning("compile cache: cannot load the saved %s program %s (%s); compiling it", role, key[:12], error)
            return None
        log.info("compile cache hit: the %s program %s from %s", role, key[:12], self._store.directory)
        return program, run, header


class TrainOnFirstCall:
    """A train step (``TrainProgram``) whose program ``bind(inputs)`` compiles or loads at its first call."""

    def __init__(self, bind: Callable[[Sequence[Tensor]], BoundTrainStep]) -> None:
        self._bind = bind
        self._bound: BoundTrainStep | None = None

    def __call__(self, inputs: list[Tensor], reset: bool) -> tuple[Tensor, ...]:
        bound = self._bound
        if bound is None:
            bound = self._bound = self._bind(inputs)
        return bound(inputs, reset)


def _counted(graph: ForwardGraph, inputs: Sequence[Tensor], what: str) -> Sequence[Tensor]:
    """``inputs``; InputError where their count is not the graph's (before a program is compiled for them)."""
    names = [declaration.name for declaration in graph.declarations]
    if len(inputs) != len(names):
        raise InputError(f"{what}: expected {len(names)} inputs {names}, got {len(inputs)}")
    return inputs


def _graph_parts(graph: ForwardGraph) -> dict[str, object]:
    """What changes a graph's program besides its model: its ``dynamic`` setting and the converters its custom
    operators take from the session's own library (their code)."""
    converters = []
    library = graph.library
    if library is not None:
        for node in graph.graph.node:
            converter = library.converter(node.domain, node.op_type)
            if converter is not None:
                converters.append([node.domain, node.op_type, *_code_parts(converter)])
    return {"dynamic": graph.dynamic, "converters": converters}


def _code_parts(function: object) -> list[str]:
    """A function's module, name and code (its bytecode, names and constants, digested)."""
    digest = hashlib.sha256()
    code = getattr(function, "__code__", None)
    if isinstance(code, CodeType):
        _digest_code(digest, code)
    name = getattr(function, "__qualname__", type(function).__qualname__)
    return [str(getattr(function, "__module__", "")), name, digest.hexdigest()]


def _digest_code(digest: hashlib._Hash, code: CodeType) -> None:
    digest.update(code.co_code + repr(code.co_names).encode())
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            _digest_code(digest, constant)
        else:
            digest.update(repr(constant).encode())


def _key(role: str, parts: Mapping[str, object]) -> str:
    """The cache key of a ``role`` program: a digest of its ``parts`` and this project's source."""
    described = json.dumps([FORMAT, role, source_digest(), parts], sort_keys=True, default=_plain)
    return hashlib.sha256(described.encode()).hexdigest()


def _plain(value: object) -> object:
    if isinstance(value, TensorEntry):
        return asdict(value)
    return repr(value)


@functools.cache
def source_digest() -> str:
    """A digest of this project's Python source (the conversion, passes and step programs a program is built
    from), read once per process."""
    digest = hashlib.sha256()
    folders = [Path(__file__).parents[2], Path(registry.__file__).parent]  # ort_torch_train, its adapters
    for folder in dict.fromkeys(folders):
        for path in sorted(folder.rglob("*.py")):
            digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()
