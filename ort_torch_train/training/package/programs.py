"""The steps a package holds, as pure functions of tensors, and their ahead-of-time compilation.

Each step takes every tensor it reads as an argument and updates the state it changes in place: torch.export
records the writes as mutations of its inputs and AOTInductor's program makes them into the caller's tensors
(which must be contiguous), so that a step allocates no new parameter, gradient or moment.

- train: ``(*inputs, *trainable, *frozen, *grads, reset) -> outputs``, forward and ``torch.func.grad``'s
  backward; the gradients replace ``grads`` where ``reset`` (a boolean tensor) is true, else add to them
  (ORT's accumulation until ``LazyResetGrad``); ``frozen`` takes what the forward updated in it (BatchNorm's
  running statistics).
- optimizer: ``(params, grads, *moments, scalars) -> ()``, the optimizer's fused update (``optim/compiled.py``) of
  the params and moments, the gradients clipped first where the optimizer model clips. Each of params, grads and
  each moment is one flat tensor holding every trainable parameter's (``state/flat.py``): the update is
  elementwise, one loop, and a call hands the program a few tensors, not a few per parameter.
- eval: ``(*inputs, *params) -> outputs``, the eval graph's forward.

A compiled program is a folder, the AOTInductor package unpacked: libtorch's loader runs it in place and writes
nothing, where it unpacks an archive file into a temporary folder of its own, outside the folder the user named, that
a process ending without releasing the program leaves behind.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

import torch
from torch import Tensor
from torch.export import Dim, ExportedProgram
from torch.fx.experimental.proxy_tensor import make_fx

from ort_torch_train.errors import PackageError
from ort_torch_train.fileio import atomic_folder, path_inside
from ort_torch_train.optim.clip import clip_grad_norm_
from ort_torch_train.optim.compiled import FusedUpdate
from ort_torch_train.passes.small_products import MAX_STATIC_EXTENTS, small_products_pass
from ort_torch_train.passes.unfused_addmm import unfused_addmm_pass
from ort_torch_train.training.compile.step_spec import ParameterPlan

AxisSizes = dict[int, Dim] | None  # one input's dynamic axes for torch.export, None: all fixed


def train_function(module: Callable[..., Sequence[Tensor]], inputs: int, plan: ParameterPlan) -> Callable[..., tuple]:
    """The train step over ``module`` (``module(*inputs, *graph parameters)``), taking ``inputs`` user inputs
    and the parameters as ``plan`` splits them into trainable and frozen."""
    trainable_count = sum(1 for is_trainable, _ in plan.sources if is_trainable)
    frozen_count = len(plan.sources) - trainable_count

    def train_step(*args: Tensor) -> tuple[Tensor, ...]:
        user = args[:inputs]
        trainable = list(args[inputs : inputs + trainable_count])
        held = args[inputs + trainable_count : inputs + trainable_count + frozen_count]
        frozen = [tensor.clone() for tensor in held]
        grads = args[inputs + trainable_count + frozen_count : -1]
        reset = args[-1]

        # frozen is an argument too: a transformed function may not mutate a captured tensor (BatchNorm's statistics)
        def loss_and_outputs(trainable: list[Tensor], frozen: list[Tensor]) -> tuple[Tensor, Sequence[Tensor]]:
            params = [trainable[i] if is_trainable else frozen[i] for is_trainable, i in plan.sources]
            outputs = module(*user, *params)
            loss = outputs[0]
            return (loss if loss.dim() == 0 else loss.sum()), outputs  # a non-scalar loss: ORT's ones seed

        gradients, outputs = torch.func.grad(loss_and_outputs, argnums=0, has_aux=True)(trainable, frozen)
        for old, new in zip(grads, gradients):
            old.copy_(torch.where(reset, new, old + new))
        for target, updated in zip(held, frozen):
            target.copy_(updated)
        return tuple(outputs)

    return train_step


def optimizer_function(update: FusedUpdate, moments: int) -> Callable[..., tuple]:
    """The optimizer step of ``update`` over flat params, grads and ``moments`` moments (one tensor each)."""

    def optimizer_step(params: Tensor, grads: Tensor, *rest: Tensor) -> tuple[Tensor, ...]:
        states, scalars = rest[:moments], rest[moments]
        if update.clip_max_norm is not None:
            clip_grad_norm_([grads], update.clip_max_norm)
        update.kernel([params], [grads], *([state] for state in states), scalars, *update.constants)
        return ()

    return optimizer_step


def eval_function(module: Callable[..., Sequence[Tensor]]) -> Callable[..., tuple]:
    """The eval step over ``module``."""

    def eval_step(*args: Tensor) -> tuple[Tensor, ...]:
        return tuple(module(*args))

    return eval_step


class _Traced(torch.nn.Module):
    """A traced step as the module torch.export takes."""

    def __init__(self, graph: torch.fx.GraphModule) -> None:
        super().__init__()
        self.graph_module = graph

    def forward(self, *args: Tensor) -> tuple[Tensor, ...]:
        return self.graph_module(*args)


def export_step(
    function: Callable[..., tuple], example: Sequence[Tensor], axes: Sequence[AxisSizes]
) -> ExportedProgram:
    """``function`` traced for ``example`` (as ATen operations, backward included) and exported, the ``axes``
    of each argument dynamic; tensors the converted graph holds as constants (a BatchNorm's fixed running
    statistics) enter the trace as constants."""
    traced = make_fx(function, tracing_mode="symbolic", _allow_non_fake_inputs=True)(*example)
    return torch.export.export(_Traced(traced), tuple(example), dynamic_shapes=(tuple(axes),), strict=False)


# inductor's settings for a package's programs: their intermediate tensors carved from one allocation per call, not
# one each (bench/experiments/small_products.py, suffix ``:unplanned``: without)
PROGRAM_SETTINGS: Mapping[str, object] = MappingProxyType({"memory_planning": True})


def compile_program(
    program: ExportedProgram,
    folder: str | os.PathLike,
    *,
    max_static_extents: int = MAX_STATIC_EXTENTS,
    settings: Mapping[str, object] = PROGRAM_SETTINGS,
) -> None:
    """Compile ``program`` with AOTInductor into the program folder ``folder`` (written whole or not at all) under
    inductor's ``settings``, its small matrix products (``max_static_extents``: ``passes/small_products.py``; 0:
    none) in inductor's own loops and the other ``addmm`` as a product and a fused add (``passes/unfused_addmm.py``)."""
    from ort_torch_train.passes.attention_loops import attention_loops_pass  # sympy: loaded when a program compiles
    from ort_torch_train.passes.refined_reshapes import refined_reshapes_pass

    loops = attention_loops_pass(then=refined_reshapes_pass())  # small attention, head views: their files
    products = small_products_pass(max_static_extents, unfused_addmm_pass(then=loops))
    archive = io.BytesIO()
    with torch._inductor.config.patch({**settings, "post_grad_custom_post_pass": products}):
        torch._inductor.aoti_compile_and_package(program, package_path=archive)
    unpack_program(archive.getvalue(), folder)


def pack_program(folder: str | os.PathLike) -> bytes:
    """The program folder ``folder`` as one archive (what a compile cache keeps; ``unpack_program`` restores it)."""
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as packed:
        for path in sorted(Path(folder).rglob("*")):
            if path.is_file():
                packed.write(path, path.relative_to(folder).as_posix())
    return archive.getvalue()


UNPACKED_LIMIT = 1 << 32  # the bytes an archive may unpack to: a program's code and constants


def unpack_program(archive: bytes, folder: str | os.PathLike, *, durable: bool = True) -> None:
    """Write the program archive ``archive`` (an AOTInductor package, or ``pack_program``'s) unpacked into the folder
    ``folder``, whole or not at all (flushed to disk where ``durable``: not for a scratch folder the process removes);
    PackageError for bytes that are no zip archive, an entry whose name leaves the folder, or more than
    ``UNPACKED_LIMIT`` bytes unpacked."""
    try:
        packed = zipfile.ZipFile(io.BytesIO(archive))
    except zipfile.BadZipFile as error:
        raise PackageError(f"program {os.fspath(folder)!r}: expected a zip archive, got {error}") from None
    with packed:
        entries = [entry for entry in packed.infolist() if not entry.is_dir()]
        size = sum(entry.file_size for entry in entries)
        if size > UNPACKED_LIMIT:
            raise PackageError(
                f"program {os.fspath(folder)!r}: the archive unpacks to {size} bytes, over {UNPACKED_LIMIT}"
            )

        def fill(scratch: Path) -> None:
            for entry in entries:
                target = path_inside(scratch, entry.filename, f"program {os.fspath(folder)!r}: archive entry")
                target.parent.mkdir(parents=True, exist_ok=True)
                with packed.open(entry) as source, open(target, "xb") as written:
                    shutil.copyfileobj(source, written)

        atomic_folder(folder, fill, durable=durable)


def dimension(name: str) -> Dim:
    """A torch.export dimension of any size >= 1 for the ONNX symbolic axis ``name``."""
    identifier = re.sub(r"\W", "_", name)
    return Dim(identifier if identifier[:1].isalpha() else f"axis_{identifier}", min=1)
