"""Adasum (``distributed/adasum.py``) on 2 and 4 gloo ranks (tests/helpers/adasum_worker.py): the DDP hook's
combined gradients against a direct float64 implementation of the published formula on the same per-rank
gradients, training runs whose ranks stay identical, and a non-power-of-two world size refused on every rank."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ort_torch_train.distributed.adasum import check_gradient_combination
from ort_torch_train.training.options import EngineOptions
from tests.helpers import adasum_worker
from tests.helpers.dist_grouped_launch import grouped_launch
from tests.helpers.timeouts import scaled
from tests.integration.test_distributed import launch as launch_ranks
from tests.integration.test_distributed import require_success


def launch(scenario: str, out: Path, world_size: int, timeout: float) -> None:
    """Run the worker's ``scenario`` on ``world_size`` ranks; fail when one fails or is stuck past ``timeout``."""
    results = launch_ranks(scenario, out, timeout, worker_module=adasum_worker.__name__, world_size=world_size)
    require_success(results)


def launched(tmp_path_factory: pytest.TempPathFactory, scenario: str, world_size: int) -> Path:
    """The folder of the run's one launch of ``world_size`` ranks that ran the "hook" and "train" scenarios;
    the test fails when ``scenario`` failed."""

    def launch_group(scenarios: list[str], out: Path) -> list[subprocess.CompletedProcess]:
        return launch_ranks(
            ",".join(scenarios), out, scaled(360), worker_module=adasum_worker.__name__, world_size=world_size
        )

    group = grouped_launch(tmp_path_factory, f"adasum_{world_size}_ranks", ["hook", "train"], world_size, launch_group)
    return group.folder(scenario)


def adasum_reference(vectors: list[np.ndarray]) -> np.ndarray:
    """The published formula in float64, applied over ranks as a binary tree (neighbours first)."""
    level = [v.astype(np.float64).reshape(-1) for v in vectors]
    while len(level) > 1:
        combined = []
        for a, b in zip(level[::2], level[1::2]):
            dot, aa, bb = a @ b, a @ a, b @ b
            combined.append((1 - dot / (2 * aa) if aa else 1.0) * a + (1 - dot / (2 * bb) if bb else 1.0) * b)
        level = combined
    return level[0]


def test_the_reference_is_the_formula() -> None:
    a, b = np.array([1.0, 0.0]), np.array([0.0, 2.0])
    np.testing.assert_array_equal(adasum_reference([a, b]), a + b)  # orthogonal: summed
    np.testing.assert_array_equal(adasum_reference([a, a]), a)  # parallel and equal: averaged
    np.testing.assert_array_equal(adasum_reference([a, np.zeros(2)]), a)  # a zero side: the other


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 4])
def test_hook_combines_like_the_formula(tmp_path_factory: pytest.TempPathFactory, world_size: int) -> None:
    out = launched(tmp_path_factory, "hook", world_size)
    ranks = [dict(np.load(out / f"hook_rank{rank}.npz")) for rank in range(world_size)]
    names = [key.removeprefix("local/") for key in ranks[0] if key.startswith("local/")]
    assert {"odd_only", "dead", "body.0.weight"} <= set(names)
    for name in names:
        locals_ = [r[f"local/{name}"] for r in ranks]
        differ = not all(np.array_equal(locals_[0], other) for other in locals_[1:])
        assert differ == (name != "dead"), name  # ranks differ, except where every gradient is zero
        expected = adasum_reference(locals_).reshape(locals_[0].shape)
        for rank, result in enumerate(ranks):
            combined = result[f"combined/{name}"]
            assert combined.dtype == np.float32
            np.testing.assert_array_equal(combined, ranks[0][f"combined/{name}"])  # the same bits everywhere
            scale = np.abs(np.stack(locals_)).sum(axis=0)  # the terms' magnitude bounds the rounding
            assert np.all(np.abs(combined - expected) <= 1e-6 * scale + 1e-30), f"{name} on rank {rank}"
    np.testing.assert_array_equal(ranks[0]["combined/dead"], 0.0)


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 4])
def test_training_with_adasum_keeps_the_ranks_identical(
    tmp_path_factory: pytest.TempPathFactory, world_size: int
) -> None:
    out = launched(tmp_path_factory, "train", world_size)
    ranks = [dict(np.load(out / f"train_rank{rank}.npz")) for rank in range(world_size)]
    for key in ranks[0]:
        if "losses" in key:
            assert np.all(np.isfinite(ranks[0][key]))
            continue
        for result in ranks[1:]:
            np.testing.assert_array_equal(result[key], ranks[0][key], err_msg=key)
    assert not np.array_equal(ranks[0]["losses"][0], ranks[1]["losses"][0])  # each rank saw its own batch


@pytest.mark.distributed
def test_a_world_size_not_a_power_of_two_is_refused_on_every_rank(tmp_path: Path) -> None:
    launch("misuse", tmp_path, 3, timeout=scaled(120))
    for rank in range(3):
        errors = json.loads((tmp_path / f"misuse_rank{rank}.json").read_text())
        assert errors.keys() == {"module", "legacy"}, errors
        for message in errors.values():
            assert "power-of-two world size" in message and "got 3" in message and f"rank {rank}" in message


def test_the_option_is_checked_once() -> None:
    assert check_gradient_combination("adasum") == "adasum"
    with pytest.raises(ValueError, match=r"gradient_combination: expected one of \('average', 'adasum'\), got 'sum'"):
        check_gradient_combination("sum")
    with pytest.raises(ValueError, match="'adasum' needs distributed=True"):
        EngineOptions.of(gradient_combination="adasum")
