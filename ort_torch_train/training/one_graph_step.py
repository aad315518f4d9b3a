"""``OneGraphSteps``: a TrainingEngine's compiled train steps, each one graph (``compile/step.py``), with or without
the optimizer's update in it.

Each step finds its compiled graph by the parts that vary (the update, the gradients' reduction, the precision, the
flat buffers' layout, whether it makes fresh gradients) and its inputs' shapes and dtypes; the last step's parts
and graph are reused while the next step's are the same objects, so a steady loop looks nothing up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ort_torch_train.optim.compiled import FusedUpdate
from ort_torch_train.optim.engine import OptimizerEngine
from ort_torch_train.state.flat import FlatLayout, FlatState
from ort_torch_train.state.fresh_gradients import FreshGradients, pays_off
from ort_torch_train.state.training_state import TrainingState
from ort_torch_train.training.compile.cache_entries import CompileCache
from ort_torch_train.training.compile.settings import FrozenArguments, records_cuda_graphs
from ort_torch_train.training.compile.step import CompiledTrainStep
from ort_torch_train.training.compile.step_spec import ParameterPlan, Reduction, StepSpec
from ort_torch_train.training.forward_graph import ForwardGraph
from ort_torch_train.training.precision import MixedPrecision, float32_outputs
from ort_torch_train.training.threads import ThreadPolicy

Views = tuple[list[Tensor], list[Tensor], list[Tensor]]  # detached trainable and frozen parameters, and gradients


class OneGraphSteps:
    """The compiled train steps of ``graph`` over ``params`` (the graph's parameters, ``plan`` telling trainable
    from frozen), with ``state``'s tensors (its ``names`` trainable); ``views`` gives the parameters' detached views
    and gradients (checked against the parameters' tensors where its argument is true: no flat buffers)."""

    def __init__(
        self,
        graph: ForwardGraph,
        params: list[torch.nn.Parameter],
        state: TrainingState,
        names: list[str],
        plan: ParameterPlan,
        compile_arguments: FrozenArguments,
        cache: CompileCache | None,
        threads: ThreadPolicy,
        views: Callable[[bool], Views],
    ) -> None:
        self._graph = graph
        self._params = params
        self._state = state
        self._names = names
        self._plan = plan
        self._compile_arguments = compile_arguments
        self._records_cuda_graphs = records_cuda_graphs(compile_arguments)  # on a CUDA device
        self._cache = cache
        self._threads = threads
        self._views = views
        self._specs: dict[tuple, StepSpec] = {}  # by the parts that vary
        self._last: tuple = ()  # (update, reduction, precision, layout, fresh, spec, input signature, step)
        self._flat_arguments: tuple = ()  # (flat buffers, [params], [grads], moment lists, fresh), once per buffers

    def run(
        self,
        inputs: list[Tensor],
        optimizer: OptimizerEngine | None,
        reset: bool,
        reduction: Reduction | None,
        precision: MixedPrecision | None,
    ) -> tuple[Tensor, ...]:
        """One step: forward and backward (the gradients replaced where ``reset``, else added to), ``optimizer``'s
        update in the same graph where given, the gradients reduced across ranks by ``reduction``; the outputs."""
        update = None if optimizer is None else optimizer.fused_update()
        names = self._names
        state = self._state
        flat = (
            state.current_flat(names)
            if optimizer is None  # the optimizer makes them
            else state.flat_view(names, optimizer.update_moment_names, gradients=False)
        )
        trainable, frozen, grad_views = self._views(flat is None)
        if flat is not None:
            trainable, grads, moments, fresh = self._flat_lists(flat)
            fresh = fresh and reset and update is not None
            states = () if optimizer is None else moments
        else:
            grads, fresh = grad_views, False
            states = () if optimizer is None else optimizer.moment_lists()
        step = self._step(inputs, update, reduction, precision, None if flat is None else flat.layout, fresh)
        fresh_gradients = FreshGradients(flat, grad_views) if fresh and flat is not None else None
        scalars = None if optimizer is None else optimizer.next_step_scalars()
        try:
            if fresh_gradients is None:
                outputs = step(inputs, trainable, frozen, grads, reset, states, scalars)
            else:
                fresh_gradients.release()
                try:
                    outputs, (gradient,) = step(inputs, trainable, frozen, [], reset, states, scalars)
                except BaseException:
                    fresh_gradients.install_zeros()  # a reset is still pending: zeros stand for it
                    raise
                fresh_gradients.install(gradient)
            if precision is not None:
                outputs = float32_outputs(outputs)
        except RuntimeError as error:
            self._raise_eager_error(inputs, error)
            raise
        if optimizer is not None:
            optimizer.count_step()
        return outputs

    def _flat_lists(self, flat: FlatState) -> tuple[list[Tensor], list[Tensor], list[list[Tensor]], bool]:
        """The step's argument lists over ``flat``'s buffers (parameters, gradients, moments) and whether a step
        that resets the gradients makes fresh ones (``fresh_gradients.py``; not where CUDA graphs replay on
        gradients at fixed addresses), made once per buffers (frozen: new buffers are a new object)."""
        made = self._flat_arguments
        if made and made[0] is flat:
            return made[1], made[2], made[3], made[4]
        device = flat.params.device
        fresh = pays_off(flat) and not (self._records_cuda_graphs and device.type == "cuda")
        lists = ([flat.params], [flat.grads], [[moment] for moment in flat.moments], fresh)
        self._flat_arguments = (flat, *lists)
        return lists

    def _step(
        self,
        inputs: Sequence[Tensor],
        update: FusedUpdate | None,
        reduction: Reduction | None,
        precision: MixedPrecision | None,
        layout: FlatLayout | None,
        fresh: bool,
    ) -> Callable[..., tuple]:
        """The compiled step for these parts and inputs: the last one where the parts are the same objects and the
        inputs have the same shapes and dtypes."""
        signature = [(t.shape, t.dtype) for t in inputs]
        last = self._last
        if (
            last
            and last[0] is update
            and last[1] is reduction
            and last[2] is precision
            and last[3] is layout
            and last[4] == fresh
            and last[6] == signature
        ):
            return last[7]
        parts = (update, reduction, precision, layout, fresh)
        spec = self._specs.get(parts)
        if spec is None:  # a spec is built once per combination of the parts, not at every step
            spec = self._specs[parts] = StepSpec(
                self._plan,
                self._compile_arguments,
                update=update,
                reduction=reduction,
                precision=precision,
                layout=layout,
                fresh_gradients=fresh,
            )
        graph = self._graph
        step = graph.specialised(
            inputs,
            self._params,
            spec,
            lambda module, device: CompiledTrainStep(
                graph.compiled_module(module, device), spec.on_device(device), cache=self._cache, threads=self._threads
            ),
        )
        self._last = (*parts, spec, signature, step)
        return step

    def forget(self) -> None:
        """Look the next step up again (the graph's compiled steps were cleared)."""
        self._last = ()

    def _raise_eager_error(self, inputs: list[Tensor], error: RuntimeError) -> None:
        """Re-run a failed compiled step's forward eagerly, on copies of the parameters, so that the
        converters' checks raise their errors naming the bad input (compiled kernels cannot)."""
        with torch.no_grad():
            try:
                self._graph(inputs, [param.detach().clone() for param in self._params])
            except Exception as eager_error:
                raise eager_error from error
