"""Mutational fuzz of the three input formats: ORT checkpoints, ONNX training models, safetensors.

Each input is a fixture file with random bytes set, bits flipped, 32-bit words replaced by edge
values, or ranges cut or duplicated. Every input must load or raise one of the project's exceptions
(ort_torch_train.errors); anything else is reported with the input that caused it.

    python tools/fuzz_inputs.py --count 20000     # split evenly over the three formats
"""

from __future__ import annotations

import argparse
import inspect
import random
import struct
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import ort_torch_train.errors as errors
from ort_torch_train.api import CheckpointState, Module
from ort_torch_train.checkpoint.odtc import read_checkpoint
from ort_torch_train.checkpoint.safetensors import load_safetensors, save_safetensors

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "mlp_ce_adamw_sched"
PROJECT_ERRORS = tuple(
    cls for _, cls in inspect.getmembers(errors, inspect.isclass) if cls.__module__ == errors.__name__
)
EDGE_WORDS = [0, 1, 3, 4, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 2**20, 2**16]


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One to three random mutations of data."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(5)
        position = rng.randrange(max(len(out), 1))
        if kind == 0:
            out[position] = rng.randrange(256)
        elif kind == 1:
            out[position] ^= 1 << rng.randrange(8)
        elif kind == 2 and len(out) >= 4:
            position = rng.randrange(len(out) // 4) * 4
            out[position : position + 4] = struct.pack("<I", rng.choice(EDGE_WORDS))
        elif kind == 3:
            del out[position : position + rng.randint(1, 64)]
        else:
            out[position:position] = out[position : position + rng.randint(1, 64)] * rng.randint(1, 4)
    return bytes(out)


def _checkpoint_target(directory: Path):
    return lambda data: read_checkpoint(data)


def _safetensors_target(directory: Path):
    path = directory / "fuzz.safetensors"

    def load(data: bytes) -> None:
        path.write_bytes(data)
        load_safetensors(path)

    return load


def _onnx_target(directory: Path):
    state = CheckpointState.load_checkpoint(FIXTURE / "artifacts" / "checkpoint")
    return lambda data: Module(data, state)


def seeds(directory: Path) -> dict[str, tuple[bytes, object]]:
    """Per format: the fixture bytes that get mutated, and the function that loads them."""
    state = CheckpointState.load_checkpoint(FIXTURE / "artifacts" / "checkpoint")
    safetensors = directory / "seed.safetensors"
    save_safetensors(dict(state.training_state.state_dict()), safetensors, metadata={"epoch": "1"})
    return {
        "checkpoint": ((FIXTURE / "final_checkpoint_with_optimizer").read_bytes(), _checkpoint_target(directory)),
        "safetensors": (safetensors.read_bytes(), _safetensors_target(directory)),
        "onnx": ((FIXTURE / "artifacts" / "training_model.onnx").read_bytes(), _onnx_target(directory)),
    }


def fuzz(count: int, seed: int = 0, formats: tuple[str, ...] = ("checkpoint", "safetensors", "onnx")) -> dict:
    """Run count inputs split over formats; returns outcome counts and the unexpected exceptions."""
    rng = random.Random(seed)
    outcomes: Counter = Counter()
    unexpected: list[tuple[str, str, bytes]] = []
    with tempfile.TemporaryDirectory() as tmp:
        targets = seeds(Path(tmp))
        for i in range(count):
            name = formats[i % len(formats)]
            data, load = targets[name]
            mutated = mutate(data, rng)
            try:
                load(mutated)
                outcomes[f"{name}: loaded"] += 1
            except PROJECT_ERRORS:
                outcomes[f"{name}: project error"] += 1
            except Exception as error:  # noqa: BLE001 - what the fuzz is looking for
                outcomes[f"{name}: {type(error).__name__}"] += 1
                unexpected.append((name, f"{type(error).__name__}: {error}"[:300], mutated))
    return {"outcomes": dict(outcomes), "unexpected": unexpected}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    start = time.perf_counter()
    result = fuzz(args.count, args.seed)
    print(f"{args.count} inputs in {time.perf_counter() - start:.0f} s")
    for outcome, number in sorted(result["outcomes"].items()):
        print(f"  {outcome}: {number}")
    for name, text in sorted({(name, text) for name, text, _ in result["unexpected"]})[:20]:
        print(f"  UNEXPECTED {name}: {text}")
    return 1 if result["unexpected"] else 0


if __name__ == "__main__":
    sys.exit(main())
