"""The rows of ``bench/experiments/first_compiled_step.py``: each row's tiny random-init torch model (the one
exported and the one plain torch.compile compiles), its dynamic inputs and its training batches."""

from __future__ import annotations

import os
from pathlib import Path

ROWS = ("mixtral", "olmoe", "qwen2-moe", "dinov2", "clip", "convnext", "vit", "t5", "llama", "lstm", "whisper")
MOE = {"mixtral": "mixtral", "olmoe": "olmoe", "qwen2-moe": "qwen2_moe"}  # row -> tiny_moe's kind
IMAGES = {"dinov2": 16, "clip": 16, "convnext": 32, "vit": 16}  # row -> image side (pixels)
DYNAMIC = {"t5": ("tokens",), "llama": ("ids", "mask"), "lstm": ("tokens",), "whisper": ("features", "ids")}
ISSUE_SHAPES = [(4, 16), (4, 16), (3, 16), (4, 9), (1, 23), (2, 16), (4, 31), (3, 7)]  # issue 57's batch x length
SHAPES = {"t5": ISSUE_SHAPES, "llama": [(2, 8), (2, 6), (3, 16)], "lstm": ISSUE_SHAPES, "whisper": ISSUE_SHAPES}
MELS, FRAMES = 4, 16  # whisper's input features: mel bins x frames (twice its encoder positions)


def input_names(row: str) -> tuple[str, ...]:
    """The names ROW's exported graph gives its inputs (its labels not included)."""
    return DYNAMIC.get(row, ("pixels",) if row in IMAGES else ("tokens",))


def model(row: str):
    """ROW's torch model, seeded."""
    import torch
    import transformers

    from tests.helpers.moe_models import Dinov2Logits, tiny_moe

    torch.manual_seed(0)
    if row in MOE:
        return tiny_moe(MOE[row], every_expert=row == "olmoe")
    if row == "dinov2":
        return Dinov2Logits()
    if row == "lstm":
        return _Tagger()
    if row == "vit":
        config = transformers.ViTConfig(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=16,
            patch_size=4, num_labels=3, attn_implementation="eager",
        )  # fmt: skip
        return _Logits(transformers.ViTForImageClassification(config), "pixel_values")
    if row == "clip":  # the vision tower with a classification head
        vision = transformers.CLIPVisionConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=16,
            patch_size=4, projection_dim=16,
        )  # fmt: skip
        config = transformers.CLIPConfig(vision_config=vision.to_dict(), num_labels=3, attn_implementation="eager")
        return _Logits(transformers.CLIPForImageClassification(config), "pixel_values")
    if row == "convnext":
        config = transformers.ConvNextConfig(
            num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, num_labels=3, image_size=32
        )
        return _Logits(transformers.ConvNextForImageClassification(config), "pixel_values")
    if row == "t5":
        config = transformers.T5Config(
            vocab_size=32, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2,
            dropout_rate=0.0, use_cache=False, decoder_start_token_id=0, pad_token_id=0,
        )  # fmt: skip
        return _Logits(transformers.T5ForConditionalGeneration(config), "t5")
    if row == "whisper":
        config = transformers.WhisperConfig(
            vocab_size=32, num_mel_bins=MELS, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_source_positions=FRAMES // 2,
            max_target_positions=64, dropout=0.0, use_cache=False, pad_token_id=0, decoder_start_token_id=1,
            attn_implementation="eager",
        )  # fmt: skip
        return _Logits(transformers.WhisperForConditionalGeneration(config), "whisper")
    if row == "llama":
        config = transformers.LlamaConfig(
            vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
            intermediate_size=32, max_position_embeddings=64, use_cache=False,
        )  # fmt: skip
        return _Logits(transformers.LlamaForCausalLM(config), "masked")
    raise SystemExit(f"unknown row {row!r}; expected one of {ROWS}")


def _Tagger():
    from torch import nn

    class Tagger(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.lstm, self.head = nn.Embedding(12, 4), nn.LSTM(4, 4, batch_first=True), nn.Linear(4, 3)

        def forward(self, tokens):
            return self.head(self.lstm(self.embed(tokens))[0].mean(1))

    return Tagger()


def _Logits(model, call: str):
    """A ``transformers`` model returning 2-D logits: per image, or per token flattened."""
    import torch
    from torch import nn

    class Logits(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs):
            if call == "pixel_values":
                return self.model(pixel_values=inputs[0]).logits
            if call == "t5":  # its own ids as decoder ids
                ones = torch.ones_like(inputs[0])
                out = self.model(input_ids=inputs[0], attention_mask=ones, decoder_input_ids=inputs[0])
                return out.logits.flatten(0, 1)
            if call == "whisper":
                return self.model(input_features=inputs[0], decoder_input_ids=inputs[1]).logits.flatten(0, 1)
            return self.model(input_ids=inputs[0], attention_mask=inputs[1]).logits.flatten(0, 1)

    return Logits()


def batches(row: str, directory: Path) -> list[tuple]:
    """ROW's training batches as numpy arrays: inputs, then labels (an MoE row's tokens from DIR/<row>)."""
    import numpy as np

    rng = np.random.default_rng(0)
    if row in IMAGES:
        side = IMAGES[row]
        return [(rng.standard_normal((2, 3, side, side), dtype=np.float32), rng.integers(0, 3, 2)) for _ in range(3)]
    if row in MOE:
        return [(b, rng.integers(0, 32, 16)) for b in np.load(directory / row / "tokens.npy")[:3]]
    shapes = SHAPES[row][: int(os.environ.get("STEPS", 8))]
    if row == "lstm":
        return [(rng.integers(0, 12, s), rng.integers(0, 3, s[0])) for s in shapes]
    if row == "t5":
        return [(rng.integers(0, 32, s), rng.integers(0, 32, s[0] * s[1])) for s in shapes]
    if row == "whisper":
        features = [rng.standard_normal((s[0], MELS, FRAMES), dtype=np.float32) for s in shapes]
        return [(f, rng.integers(0, 32, s), rng.integers(0, 32, s[0] * s[1])) for f, s in zip(features, shapes)]
    result = []
    for shape in shapes:  # llama: the first sequence's last token masked out
        ids, mask = rng.integers(0, 32, shape), np.ones(shape, dtype=np.int64)
        mask[0, -1] = 0
        result.append((ids, mask, rng.integers(0, 32, ids.size)))
    return result
