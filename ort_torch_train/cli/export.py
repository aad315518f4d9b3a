"""``ort-torch-train export``: the inference model of trained artifacts, and LoRA adapters for onnxruntime."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import onnx

from ort_torch_train.cli.common import CliError, load_trained_artifacts
from ort_torch_train.export.external_data import write_model
from ort_torch_train.export.outputs import exportable_output_names
from ort_torch_train.lora.apply import add_lora_to_artifacts
from ort_torch_train.lora.config import LORA_PROPERTY, LoraConfig
from ort_torch_train.lora.export import export_adapter, export_unmerged_model, merged_model_and_weights
from ort_torch_train.lora.genai import export_for_genai
from ort_torch_train.lora.record import read_record
from ort_torch_train.state.training_state import TrainingState


@dataclass
class ExportSource:
    """The eval model (with its adapters) and the parameters to export."""

    eval_model: onnx.ModelProto
    training_state: TrainingState


def lora_setting(text: str | None, state: TrainingState, training_model: onnx.ModelProto) -> LoraConfig | None:
    """The LoRA config to apply to ``training_model``: ``--lora``, else the one the checkpoint keeps
    (when the models carry no adapters of their own), else None."""
    if read_record(training_model) is not None:
        if text:
            raise CliError("--lora: these artifacts already carry LoRA adapters (generate_artifacts(lora=...))")
        return None
    if text:
        try:
            return LoraConfig.parse(text)
        except ValueError as error:
            raise CliError(str(error)) from None
    kept = state.properties.get(LORA_PROPERTY)
    return LoraConfig.from_json(kept) if isinstance(kept, str) else None


def run_export(args: argparse.Namespace) -> None:
    """Write the files asked for and name them on stdout."""
    if not (args.output or args.unmerged or args.adapter or args.genai):
        raise CliError("nothing to export: give --output, --unmerged, --adapter and/or --genai")
    training, evaluation, _, state = load_trained_artifacts(args.artifacts, args.checkpoint, "export")
    config = lora_setting(args.lora, state, training)
    if config is not None:
        _, adapted = add_lora_to_artifacts(training, evaluation, state, config)
        evaluation = adapted or evaluation
    exported = ExportSource(evaluation, state)
    outputs = [name for name in (args.outputs or "").split(",") if name] or default_outputs(evaluation, state)
    if (args.unmerged or args.adapter or args.genai) and read_record(evaluation) is None:
        raise CliError(
            "--unmerged/--adapter/--genai: the artifacts and checkpoint hold no LoRA adapters; give --lora r=...,targets=... "
            "or train with `ort-torch-train train --lora ...`"
        )
    if args.output:
        model, weights = merged_model_and_weights(evaluation, state.params, outputs)
        write_model(model, args.output, weights, external_data=args.external_data)
        print(f"inference model (outputs {', '.join(outputs)}): {args.output}")
    if args.unmerged:
        export_unmerged_model(exported, args.unmerged, outputs)
        print(f"unmerged LoRA model: {args.unmerged}")
    if args.adapter:
        export_adapter(exported, Path(args.adapter))
        print(f"LoRA adapter: {args.adapter}")
    if args.genai:
        built, folder = args.genai
        adapter = export_for_genai(exported, built, folder, args.adapter_name, args.accuracy_level)
        print(f"onnxruntime-genai folder: {folder} (adapter {adapter.name})")


def default_outputs(eval_model: onnx.ModelProto, state: TrainingState) -> list[str]:
    """The model's own outputs (before the loss), or the loss where none is known."""
    names = exportable_output_names(eval_model, state.params)
    loss = {value.name for value in eval_model.graph.output}
    return [name for name in names if name not in loss] or names
