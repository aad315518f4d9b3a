"""LoRA on onnxruntime-genai builder models (tiny, random init, built offline in a session fixture): train,
export with ``export_for_genai``, serve with genai; its logits match this project's eval."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts
from ort_torch_train.cli.main import main as cli_main
from ort_torch_train.lora import LoraConfig
from ort_torch_train.lora.export import export_adapter, read_adapter
from ort_torch_train.lora.genai import export_for_genai

og = pytest.importorskip("onnxruntime_genai")
ort = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.slow
FP32_TOLERANCE = 1e-4
INT4_LEVEL4_TOLERANCE = 2e-2  # onnxruntime's CPU MatMulNBits quantises activations at accuracy_level 4 (docs/lora.md)
IDS = np.random.default_rng(0).integers(3, 256, (2, 16)).astype(np.int64)
PROMPT = IDS[:1, :8]


def lora_module(model_dir: Path, artifacts: Path, targets: list[str]) -> tuple[Module, Optimizer, CheckpointState]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # opset 22 (ORT 1.19.2 cannot load it); the builder's [1] constant
        generate_artifacts(
            str(model_dir / "model.onnx"),
            loss=LossType.LanguageModelLoss,
            optimizer=OptimType.AdamW,
            additional_output_names=["logits"],
            artifact_directory=artifacts,
            lora=LoraConfig(r=4, alpha=8, targets=targets),
        )
    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    module = Module(artifacts / "training_model.onnx", state, artifacts / "eval_model.onnx")
    optimizer = Optimizer(artifacts / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(1e-2)
    return module, optimizer, state


def train(module: Module, optimizer: Optimizer, steps: int) -> list[float]:
    module.train()
    return [float(module.step(optimizer, IDS, np.ones_like(IDS), IDS)[0]) for _ in range(steps)]


def our_logits(module: Module) -> np.ndarray:
    module.eval()
    return module(PROMPT, np.ones_like(PROMPT), PROMPT)[1]


def genai_logits(model, adapters=None, name: str | None = None) -> np.ndarray:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=32)
    generator = og.Generator(model, params)
    if name is not None:
        generator.set_active_adapter(adapters, name)
    generator.append_tokens(PROMPT)
    return np.array(generator.get_output("logits"))


def builder_logits(model_dir: Path, filename: str = "model.onnx") -> np.ndarray:
    session = ort.InferenceSession(str(model_dir / filename), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": PROMPT, "attention_mask": np.ones_like(PROMPT)}
    for value in session.get_inputs():
        if value.name.startswith("past_key_values"):
            feeds[value.name] = np.zeros((1, value.shape[1], 0, 16), np.float32)
    return session.run(["logits"], feeds)[0]


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_llama_adapters_train_and_serve_in_genai(built, tmp_path, precision):
    model_dir = built[f"llama-{precision}"]
    module, optimizer, state = lora_module(model_dir, tmp_path / "artifacts", ["all-linear"])
    losses = train(module, optimizer, 20)
    assert losses[-1] < losses[0] - 0.3, losses
    first = our_logits(module)
    served = tmp_path / "served"
    adapter_a = export_for_genai(module, model_dir, served, adapter_name="a")
    assert sorted(p.name for p in served.iterdir()) == [
        "a.onnx_adapter",
        "genai_config.json",
        "model.onnx",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    train(module, optimizer, 5)  # a second adapter for the same base
    second = our_logits(module)
    export_adapter(module, served / "b.onnx_adapter")

    model = og.Model(str(served))
    adapters = og.Adapters(model)
    adapters.load(str(adapter_a), "a")
    adapters.load(str(served / "b.onnx_adapter"), "b")
    tolerance = FP32_TOLERANCE if precision == "fp32" else INT4_LEVEL4_TOLERANCE
    np.testing.assert_allclose(genai_logits(model, adapters, "a"), first, atol=tolerance, rtol=0)
    np.testing.assert_allclose(genai_logits(model, adapters, "b"), second, atol=tolerance, rtol=0)
    assert np.abs(first - second).max() > 10 * tolerance  # the two adapters differ
    base = genai_logits(model)
    np.testing.assert_array_equal(base, builder_logits(model_dir))  # no adapter active: the builder's model
    assert np.abs(base - first).max() > 10 * tolerance
    if precision == "fp32":  # the command line writes the same folder from a saved checkpoint
        CheckpointState.save_checkpoint(state, tmp_path / "trained")
        args = ["export", str(tmp_path / "artifacts"), "--checkpoint", str(tmp_path / "trained")]
        assert cli_main([*args, "--genai", str(model_dir), str(tmp_path / "cli"), "--adapter-name", "b"]) == 0
        model = og.Model(str(tmp_path / "cli"))
        adapters = og.Adapters(model)
        adapters.load(str(tmp_path / "cli" / "b.onnx_adapter"), "b")
        np.testing.assert_allclose(genai_logits(model, adapters, "b"), second, atol=tolerance, rtol=0)


@pytest.mark.parametrize("name", ["qwen2-fp32", "qwen2-int4", "phi3-fp32", "phi3-int4"])
def test_qwen2_and_phi3_adapters_train_export_and_generate(built, tmp_path, name):
    """Qwen2 and Phi-3 at fp32 and int4: two adapters on one base, each matching our eval, the base unchanged
    with none active, generation with one. Layer 0's adapters are checked for training: the builder (0.18) wires the
    tiny Phi-3's lm_head to layer 0's post-attention norm, so its layer 1 reaches only the present key/values and
    gets no gradient."""
    model_dir = built[name]
    module, optimizer, _ = lora_module(model_dir, tmp_path / "artifacts", ["*q_proj*", "*v_proj*", "*o_proj*"])
    losses = train(module, optimizer, 20)
    assert losses[-1] < losses[0], losses
    ours = our_logits(module)
    adapter = export_for_genai(module, model_dir, tmp_path / "served")
    tensors = read_adapter(adapter)  # per-projection adapters of the packed qkv_proj, as PEFT names them
    assert tensors["model.layers.0.attn.q_proj.lora_B.MatMul.weight"].shape == (4, 4 * 16)  # 4 heads of 16
    assert tensors["model.layers.0.attn.v_proj.lora_B.MatMul.weight"].shape == (4, 2 * 16)  # 2 KV heads
    assert np.abs(tensors["model.layers.0.attn.q_proj.lora_B.MatMul.weight"]).max() > 0  # trained (see the note below)
    assert not any("k_proj" in name or "qkv_proj" in name for name in tensors)
    train(module, optimizer, 5)  # a second adapter for the same base
    second = our_logits(module)
    export_adapter(module, tmp_path / "served" / "second.onnx_adapter")
    model = og.Model(str(tmp_path / "served"))
    adapters = og.Adapters(model)
    adapters.load(str(adapter), "trained")
    adapters.load(str(tmp_path / "served" / "second.onnx_adapter"), "second")
    tolerance = FP32_TOLERANCE if name.endswith("fp32") else INT4_LEVEL4_TOLERANCE
    np.testing.assert_allclose(genai_logits(model, adapters, "trained"), ours, atol=tolerance, rtol=0)
    np.testing.assert_allclose(genai_logits(model, adapters, "second"), second, atol=tolerance, rtol=0)
    assert np.abs(ours - second).max() > 10 * tolerance  # the two adapters differ
    np.testing.assert_array_equal(genai_logits(model), builder_logits(model_dir))  # no adapter: the base's outputs
    if name.endswith("fp32"):  # merged into the packed float weight's q and v columns
        module.export_model_for_inferencing(str(tmp_path / "merged.onnx"), ["logits"])
        np.testing.assert_allclose(builder_logits(tmp_path, "merged.onnx"), second, atol=FP32_TOLERANCE, rtol=0)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=14)
    generator = og.Generator(model, params)
    generator.set_active_adapter(adapters, "trained")
    generator.append_tokens(PROMPT)
    while not generator.is_done():
        generator.generate_next_token()
    assert len(generator.get_sequence(0)) == 14


@pytest.mark.compile
def test_int4_compiled_and_bf16_losses_match_eager(built, tmp_path):
    """GroupQueryAttention, MatMulNBits (its autograd Function) and the norms under torch.compile and bf16 autocast."""
    module, optimizer, _ = lora_module(built["llama-int4"], tmp_path / "artifacts", ["all-linear"])
    eager = train(module, optimizer, 2)
    for options in ({"mixed_precision": "bf16"}, {"compile": True}):
        state = CheckpointState.load_checkpoint(tmp_path / "artifacts" / "checkpoint")
        other = Module(tmp_path / "artifacts" / "training_model.onnx", state, **options)
        other_optimizer = Optimizer(tmp_path / "artifacts" / "optimizer_model.onnx", other)
        other_optimizer.set_learning_rate(1e-2)
        np.testing.assert_allclose(train(other, other_optimizer, 2), eager, atol=1e-3, rtol=0, err_msg=str(options))
