"""Tiny random-init Llama, Qwen2 and Phi-3 models built offline by onnxruntime-genai's model builder.

``python tests/helpers/genai_models.py ROOT arch:precision ...`` writes ``ROOT/<arch>-<precision>/`` (the
builder's output: model.onnx, genai_config.json, tokenizer) for each, in one process. ``built_models``
does that once per test session across xdist workers (a file lock beside the workers' temp folders).
"""

from __future__ import annotations

import fcntl
import runpy
import subprocess
import sys
from pathlib import Path

SIZES = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=128,
)


def write_hf_model(arch: str, folder: Path) -> None:
    """A random-init HF model of ``arch`` (llama, qwen2, phi3) with a byte-level tokenizer, saved to ``folder``."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    classes = {"llama": "Llama", "qwen2": "Qwen2", "phi3": "Phi3"}[arch]
    config_class = getattr(transformers, f"{classes}Config")
    model_class = getattr(transformers, f"{classes}ForCausalLM")
    extra = {"original_max_position_embeddings": SIZES["max_position_embeddings"]} if arch == "phi3" else {}
    torch.manual_seed(0)
    config = config_class(**SIZES, **extra, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model_class(config).eval().save_pretrained(folder)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # 256 byte tokens, no merges
    tokenizer = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=alphabet[1], eos_token=alphabet[2]
    )
    fast.save_pretrained(folder)
    config_file = folder / "tokenizer_config.json"  # a class genai's tokenizer knows
    config_file.write_text(config_file.read_text().replace('"TokenizersBackend"', '"GPT2Tokenizer"'))


def build(arch: str, precision: str, root: Path) -> Path:
    """Build ``arch`` at ``precision`` (fp32, int4) for the CPU into ``root/<arch>-<precision>``."""
    source, output = root / f"hf-{arch}", root / f"{arch}-{precision}"
    if not (source / "config.json").is_file():
        write_hf_model(arch, source)
    argv = sys.argv
    sys.argv = [
        "builder",
        "-i",
        str(source),
        "-o",
        str(output),
        "-p",
        precision,
        "-e",
        "cpu",
        "-c",
        str(root / "cache"),
    ]
    try:
        runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__")
    finally:
        sys.argv = argv
    return output


def built_models(root: Path, wanted: list[str]) -> dict[str, Path]:
    """``{"arch-precision": folder}`` for each ``arch:precision`` in ``wanted``, built once under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        missing = [item for item in wanted if not (root / item.replace(":", "-") / "genai_config.json").is_file()]
        if missing:
            subprocess.run([sys.executable, __file__, str(root), *missing], check=True, capture_output=True)
    return {item.replace(":", "-"): root / item.replace(":", "-") for item in wanted}


if __name__ == "__main__":
    target = Path(sys.argv[1])
    for item in sys.argv[2:]:
        build(*item.split(":"), target)
