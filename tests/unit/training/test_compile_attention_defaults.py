"""compile=True's CPU post-grad passes (``settings.cpu_post_grad_passes``, what ``for_device`` puts in the inductor
options) on the tinyformer's train step with its batch dynamic: the attention calls become products and sums, no
reshape merges the batch with the heads, and the step's loss and gradients hold to float32 rounding at batches of
8, 1 and 11 rows."""

from __future__ import annotations

import torch

from ort_torch_train.training.compile.settings import cpu_post_grad_passes, for_device
from tests.helpers.exported_steps import exported_train_step
from tests.unit.passes.test_attention_loops import CASE, FLASH, _batches, _merged_head_axes, _run


def test_the_cpu_defaults_rewrite_the_tinyformers_attention_and_results_hold() -> None:
    passes = for_device({}, torch.device("cpu"))["options"]["post_grad_custom_post_pass"]
    assert passes is cpu_post_grad_passes()  # one instance: compiled steps' keys compare it
    program, state, _ = exported_train_step(CASE)
    batches = _batches()
    before = [_run(program, state, batch) for batch in batches]
    assert sum(node.target in FLASH for node in program.graph.nodes) == 2
    assert _merged_head_axes(program)

    passes(program.graph_module.graph)
    program.graph_module.recompile()
    assert not any(node.target in FLASH for node in program.graph.nodes)
    assert _merged_head_axes(program) == []

    for batch, expected in zip(batches, before, strict=True):
        got = _run(program, state, batch)
        assert len(got) == len(expected) and expected[0].item() > 0  # a real loss
        for value, want in zip(got, expected, strict=True):
            torch.testing.assert_close(value, want, rtol=0, atol=1e-6)
