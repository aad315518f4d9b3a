"""generate_artifacts(lora=) and Module(lora=): what is trainable, frozen, stored, and the errors."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.artifacts import OptimType, generate_artifacts
from ort_torch_train.checkpoint.odtc import read_checkpoint
from ort_torch_train.errors import ModelError
from ort_torch_train.lora import LoraConfig, adapter_names, read_record
from ort_torch_train.lora.export import export_unmerged_model
from tests.helpers.artifacts_support import LOSSES
from tests.unit.lora.helpers import data, make_artifacts, mlp, trained


def test_adapters_are_the_trainable_parameters(tmp_path) -> None:
    make_artifacts(tmp_path, LoraConfig(r=3, alpha=6, targets=["all-linear"]))
    record = read_checkpoint(tmp_path / "checkpoint")
    assert sorted(record.trainable) == ["0.lora_A.weight", "0.lora_B.weight", "2.lora_A.weight", "2.lora_B.weight"]
    assert sorted(record.frozen) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert record.trainable["0.lora_A.weight"].shape == (8, 3)
    assert record.trainable["2.lora_B.weight"].shape == (3, 4) and not record.trainable["2.lora_B.weight"].any()
    bound = 1 / 8**0.5  # Kaiming-uniform(a=sqrt(5)) over fan_in = 8
    assert 0 < record.trainable["0.lora_A.weight"].abs().max() <= bound
    lora = read_record(onnx.load(tmp_path / "eval_model.onnx"))
    assert lora is not None and lora.scaling == 2.0 and [t.weight for t in lora.targets] == ["0.weight", "2.weight"]


def test_step_zero_is_the_base_model_and_only_adapters_move(tmp_path) -> None:
    make_artifacts(tmp_path, LoraConfig(r=2, targets=["*.weight"]))
    x, y = data()
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = Module(tmp_path / "training_model.onnx", state, tmp_path / "eval_model.onnx")
    loss = module.forward(torch.from_numpy(x), torch.from_numpy(y))
    expected = torch.nn.functional.cross_entropy(mlp()(torch.from_numpy(x)), torch.from_numpy(y))
    torch.testing.assert_close(loss, expected)
    module = trained(tmp_path)
    after = module.training_state.params
    base = dict(mlp().named_parameters())
    for name in ("0.weight", "0.bias", "2.weight", "2.bias"):
        assert torch.equal(after[name], base[name].detach()) and after[name].grad is None


def test_frozen_dtype_and_dropout_at_generation(tmp_path) -> None:
    make_artifacts(tmp_path, LoraConfig(r=2, dropout=0.1, targets=["all-linear"], frozen_dtype=torch.bfloat16))
    record = read_checkpoint(tmp_path / "checkpoint")
    assert {t.dtype for t in record.frozen.values()} == {torch.bfloat16}
    assert {t.dtype for t in record.trainable.values()} == {torch.float32}
    training = onnx.load(tmp_path / "training_model.onnx")
    assert [n.op_type for n in training.graph.node].count("Dropout") == 2
    module = trained(tmp_path, steps=3)
    module.eval()
    x, y = data()
    assert module(x, y) == pytest.approx(module(x, y))  # eval has no dropout


def test_module_lora_on_plain_artifacts_matches_generated_lora(tmp_path) -> None:
    make_artifacts(tmp_path / "plain", None)
    make_artifacts(tmp_path / "lora", LoraConfig(r=2, targets=["all-linear"], seed=5))
    late = trained(tmp_path / "plain", lora=LoraConfig(r=2, targets=["all-linear"], seed=5))
    early = trained(tmp_path / "lora")
    for name in early.trainable_parameter_names:
        torch.testing.assert_close(late.training_state.params[name], early.training_state.params[name])


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (LoraConfig(targets=["*q_proj*"]), "pattern '\\*q_proj\\*' matches no parameter"),
        (LoraConfig(targets=["0.*"]), "'0.bias' .* has shape \\[16\\]: expected a weight matrix"),
    ],
)
def test_bad_targets_are_named(tmp_path, config: LoraConfig, message: str) -> None:
    with pytest.raises(ModelError, match=message):
        make_artifacts(tmp_path, config)
    assert not (tmp_path / "checkpoint").exists()


def test_weight_used_elsewhere_is_refused(tmp_path) -> None:
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = torch.nn.Embedding(8, 8)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.embedding(tokens) @ self.embedding.weight.t()

    with pytest.raises(
        ModelError, match="'embedding.weight' .* is not used only as a MatMul/Gemm weight: it feeds Gather"
    ):
        generate_artifacts(
            Tied(),
            example_inputs=(torch.zeros(2, 3, dtype=torch.int64),),
            artifact_directory=tmp_path,
            lora=LoraConfig(targets=["embedding.weight"]),
        )


def test_module_lora_twice_is_refused(tmp_path) -> None:
    make_artifacts(tmp_path, LoraConfig(r=2, targets=["all-linear"]))
    with pytest.raises(ModelError, match="already carries LoRA adapters"):
        trained(tmp_path, steps=0, lora=LoraConfig(r=2))


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"r": 0}, "r: expected an integer rank > 0, got 0"),
        ({"r": -2}, "rank > 0, got -2"),
        ({"alpha": 0}, "alpha: expected a finite number > 0"),
        ({"dropout": 1.0}, "dropout: expected a probability in \\[0, 1\\)"),
        ({"targets": []}, "targets: expected non-empty name patterns"),
        ({"frozen_dtype": torch.int8}, "frozen_dtype: expected torch.bfloat16"),
    ],
)
def test_config_errors(arguments: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LoraConfig(**arguments)


def test_config_parse() -> None:
    config = LoraConfig.parse("r=8,alpha=16,targets=*q_proj*,*v_proj*,dropout=0.05,frozen_dtype=bf16")
    assert config == LoraConfig(
        r=8, alpha=16.0, dropout=0.05, targets=("*q_proj*", "*v_proj*"), frozen_dtype=torch.bfloat16
    )
    assert config.scaling == 2.0
    with pytest.raises(ValueError, match="unknown key 'rank'"):
        LoraConfig.parse("rank=8")
    with pytest.raises(ValueError, match="r='x' is not a valid number"):
        LoraConfig.parse("r=x")


def test_adapter_names_follow_onnxruntime_genai() -> None:
    assert adapter_names("model.layers.0.attn.q_proj.MatMul.weight") == (
        "model.layers.0.attn.q_proj.lora_A.MatMul.weight",
        "model.layers.0.attn.q_proj.lora_B.MatMul.weight",
    )
    assert adapter_names("h.0.attn.c_attn.weight") == ("h.0.attn.c_attn.lora_A.weight", "h.0.attn.c_attn.lora_B.weight")
    assert adapter_names("onnx::MatMul_7") == ("onnx::MatMul_7_lora_A", "onnx::MatMul_7_lora_B")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize(("loss", "optimizer"), [("mse", OptimType.SGD), ("l1", OptimType.AdamW), ("bce", None)])
def test_lora_from_an_onnx_file_with_other_losses_and_optimizers(tmp_path, loss: str, optimizer) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    torch.onnx.export(
        model, (torch.zeros(4, 8),), tmp_path / "base.onnx", input_names=["x"], output_names=["y"], dynamo=False
    )
    generate_artifacts(
        str(tmp_path / "base.onnx"),
        requires_grad=["0.bias", "2.bias"],
        loss=LOSSES[loss],
        optimizer=optimizer,
        artifact_directory=tmp_path / "artifacts",
        lora=LoraConfig(r=2, targets=["*.weight"]),
    )
    record = read_checkpoint(tmp_path / "artifacts" / "checkpoint")
    assert sorted(record.frozen) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert len(record.trainable) == 4
    if optimizer is not None:
        module = trained(tmp_path / "artifacts", steps=0)
        x = np.random.default_rng(0).standard_normal((4, 8), dtype=np.float32)
        target = (x[:, :1] > 0).astype(np.float32)
        first = float(module(x, target))
        optimizer_ = Optimizer(tmp_path / "artifacts" / "optimizer_model.onnx", module)
        optimizer_.set_learning_rate(0.05)
        for _ in range(5):
            module(x, target)
            optimizer_.step()
            module.lazy_reset_grad()
        assert float(module(x, target)) < first


def test_frozen_bfloat16_exports_merged_and_unmerged(tmp_path) -> None:
    make_artifacts(tmp_path, LoraConfig(r=2, targets=["all-linear"], frozen_dtype=torch.bfloat16))
    module = trained(tmp_path)
    module.export_model_for_inferencing(tmp_path / "merged.onnx", ["logits"])
    export_unmerged_model(module, tmp_path / "unmerged.onnx", ["logits"], adapter_defaults="trained")
    merged, unmerged = onnx.load(tmp_path / "merged.onnx"), onnx.load(tmp_path / "unmerged.onnx")
    assert {init.data_type for init in merged.graph.initializer} == {onnx.TensorProto.FLOAT}
    assert not [node for node in merged.graph.node if node.op_type == "Cast"]
    x, y = data(4)
    module.eval()
    evaluated = float(module(x, y))
    ort = pytest.importorskip("onnxruntime")
    for path in ("merged.onnx", "unmerged.onnx"):
        logits = ort.InferenceSession(str(tmp_path / path)).run(None, {"features": x})[0]
        loss = torch.nn.functional.cross_entropy(torch.from_numpy(logits), torch.from_numpy(y))
        assert float(loss) == pytest.approx(evaluated, abs=1e-5), path
    assert unmerged.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT


def test_module_lora_resumes_from_its_own_checkpoint(tmp_path) -> None:
    make_artifacts(tmp_path, None)
    config = LoraConfig(r=2, targets=["all-linear"], frozen_dtype=torch.bfloat16)
    module = trained(tmp_path, lora=config)
    CheckpointState.save_checkpoint(module.checkpoint_state, tmp_path / "lora_checkpoint", include_optimizer_state=True)
    saved = {name: param.detach().clone() for name, param in module.training_state.params.items()}
    state = CheckpointState.load_checkpoint(tmp_path / "lora_checkpoint")
    assert LoraConfig.from_json(str(state.properties["ort_torch_train.lora"])) == config
    resumed = Module(tmp_path / "training_model.onnx", state, tmp_path / "eval_model.onnx", lora=config)
    assert resumed.trainable_parameter_names == module.trainable_parameter_names
    for name, value in saved.items():
        assert torch.equal(resumed.training_state.params[name], value), name
    assert sorted(state.training_state.optimizer.momentums) == sorted(module.trainable_parameter_names)
    x, y = data()
    module.eval(), resumed.eval()
    assert float(resumed(x, y)) == float(module(x, y))
