"""TrainingState (the core) and CheckpointState (ORT's face): loading, parameters, gradients,
properties, nominal states, device moves, safetensors, and saves byte-identical to ORT's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ort_torch_train.api import CheckpointState, Parameter, Parameters, Properties
from ort_torch_train.checkpoint.odtc import CheckpointRecord, OptimizerGroupRecord, read_checkpoint
from ort_torch_train.errors import CheckpointError, NominalStateError, ParameterDataError, SafetensorsError
from ort_torch_train.state.training_state import OptimizerState, TrainingState

NOMINAL_TEXT = r"nominal state. Please load (the model parameters|the parameter states|all the parameter states) first"


def small_state(optimizer: bool = False) -> TrainingState:
    record = CheckpointRecord(
        {"w": torch.arange(12.0).reshape(4, 3), "b": torch.zeros(4)},
        {"frozen": torch.ones(2), "count": torch.tensor([3])},
        properties={"epoch": 2},
    )
    if optimizer:
        record.optimizer_groups = [
            OptimizerGroupRecord(
                "group0", 5, 0.01, {"w": {"momentum0": torch.ones(4, 3), "momentum1": torch.full((4, 3), 2.0)}}
            )
        ]
    return TrainingState.from_record(record)


def nominal_state() -> TrainingState:
    return TrainingState.from_record(
        CheckpointRecord({"w": torch.empty(0), "b": torch.empty(0)}, {"frozen": torch.empty(0)}, is_nominal=True)
    )


# ---- TrainingState ----------------------------------------------------------------------------------
def test_parameters_follow_file_order_with_zero_grads_on_trainable_only() -> None:
    state = small_state()
    assert list(state.params) == ["w", "b", "frozen", "count"]
    assert state.trainable_names() == ["w", "b"] and state.frozen_names() == ["frozen", "count"]
    for name in state.trainable_names():
        param = state.params[name]
        assert isinstance(param, torch.nn.Parameter) and param.requires_grad
        assert torch.equal(param.grad, torch.zeros_like(param))
    assert all(state.params[n].grad is None for n in state.frozen_names())


def test_set_parameter_data_in_place_with_ort_texts() -> None:
    state = small_state()
    param, pointer = state.params["w"], state.params["w"].data_ptr()
    state.set_parameter_data("w", np.full((4, 3), 7, dtype=np.float32))
    assert state.params["w"] is param and param.data_ptr() == pointer and param[0, 0] == 7
    state.set_parameter_data("count", torch.tensor([9]))
    assert state.params["count"].tolist() == [9]
    with pytest.raises(KeyError, match="Parameter nope not found."):
        state.set_parameter_data("nope", np.zeros(1))
    with pytest.raises(ParameterDataError, match=r"Parameter data shape mismatch\. Expected: \{4,3\}, Got: \{3,3\}"):
        state.set_parameter_data("w", np.zeros((3, 3), np.float32))
    with pytest.raises(ParameterDataError, match="Parameter data type mismatch. Expected: float32, Got: float64"):
        state.set_parameter_data("w", np.zeros((4, 3)))
    with pytest.raises(TypeError, match="list"):
        state.set_parameter_data("w", [[0.0] * 3] * 4)
    assert param[0, 0] == 7  # failed updates changed nothing


def test_tensors_and_state_dict_are_the_live_tensors() -> None:
    state = small_state()
    tensors = state.tensors()
    assert list(tensors) == ["b", "count", "frozen", "w"]
    assert all(tensors[n] is state.params[n] for n in tensors)
    state_dict = state.state_dict()
    assert list(state_dict) == list(state.params) and not state_dict["w"].requires_grad
    state_dict["w"][0, 0] = -1
    assert state.params["w"][0, 0] == -1


def test_to_record_writes_the_group_only_when_there_is_one(tmp_path: Path) -> None:
    without = small_state()
    without.save(tmp_path / "a", include_optimizer_state=True)
    assert read_checkpoint(tmp_path / "a").optimizer_groups == []
    assert read_checkpoint(tmp_path / "a").properties == {"epoch": 2}  # always saved
    state = small_state(optimizer=True)
    assert state.to_record().optimizer_groups == []
    state.save(tmp_path / "b", include_optimizer_state=True)
    loaded = TrainingState.load(tmp_path / "b")
    assert (loaded.optimizer.group_name, loaded.optimizer.step) == ("group0", 5)
    assert loaded.optimizer.initial_learning_rate == pytest.approx(0.01)
    assert torch.equal(loaded.optimizer.momentums["w"]["momentum1"], torch.full((4, 3), 2.0))
    assert TrainingState.load(state.to_bytes(True)).optimizer.step == 5


@pytest.mark.parametrize(
    "file_name,with_optimizer", [("final_checkpoint_with_optimizer", True), ("final_checkpoint_no_optimizer", False)]
)
def test_state_saves_ort_files_byte_identical(
    corpus_case: Path, file_name: str, with_optimizer: bool, tmp_path: Path
) -> None:
    if not (corpus_case / file_name).exists():
        pytest.skip(f"{corpus_case / file_name} absent")
    original = (corpus_case / file_name).read_bytes()
    state = TrainingState.load(corpus_case / file_name)
    state.save(tmp_path / "saved", include_optimizer_state=with_optimizer)
    assert (tmp_path / "saved").read_bytes() == original
    assert state.to_bytes(with_optimizer) == original


def test_invalid_optimizer_state_is_rejected() -> None:
    record = small_state(optimizer=True).to_record(True)
    two = CheckpointRecord(record.trainable, record.frozen, optimizer_groups=record.optimizer_groups * 2)
    with pytest.raises(CheckpointError, match="2 optimizer groups"):
        TrainingState.from_record(two)
    record.optimizer_groups[0].momentums["ghost"] = {"momentum0": torch.zeros(1)}
    with pytest.raises(CheckpointError, match="'ghost', which is not a parameter"):
        TrainingState.from_record(record)
    record.optimizer_groups[0].momentums = {"b": {"momentum0": torch.zeros(5)}}
    with pytest.raises(CheckpointError, match=r"float32\{5\}, but the parameter is float32\{4\}"):
        TrainingState.from_record(record)
    with pytest.raises(CheckpointError, match="both trainable and frozen"):
        TrainingState.from_record(CheckpointRecord({"a": torch.ones(1)}, {"a": torch.ones(1)}))
    with pytest.raises(CheckpointError, match="only floating-point"):
        TrainingState.from_record(CheckpointRecord({"i": torch.arange(3)}, {}))


def test_properties_are_typed_like_ort() -> None:
    state = small_state()
    state.set_property("lr", 0.1)
    assert state.get_property("lr") == float(np.float32(0.1))
    state.set_property("n", np.int64(-(2**63)))
    state.set_property("s", "text")
    assert isinstance(state.get_property("n"), int)
    for value, error, text in [
        (True, TypeError, "bool"),
        (None, TypeError, "NoneType"),
        ([1], TypeError, "list"),
        (2**63, ValueError, "int64"),
        (1e39, ValueError, "float32"),
    ]:
        with pytest.raises(error, match=text):
            state.set_property("bad", value)
    with pytest.raises(KeyError, match="Property bad not found."):
        state.get_property("bad")


def test_nominal_state_names_work_and_data_access_raises() -> None:
    state = nominal_state()
    assert state.trainable_names() == ["w", "b"] and state.is_nominal
    assert all(p.grad is None for p in state.params.values())
    for access in (
        lambda: state.parameter("w"),
        state.tensors,
        state.state_dict,
        lambda: state.set_parameter_data("w", np.zeros(1, np.float32)),
    ):
        with pytest.raises(NominalStateError, match=NOMINAL_TEXT):
            access()
    with pytest.raises(KeyError, match="Parameter nope not found."):
        state.parameter("nope")


def test_complete_nominal() -> None:
    state = nominal_state()
    param = state.params["w"]
    values = {"w": torch.ones(2, 3), "b": np.zeros(2, np.float32), "frozen": torch.ones(1)}
    with pytest.raises(ParameterDataError, match=r"missing: \['frozen'\]"):
        state.complete_nominal({"w": values["w"], "b": values["b"]})
    with pytest.raises(ParameterDataError, match="Expected: float32, Got: float64"):
        state.complete_nominal({**values, "frozen": torch.ones(1, dtype=torch.float64)})
    state.complete_nominal(values)
    assert not state.is_nominal and state.params["w"] is param and param.shape == (2, 3)
    assert torch.equal(param.grad, torch.zeros(2, 3)) and state.params["frozen"].grad is None
    with pytest.raises(RuntimeError, match="needs a nominal state"):
        state.complete_nominal(values)


DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]
    ),
]


@pytest.mark.parametrize("device", DEVICES)
def test_to_device_keeps_the_same_objects(device: str, tmp_path: Path) -> None:
    state = small_state(optimizer=True)
    expected = state.to_bytes(True)
    param, grad = state.params["w"], state.params["w"].grad
    moment = state.optimizer.momentums["w"]["momentum0"]
    state.to(device)
    assert state.params["w"] is param and param.grad is grad
    assert state.optimizer.momentums["w"]["momentum0"] is moment
    tensors = [*state.params.values(), grad, moment]
    assert state.device.type == device and all(t.device.type == device for t in tensors)
    state.set_parameter_data("b", np.zeros(4, np.float32))  # host data into a device parameter
    state.save(tmp_path / "ckpt", include_optimizer_state=True)  # device tensors copied to host
    assert (tmp_path / "ckpt").read_bytes() == expected
    state.to("cpu")
    assert state.params["w"] is param and param.device.type == "cpu"


def test_safetensors_round_trip_in_place(tmp_path: Path) -> None:
    state = small_state()
    state.save_safetensors(tmp_path / "p.safetensors")
    other = small_state()
    param = other.params["w"]
    other.set_parameter_data("w", np.zeros((4, 3), np.float32))
    other.load_safetensors(tmp_path / "p.safetensors")
    assert other.params["w"] is param and torch.equal(param, state.params["w"])
    nominal = nominal_state()
    with pytest.raises(SafetensorsError, match=r"missing: \[\], unexpected: \['count'\]"):
        nominal.load_safetensors(tmp_path / "p.safetensors")


def test_safetensors_load_checks_everything_before_changing_anything(tmp_path: Path) -> None:
    from ort_torch_train.checkpoint.safetensors import save_safetensors

    state = small_state()
    bad = {**state.state_dict(), "b": torch.ones(4), "w": torch.ones(3, 3)}
    save_safetensors(bad, tmp_path / "bad.safetensors")
    with pytest.raises(ParameterDataError, match="shape mismatch"):
        state.load_safetensors(tmp_path / "bad.safetensors")
    assert torch.equal(state.params["b"], torch.zeros(4))


def test_nominal_state_completed_from_safetensors(tmp_path: Path) -> None:
    from ort_torch_train.checkpoint.safetensors import save_safetensors

    save_safetensors({"w": torch.ones(3), "b": torch.ones(1), "frozen": torch.ones(2)}, tmp_path / "p.safetensors")
    state = nominal_state()
    state.load_safetensors(tmp_path / "p.safetensors")
    assert not state.is_nominal and state.params["w"].tolist() == [1.0] * 3


def test_nominal_checkpoint_completed_equals_full_checkpoint(refcorpus: Path) -> None:
    arrays = np.load(refcorpus / "mlp" / "arrays.npz")
    state = TrainingState.load(refcorpus / "mlp" / "artifacts" / "nominal_checkpoint")
    state.complete_nominal({name: arrays[f"init__{name}"] for name in state.params})
    full = TrainingState.load(refcorpus / "mlp" / "artifacts" / "checkpoint")
    assert state.to_bytes() == full.to_bytes()


# ---- the ORT face ----------------------------------------------------------------------------------
def test_checkpoint_state_face(refcorpus: Path, tmp_path: Path) -> None:
    path = refcorpus / "mlp_frozen" / "final_checkpoint_no_optimizer"
    state = CheckpointState.load_checkpoint(path)
    assert isinstance(state.training_state, TrainingState) and state._state is state.training_state
    params = state.parameters
    assert isinstance(params, Parameters) and len(params) == 4 and "0.bias" in params
    pairs = list(params)
    assert [name for name, _ in pairs] == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert all(isinstance(p, Parameter) and p.name == n for n, p in pairs)
    assert repr(params) == "Parameters(['0.bias', '0.weight', '2.bias', '2.weight'])"
    with pytest.raises(KeyError, match="Parameter nope not found."):
        params["nope"]

    trainable, frozen = params["2.bias"], params["0.bias"]
    assert repr(trainable) == "Parameter(name=2.bias, requires_grad=True)"
    assert trainable.requires_grad and not frozen.requires_grad
    assert frozen.grad is None and np.array_equal(trainable.grad, np.zeros(5, np.float32))
    view = trainable.data
    view[0] = 42.0  # zero-copy view
    assert state.tensors()["2.bias"][0] == 42.0
    trainable.data = np.ones(5, np.float32)
    params["2.weight"] = np.zeros((5, 32), np.float32)
    assert view[0] == 1.0 and not state.state_dict()["2.weight"].any()
    with pytest.raises(ParameterDataError, match=r"Expected: \{5,32\}, Got: \{3,3\}"):
        params["2.weight"] = np.zeros((3, 3), np.float32)

    props = state.properties
    assert isinstance(props, Properties) and len(props) == 0
    props["b"], props["a"], props["c"] = 1, 2.5, "x"
    assert list(props) == [("a", 2.5), ("b", 1), ("c", "x")] and "a" in props
    assert repr(props) == "Properties(['a', 'b', 'c'])"
    with pytest.raises(KeyError, match="Property z not found."):
        props["z"]
    with pytest.raises(TypeError, match="NoneType"):
        props["z"] = None

    CheckpointState.save_checkpoint(state, tmp_path / "saved")
    again = CheckpointState.load_checkpoint((tmp_path / "saved").read_bytes())
    assert dict(again.properties) == {"a": 2.5, "b": 1, "c": "x"}
    assert np.array_equal(again.parameters["2.bias"].data, np.ones(5, np.float32))
    with pytest.raises(TypeError):
        CheckpointState.save_checkpoint(state.training_state, tmp_path / "x")
    state.save_safetensors(tmp_path / "p.safetensors")
    again.load_safetensors(tmp_path / "p.safetensors")


def test_checkpoint_state_face_on_a_nominal_state() -> None:
    state = CheckpointState(nominal_state())
    assert len(state.parameters) == 3 and "w" in state.parameters
    with pytest.raises(NominalStateError, match=NOMINAL_TEXT):
        state.parameters["w"]
    with pytest.raises(NominalStateError, match=NOMINAL_TEXT):
        list(state.parameters)
    with pytest.raises(TypeError, match="Invalid argument for CheckpointState"):
        CheckpointState("not a state")


def test_bfloat16_parameter_data_says_why() -> None:
    state = CheckpointState(TrainingState.from_record(CheckpointRecord({"h": torch.ones(2, dtype=torch.bfloat16)}, {})))
    with pytest.raises(TypeError, match="bfloat16"):
        state.parameters["h"].data
    assert state.tensors()["h"].dtype == torch.bfloat16


def test_optimizer_state_defaults() -> None:
    assert OptimizerState() == OptimizerState("group0", 0, 0.001, {})
