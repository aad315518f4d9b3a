"""generate_artifacts against ORT's own artifacts for the same base models (refcorpus, tests/fixtures).

For each case: the eval and optimizer models must equal ORT's node for node (generated names
renumbered), the checkpoint must be ORT's byte for byte, and 20 training steps with our
Module/Optimizer on our artifacts must give ORT's recorded losses.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from ort_torch_train.artifacts import SGD, AdamW, ClipGradNorm, generate_artifacts
from ort_torch_train.artifacts.optimizers import build_optimizer_model
from ort_torch_train.checkpoint.odtc import read_checkpoint
from tests.helpers.artifacts_support import (
    batch,
    first_value,
    generate_arguments,
    graph_differences,
    input_keys,
    load_expected,
)

LOSS_ATOL = 1e-5


@pytest.fixture
def generated(corpus_case: Path, tmp_path: Path) -> Path:
    """Our artifacts for the case's base model, made with the arguments ORT was given."""
    generate_artifacts(
        str(corpus_case / "base_model.onnx"),
        artifact_directory=tmp_path,
        **generate_arguments(load_expected(corpus_case)),
    )
    return tmp_path


def test_eval_model_matches_ort(corpus_case: Path, generated: Path) -> None:
    ours = onnx.load(generated / "eval_model.onnx")
    theirs = onnx.load(corpus_case / "artifacts" / "eval_model.onnx")
    assert graph_differences(ours, theirs) == []


def test_optimizer_model_matches_ort(corpus_case: Path, generated: Path) -> None:
    ours = onnx.load(generated / "optimizer_model.onnx")
    theirs = onnx.load(corpus_case / "artifacts" / "optimizer_model.onnx")
    assert graph_differences(ours, theirs) == []
    assert ours.producer_name == theirs.producer_name and ours.graph.name == theirs.graph.name


def test_training_model_interface_matches_ort(corpus_case: Path, generated: Path) -> None:
    """Our training model has ORT's user inputs, parameter inputs and user outputs (no gradient graph)."""
    ours = onnx.load(generated / "training_model.onnx")
    theirs = onnx.load(corpus_case / "artifacts" / "training_model.onnx")
    ort_inputs = [
        v.name
        for v in theirs.graph.input
        if not v.name.endswith("_grad.accumulation.buffer") and v.name != "lazy_reset_grad"
    ]
    ort_outputs = [v.name for v in theirs.graph.output if not v.name.endswith("_grad.accumulation.out")]
    renumber = dict(zip(ort_outputs, [v.name for v in ours.graph.output]))  # loss names carry ORT's counter
    assert [v.name for v in ours.graph.input] == ort_inputs
    assert [renumber[name] for name in ort_outputs] == [v.name for v in ours.graph.output]
    assert not any(node.domain == "com.microsoft" for node in ours.graph.node)


@pytest.mark.parametrize("name", ["checkpoint", "nominal_checkpoint"])
def test_checkpoint_is_ort_s_byte_for_byte(corpus_case: Path, generated: Path, name: str) -> None:
    """Same parameters, order (initializer order), dtypes and values; then the very same bytes."""
    if not (corpus_case / "artifacts" / name).exists():
        pytest.skip(f"ORT made no {name} for this case")
    ours, theirs = read_checkpoint(generated / name), read_checkpoint(corpus_case / "artifacts" / name)
    assert ours.is_nominal == theirs.is_nominal == (name == "nominal_checkpoint")
    for group in ("trainable", "frozen"):
        mine, ort = getattr(ours, group), getattr(theirs, group)
        assert list(mine) == list(ort), group
        for param in ort:
            assert mine[param].dtype == ort[param].dtype and torch.equal(mine[param], ort[param]), param
    assert (generated / name).read_bytes() == (corpus_case / "artifacts" / name).read_bytes()


@pytest.mark.slow
def test_training_matches_ort_losses(corpus_case: Path, generated: Path) -> None:
    expected = load_expected(corpus_case)
    if "nondeterminism_note" in expected:
        pytest.skip("Dropout draws from ORT's RNG: its losses cannot be reproduced")
    from ort_torch_train.api.checkpoint_state import CheckpointState
    from ort_torch_train.api.module import Module
    from ort_torch_train.api.optimizer import Optimizer

    state = CheckpointState.load_checkpoint(str(generated / "checkpoint"))
    module = Module(str(generated / "training_model.onnx"), state, str(generated / "eval_model.onnx"))
    optimizer = Optimizer(str(generated / "optimizer_model.onnx"), module)
    data, keys, train = np.load(corpus_case / "data.npz"), input_keys(expected), expected["train"]
    losses = []
    for step, lr in enumerate(train["lr_before_each_step"]):
        optimizer.set_learning_rate(lr)
        module.train()
        losses.append(first_value(module(*batch(data, keys, "train", step))))
        optimizer.step()
        module.lazy_reset_grad()
    np.testing.assert_allclose(losses, train["losses"], rtol=0, atol=LOSS_ATOL)
    module.eval()
    eval_loss = first_value(module(*batch(data, keys, "eval")))
    np.testing.assert_allclose(eval_loss, train["eval_loss"], rtol=0, atol=LOSS_ATOL)


def test_optimizer_variants_match_onnxblock(corpus_case: Path) -> None:
    """Our AdamW/SGD/ClipGradNorm blocks build onnxblock's optimizer models (fixture mlp_optimizers)."""
    variants = load_expected(corpus_case).get("optimizer_variants")
    if not variants:
        pytest.skip("no optimizer variants recorded for this case")
    trainable = [numpy_helper.from_array(np.zeros((2, 2), np.float32), "w")]
    for name, variant in variants.items():
        built = variant["built_with"]
        clip = ClipGradNorm(built["clip_max_norm"]) if built["clip_max_norm"] is not None else None
        kind = built["block"].rsplit(".", 1)[-1]
        block = AdamW(clip_grad=clip, **built["kwargs"]) if kind == "AdamW" else SGD(clip_grad=clip, **built["kwargs"])
        model = build_optimizer_model(block, (trainable, []), 17, itertools.count(1))
        for node in model.graph.node:
            for attribute in node.attribute:
                if attribute.name in variant["attribute_edits"]:
                    attribute.i = int(variant["attribute_edits"][attribute.name])
        theirs = onnx.load(corpus_case / variant["file"])
        assert graph_differences(model, theirs) == [], name
