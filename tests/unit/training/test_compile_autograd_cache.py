"""A precompiled step's graphs are looked up in AOTAutograd's cache (in inductor's cache directory) by their
content: the same step compiled again, with no compile cache of this project's, skips AOTAutograd and
inductor and trains alike."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from ort_torch_train.api import Module, Optimizer
from tests.helpers.corpus import Case
from tests.helpers.paths import FIXTURES


def _train(case: Case) -> tuple[dict[str, int], list[torch.Tensor]]:
    """AOTAutograd's cache counts while a compiled module takes three steps; its losses and parameters."""
    counters["aot_autograd"].clear()
    module = Module(case.artifact("training_model.onnx"), case.load_state(), compile=True, compile_cache=False)
    optimizer = Optimizer(case.artifact("optimizer_model.onnx"), module)
    losses = [torch.as_tensor(module.step(optimizer, *case.train_inputs(step))) for step in range(3)]
    return dict(counters["aot_autograd"]), losses + [p.detach().clone() for p in module.parameters()]


@pytest.mark.compile
def test_a_step_compiled_again_loads_its_graphs_from_the_autograd_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    case = Case(FIXTURES / "mlp_ce_adamw_sched")
    first, trained = _train(case)
    assert first.get("autograd_cache_saved", 0) >= 1 and not first.get("autograd_cache_hit"), first
    again, trained_again = _train(case)
    assert again.get("autograd_cache_hit", 0) >= 1 and not again.get("autograd_cache_miss"), again
    for value, expected in zip(trained_again, trained, strict=True):
        torch.testing.assert_close(value, expected, rtol=0, atol=0)
