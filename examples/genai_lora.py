"""LoRA fine-tuning of a model onnxruntime-genai serves: build, train, export, serve.

A tiny Llama (random weights, a byte-level tokenizer) is built offline by onnxruntime-genai's model
builder, in int4 (MatMulNBits) or fp32. LoRA adapters are trained on the built ONNX graph itself
(``generate_artifacts(lora=...)`` with the language-model loss) to continue a short text; the packed int4
weights stay frozen and packed. ``export_for_genai`` writes a folder genai serves: the unmerged model,
the builder's config and tokenizer, and the adapter. genai then generates with and without the adapter.

    python examples/genai_lora.py [--precision int4|fp32] [--steps 150] [--out runs/genai_lora] [--built DIR]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnxruntime_genai as og

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts
from ort_torch_train.lora import LoraConfig
from ort_torch_train.lora.genai import export_for_genai

TEXT = "onnx runtime trains on torch. "
PROMPT = "onnx "
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
    """A random-init transformers model of ``arch`` (llama, qwen2, phi3; smollm, qwen2.5 and gemma2: a Llama, a
    Qwen2 and a Gemma2 whose embedding and LM head are tied) and a byte-level tokenizer in ``folder``."""
    import torch
    import transformers

    names = {
        "llama": "Llama",
        "smollm": "Llama",
        "qwen2": "Qwen2",
        "qwen2.5": "Qwen2",
        "phi3": "Phi3",
        "gemma2": "Gemma2",
    }
    prefix = names[arch]
    extra = {"original_max_position_embeddings": SIZES["max_position_embeddings"]} if arch == "phi3" else {}
    extra |= {"tie_word_embeddings": arch in ("smollm", "qwen2.5", "gemma2")}
    if arch == "gemma2":  # a window genai's 32-token tests reach, softcapped attention and logits (Gemma2's defaults)
        extra |= {"head_dim": SIZES["hidden_size"] // SIZES["num_attention_heads"], "sliding_window": 16}
    config = getattr(transformers, f"{prefix}Config")(**SIZES, **extra, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    getattr(transformers, f"{prefix}ForCausalLM")(config).eval().save_pretrained(folder)
    write_byte_tokenizer(folder)


def write_byte_tokenizer(folder: Path) -> None:
    """A byte-level BPE tokenizer without merges (256 tokens) that the builder copies and genai loads."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # one token per byte, no merges
    tokenizer = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=alphabet[1], eos_token=alphabet[2]
    )
    fast.save_pretrained(folder)
    settings = folder / "tokenizer_config.json"  # a tokenizer class genai knows
    settings.write_text(settings.read_text().replace('"TokenizersBackend"', '"GPT2Tokenizer"'))


def build(source: Path, output: Path, precision: str) -> None:
    """onnxruntime-genai's model builder, for the CPU."""
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(source), "-o", str(output)]
    command += ["-p", precision, "-e", "cpu", "-c", str(output.parent / "builder-cache")]
    subprocess.run(command, check=True, capture_output=True)


def generate(model: og.Model, tokenizer: og.Tokenizer, adapters: og.Adapters | None, length: int) -> str:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=length, min_length=length, do_sample=False)
    generator = og.Generator(model, params)
    if adapters is not None:
        generator.set_active_adapter(adapters, "text")
    generator.append_tokens(tokenizer.encode(PROMPT))
    while not generator.is_done():
        generator.generate_next_token()
    return tokenizer.decode(generator.get_sequence(0))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", choices=["int4", "fp32"], default="int4")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=1e-2)
    parser.add_argument("--out", type=Path, default=Path("runs/genai_lora"))
    parser.add_argument("--built", type=Path, help="a model builder's output to train (default: build the tiny Llama)")
    args = parser.parse_args(argv)
    shutil.rmtree(args.out, ignore_errors=True)
    source, built, artifacts, served = (args.out / name for name in ("hf", "built", "artifacts", "served"))
    if args.built is not None:
        built = args.built
    else:
        write_hf_model("llama", source)
        build(source, built, args.precision)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # opset 22: onnxruntime-training 1.19.2 could not load these models
        generate_artifacts(
            str(built / "model.onnx"),
            loss=LossType.LanguageModelLoss,  # cross-entropy of each next token, labels = input_ids
            optimizer=OptimType.AdamW,
            artifact_directory=artifacts,
            lora=LoraConfig(r=args.rank, alpha=2 * args.rank, targets=["all-linear"]),
        )
    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    module = Module(artifacts / "training_model.onnx", state, artifacts / "eval_model.onnx")
    optimizer = Optimizer(artifacts / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(args.learning_rate)
    tokenizer = og.Tokenizer(og.Model(str(built)))
    ids = np.asarray(tokenizer.encode(TEXT * 4), dtype=np.int64)[None]
    mask = np.ones_like(ids)
    losses = [float(module.step(optimizer, ids, mask, ids)) for _ in range(args.steps)]  # no past: empty KV cache
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} in {args.steps} steps")

    adapter = export_for_genai(module, built, served, adapter_name="text")
    model = og.Model(str(served))
    adapters = og.Adapters(model)
    adapters.load(str(adapter), "text")
    length = len(tokenizer.encode(PROMPT)) + len(TEXT)
    summary = {
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "without_adapter": generate(model, tokenizer, None, length),
        "with_adapter": generate(model, tokenizer, adapters, length),
        "served": sorted(path.name for path in served.iterdir()),
    }
    print(f"without the adapter: {summary['without_adapter']!r}")
    print(f"with the adapter:    {summary['with_adapter']!r}")
    return summary


if __name__ == "__main__":
    main()
