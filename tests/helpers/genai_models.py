"""Tiny random-init Llama, Qwen2, Phi-3 and tied-embedding (SmolLM-shaped Llama, Qwen2.5, Gemma2) models (examples/genai_lora.py's) built offline by
onnxruntime-genai's model builder.

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

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from genai_lora import write_hf_model  # noqa: E402  (the example's tiny model: one definition)


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
