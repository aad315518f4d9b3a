"""What a user of the documented builder -> artifacts -> train -> export -> serve path need not know by heart:
LoRA on int4 artifacts made without frozen_params, the served int4 products' accuracy level, the adapter
file's mode, and the builder model's warnings."""

from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts
from ort_torch_train.cli.main import main as cli_main
from ort_torch_train.errors import ModelError
from ort_torch_train.lora import LoraConfig
from ort_torch_train.lora.export import export_adapter, read_adapter
from ort_torch_train.lora.genai import export_for_genai
from tests.integration.test_genai_lora import (
    builder_logits,
    genai_logits,
    lora_module,
    our_logits,
    train,
)

og = pytest.importorskip("onnxruntime_genai")

pytestmark = pytest.mark.slow
LEVEL0_TOLERANCE = 1e-5  # int4 served at accuracy_level 0: float products, as training computes them (4.8e-7 measured)


def plain_artifacts(model_dir: Path, artifacts: Path) -> None:
    """Artifacts as a user first writes them: the norms trainable, every weight matrix left a graph constant."""
    base = onnx.load(str(model_dir / "model.onnx"), load_external_data=False)
    norms = [init.name for init in base.graph.initializer if "layernorm" in init.name]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the builder's scalar-declared [1] constants draw no warning any more
        warnings.filterwarnings("ignore", message=".*opset 22")  # said once per process (ORT 1.19.2 cannot load it)
        generate_artifacts(
            str(model_dir / "model.onnx"),
            requires_grad=norms,
            additional_output_names=["logits"],
            loss=LossType.LanguageModelLoss,
            optimizer=OptimType.AdamW,
            artifact_directory=artifacts,
        )


def quantized_node_levels(path: Path) -> set[int]:
    model = onnx.load(str(path), load_external_data=False)
    return {
        onnx.helper.get_attribute_value(attribute)
        for node in model.graph.node
        if node.op_type == "MatMulNBits"
        for attribute in node.attribute
        if attribute.name == "accuracy_level"
    }


def test_int4_weights_left_as_constants_are_lora_targets_and_serve_at_accuracy_level_0(built, tmp_path):
    model_dir, artifacts = built["llama-int4"], tmp_path / "artifacts"
    plain_artifacts(model_dir, artifacts)
    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    config = LoraConfig(r=4, alpha=8, targets=["all-linear"])
    module = Module(artifacts / "training_model.onnx", state, artifacts / "eval_model.onnx", lora=config)
    # per layer r x (in + out) for qkv_proj (64 -> 128, packed: one target), o_proj (64 -> 64), gate/up (64 -> 128),
    # down (128 -> 64); two layers
    assert module.get_parameters_size(trainable_only=True) == 2 * 4 * ((64 + 128) * 4 + (64 + 64))
    optimizer = Optimizer(artifacts / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(1e-2)
    losses = train(module, optimizer, 20)
    assert losses[-1] < losses[0] - 0.3, losses
    ours = our_logits(module)

    previous = os.umask(0o022)
    try:
        adapter = export_for_genai(module, model_dir, tmp_path / "served", adapter_name="task", accuracy_level=0)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(adapter.stat().st_mode) == 0o644  # another account serving the folder reads it (not 0600)
    assert stat.S_IMODE(adapter.stat().st_mode) == stat.S_IMODE((tmp_path / "served" / "tokenizer.json").stat().st_mode)
    assert quantized_node_levels(model_dir / "model.onnx") == {4}  # the builder's default
    assert quantized_node_levels(tmp_path / "served" / "model.onnx") == {0}
    model = og.Model(str(tmp_path / "served"))
    adapters = og.Adapters(model)
    adapters.load(str(adapter), "task")
    served = genai_logits(model, adapters, "task")
    np.testing.assert_allclose(served, ours, atol=LEVEL0_TOLERANCE, rtol=0)

    CheckpointState.save_checkpoint(state, tmp_path / "trained")  # keeps the LoRA config: the CLI re-applies it
    args = ["export", str(artifacts), "--checkpoint", str(tmp_path / "trained"), "--genai", str(model_dir)]
    assert cli_main([*args, str(tmp_path / "cli"), "--adapter-name", "task", "--accuracy-level", "0"]) == 0
    assert quantized_node_levels(tmp_path / "cli" / "model.onnx") == {0}
    assert cli_main([*args, str(tmp_path / "default"), "--adapter-name", "task"]) == 0
    assert quantized_node_levels(tmp_path / "default" / "model.onnx") == {4}
    model = og.Model(str(tmp_path / "default"))
    adapters = og.Adapters(model)
    adapters.load(str(tmp_path / "default" / "task.onnx_adapter"), "task")
    gap = np.abs(genai_logits(model, adapters, "task") - ours).max()
    assert LEVEL0_TOLERANCE < gap < 2e-2, gap  # the builder's level 4 quantises the activations to int8
    with pytest.raises(ValueError, match="accuracy_level: expected one of"):
        export_for_genai(module, model_dir, tmp_path / "bad", accuracy_level=7)


def test_float_weights_left_as_constants_name_frozen_params_in_the_error(built, tmp_path):
    plain_artifacts(built["llama-fp32"], tmp_path)
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    with pytest.raises(ModelError, match="as constants, not checkpoint parameters.*frozen_params.*lora="):
        Module(tmp_path / "training_model.onnx", state, lora=LoraConfig(r=4, targets=["all-linear"]))


@pytest.mark.parametrize(
    "name, targets",
    [
        ("smollm-fp32", ["all-linear"]),  # a float tied weight is no target (docs/lora.md)
        ("smollm-int4", ["all-linear", "*lm_head*"]),
        ("qwen2.5-fp32", ["*q_proj*", "*v_proj*", "*o_proj*"]),  # q/v of the packed, biased qkv_proj
        ("qwen2.5-int4", ["*q_proj*", "*v_proj*", "*o_proj*", "*lm_head*"]),
    ],
)
def test_tied_default_build_trains_exports_and_serves_two_adapters_one_on_the_tied_head(built, tmp_path, name, targets):
    """The builder's default builds of a tied model (SmolLM, Qwen2.5, Llama 3.2): at int4 the embedding is a
    GatherBlockQuantized over the LM head's packed weight, at fp32 a Gather over its transpose; LoRA on the
    projections and, at int4, on the head itself; two adapters served in one genai model."""
    model_dir = built[name]
    built_model = onnx.load(str(model_dir / "model.onnx"), load_external_data=False)
    tied = tied_head_weight(built_model)
    module, optimizer, _ = lora_module(model_dir, tmp_path / "artifacts", targets)
    losses = train(module, optimizer, 20)
    assert losses[-1] < losses[0] - 0.3, losses
    first = our_logits(module)
    served = tmp_path / "served"  # float products: the exact trained numbers (level 4 drifts by 2e-2 here)
    adapter = export_for_genai(module, model_dir, served, adapter_name="a", accuracy_level=0)
    head = read_adapter(adapter).get("lm_head.lora_B.MatMul.weight")
    if "*lm_head*" in targets:
        assert head is not None and head.shape == (4, 256)
        assert np.abs(head).max() > 0  # the tied head's adapter trained
    else:
        assert head is None
    train(module, optimizer, 5)
    second = our_logits(module)
    export_adapter(module, served / "b.onnx_adapter")
    assert tied_head_weight(onnx.load(str(served / "model.onnx"), load_external_data=False)) == tied  # tie kept
    model = og.Model(str(served))
    adapters = og.Adapters(model)
    adapters.load(str(adapter), "a")
    adapters.load(str(served / "b.onnx_adapter"), "b")
    np.testing.assert_allclose(genai_logits(model, adapters, "a"), first, atol=LEVEL0_TOLERANCE, rtol=0)
    np.testing.assert_allclose(genai_logits(model, adapters, "b"), second, atol=LEVEL0_TOLERANCE, rtol=0)
    assert np.abs(first - second).max() > 1e-2  # the two adapters differ
    export_for_genai(module, model_dir, tmp_path / "default", adapter_name="b")  # the builder's accuracy level
    model = og.Model(str(tmp_path / "default"))
    np.testing.assert_array_equal(genai_logits(model), builder_logits(model_dir))  # none active: the builder's


def tied_head_weight(model: onnx.ModelProto) -> str:
    """The weight both the embedding lookup and the LM head read (the lookup reads its transpose at fp32, its
    reshape at int4)."""
    produced_by = {output: node for node in model.graph.node for output in node.output}
    lookups = ("Gather", "GatherBlockQuantized")
    (lookup,) = [node for node in model.graph.node if node.op_type in lookups and "/embed_tokens/" in node.name]
    table = lookup.input[0]
    while table in produced_by and produced_by[table].op_type in ("Transpose", "Reshape"):
        table = produced_by[table].input[0]
    assert any(table in node.input for node in model.graph.node if node.name.startswith("/lm_head/")), table
    return table


@pytest.mark.parametrize("name", ["gemma2-fp32", "gemma2-int4"])
def test_gemma2_sliding_window_and_softcaps_train_and_serve(built, tmp_path, name):
    """Gemma2 (tied, attention and logit soft-capping, sliding-window layers whose KV buffers are window-sized:
    GroupQueryAttention(sliding_window_cache=1), trained with an empty cache)."""
    model_dir = built[name]
    built_model = onnx.load(str(model_dir / "model.onnx"), load_external_data=False)
    assert any(
        attribute.name == "sliding_window_cache" for node in built_model.graph.node for attribute in node.attribute
    )
    module, optimizer, _ = lora_module(model_dir, tmp_path / "artifacts", ["*q_proj*", "*v_proj*", "*o_proj*"])
    losses = train(module, optimizer, 20)
    assert losses[-1] < losses[0] - 0.3, losses
    ours = our_logits(module)
    adapter = export_for_genai(module, model_dir, tmp_path / "served", adapter_name="a", accuracy_level=0)
    train(module, optimizer, 5)  # a second adapter for the same base
    second = our_logits(module)
    export_adapter(module, tmp_path / "served" / "b.onnx_adapter")
    model = og.Model(str(tmp_path / "served"))
    adapters = og.Adapters(model)
    adapters.load(str(adapter), "a")
    adapters.load(str(tmp_path / "served" / "b.onnx_adapter"), "b")
    np.testing.assert_allclose(genai_logits(model, adapters, "a"), ours, atol=LEVEL0_TOLERANCE, rtol=0)
    np.testing.assert_allclose(genai_logits(model, adapters, "b"), second, atol=LEVEL0_TOLERANCE, rtol=0)
    assert np.abs(ours - second).max() > 1e-2  # the two adapters differ
