"""What one LoRA training step on a genai_qlora.py model holds at its peak: the CPU tensors made in the step
and alive at once, by the op that made them and their shape (a TorchDispatchMode; the step after the
first, which converts the graph).

    python bench/experiments/genai_qlora_tensors.py bench/.cache/genai_qlora --precision int4 [--batch 1] [--tokens 128] [--top 20]

A tensor is counted once per storage; a view of an op's input is not counted.
"""

from __future__ import annotations

import argparse
import collections
import json
import weakref
from pathlib import Path

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ort_torch_train.api import CheckpointState, Module, Optimizer, set_threads


class LiveTensors(TorchDispatchMode):
    """The CPU tensors made under it and alive together at the moment their total bytes peaked."""

    def __init__(self) -> None:
        super().__init__()
        self.made: dict[int, tuple[weakref.ref, str, tuple[int, ...], int]] = {}
        self.peak = 0
        self.at_peak: list[tuple[str, tuple[int, ...], int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        read = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for tensor in result if isinstance(result, (tuple, list)) else [result]:
            if isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu":
                if tensor.untyped_storage().data_ptr() in read:
                    continue  # a view of an input (or the input itself, written in place): nothing new
                storage = tensor.untyped_storage()
                entry = (weakref.ref(tensor), str(func), tuple(tensor.shape), storage.nbytes())
                self.made.setdefault(storage.data_ptr(), entry)
        self.made = {key: entry for key, entry in self.made.items() if _alive(entry[0], key)}
        total = sum(entry[3] for entry in self.made.values())
        if total > self.peak:
            self.peak, self.at_peak = total, [entry[1:] for entry in self.made.values()]
        return result


def _alive(ref: weakref.ref, key: int) -> bool:
    tensor = ref()
    return tensor is not None and tensor.untyped_storage().data_ptr() == key


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--precision", choices=("fp32", "int4"), required=True)
    parser.add_argument("--artifacts", choices=("plain", "frozen"), default="plain")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    set_threads(2)
    artifacts = args.directory / f"artifacts-{args.precision}-{args.artifacts}"
    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    module = Module(artifacts / "training_model.onnx", state)
    optimizer = Optimizer(artifacts / "optimizer_model.onnx", module)
    vocab = json.loads((args.directory / "shape.json").read_text())["vocab"]
    ids = np.random.default_rng(0).integers(3, vocab, (args.batch, args.tokens), dtype=np.int64)
    module.step(optimizer, ids, np.ones_like(ids), ids)  # converts the graph
    with LiveTensors() as live:
        module.step(optimizer, ids, np.ones_like(ids), ids)
    print(f"peak of the tensors made in the step: {live.peak / 2**20:.1f} MiB")
    groups: collections.Counter[tuple[str, tuple[int, ...]]] = collections.Counter()
    for op, shape, nbytes in live.at_peak:
        groups[(op, shape)] += nbytes
    for (op, shape), nbytes in groups.most_common(args.top):
        print(f"{nbytes / 2**20:8.1f} MiB  {op}  {shape}")


if __name__ == "__main__":
    main()
