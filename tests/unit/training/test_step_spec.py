"""One compiled train step's spec: every field counts in its specialisation key and its precompiled key;
the process's own objects stay out of the saved step."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest
import torch

from ort_torch_train.optim.compiled import FusedUpdate
from ort_torch_train.state.flat import FlatLayout
from ort_torch_train.state.training_state import TrainingState
from ort_torch_train.training.compile.precompiled import step_key
from ort_torch_train.training.compile.settings import MIN_CHUNK_SIZE, FrozenArguments
from ort_torch_train.training.compile.step_spec import ParameterPlan, StepSpec
from ort_torch_train.training.precision import MixedPrecision

MODULE = torch.nn.Linear(2, 3)
ARGS = ([torch.zeros(4, 2)], [MODULE.weight.detach()])


def _kernel(params, grads, *rest):  # an update's kernel (never run here)
    pass


def _average(grads):  # a data-parallel reduction (never run here)
    return grads


def _bf16() -> MixedPrecision:
    return MixedPrecision("bf16", TrainingState({}))


BASE = StepSpec(ParameterPlan(((True, 0), (False, 0))), update=FusedUpdate(_kernel, (0,)))
CHANGED = {
    "plan": ParameterPlan(((True, 0), (True, 1))),
    "compile_arguments": FrozenArguments({"options": {"cpp_wrapper": False}}),
    "update": FusedUpdate(_kernel, (1,)),
    "reduction": _average,
    "precision": _bf16(),
    "layout": FlatLayout(((3, 2),)),
    "fresh_gradients": True,
}


def test_every_field_changes_the_step_keys():
    """A field added to the spec without a value here fails: it must count in both keys."""
    assert set(CHANGED) == {field.name for field in fields(StepSpec)}
    key = step_key(MODULE, BASE.key_parts(), ARGS)
    for name, value in CHANGED.items():
        changed = replace(BASE, **{name: value})
        assert changed != BASE, name
        assert step_key(MODULE, changed.key_parts(), ARGS) != key, name


def test_a_spec_built_again_is_the_same_key():
    """The engine builds a spec at every step: equal values give an equal, equally hashed spec, and the
    precompiled key names mixed precision by its setting, not its object."""
    again = StepSpec(ParameterPlan(((True, 0), (False, 0))), update=FusedUpdate(_kernel, (0,)))
    assert again == BASE and hash(again) == hash(BASE) and {BASE: 1}[again] == 1
    first, second = replace(BASE, precision=_bf16()), replace(BASE, precision=_bf16())
    assert first != second  # another engine's precision: another step
    assert step_key(MODULE, first.key_parts(), ARGS) == step_key(MODULE, second.key_parts(), ARGS)


def test_the_process_objects_are_named_not_pickled():
    spec = replace(BASE, reduction=_average, precision=_bf16())
    assert spec.external() == {"update": spec.update, "reduction": _average, "precision": spec.precision}


def test_fresh_gradients_need_an_update():
    with pytest.raises(ValueError, match="fresh_gradients: a step that makes gradients of its own needs an update"):
        StepSpec(BASE.plan, fresh_gradients=True)


def test_compile_arguments_are_frozen_and_take_the_devices_defaults():
    arguments = FrozenArguments({"options": {"b": [1], "a": True}, "backend": "inductor"})
    assert arguments == {"backend": "inductor", "options": {"a": True, "b": [1]}}
    assert hash(arguments) == hash(FrozenArguments({"backend": "inductor", "options": {"b": [1], "a": True}}))
    assert repr(arguments) == "{'backend': 'inductor', 'options': {'a': True, 'b': [1]}}"
    thawed = arguments.thawed()
    assert type(thawed) is dict and type(thawed["options"]) is dict
    on_cpu = replace(BASE, compile_arguments=arguments).on_device(torch.device("cpu")).compile_arguments
    assert on_cpu["options"]["cpp.min_chunk_size"] == MIN_CHUNK_SIZE and on_cpu["options"]["cpp_wrapper"]
    assert (
        not replace(BASE, reduction=_average).on_device(torch.device("cpu")).compile_arguments["options"]["cpp_wrapper"]
    )
    assert replace(BASE, compile_arguments=arguments).on_device(torch.device("meta")).compile_arguments == arguments
