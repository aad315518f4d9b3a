"""bench/harness/run.py --quick end to end: the table and the result files have their shape (no speed asserted)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT
from tests.helpers.scripts import load_script
from tests.helpers.timeouts import scaled


@pytest.mark.slow
def test_quick_benchmark_writes_table_and_results(tmp_path: Path) -> None:
    out, cache = tmp_path / "results", tmp_path / "cache"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "harness" / "run.py"),
            "--quick",
            "--models",
            "mlp",
            "--no-ort",
            "--threads",
            "1",
            "--steps",
            "3",
            "--out",
            str(out),
            "--cache",
            str(cache),
        ],
        capture_output=True,
        text=True,
        timeout=scaled(180),
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr

    assert "model  config" in proc.stdout
    for label in ("ours eager (a)", "torch eager (c)", "ORT 1.19.2 (d)"):
        assert label in proc.stdout
    [json_path] = out.glob("*.json")
    [md_path] = out.glob("*.md")
    assert str(json_path) in proc.stdout

    report = json.loads(json_path.read_text())
    assert {"date", "command", "machine", "settings", "models", "results", "notes"} <= set(report)
    assert {"cpu", "cores", "torch", "load_average_1_5_15"} <= set(report["machine"])
    assert report["settings"]["threads"] == 1
    by_config = {entry["config"]: entry for entry in report["results"]}
    assert set(by_config) == {"ours", "torch", "ort"}
    assert by_config["ort"]["error"] == "--no-ort given"
    for config in ("ours", "torch"):
        entry = by_config[config]
        assert entry["error"] is None and entry["model"] == "mlp"
        assert entry["steps_timed"] == 3
        assert set(entry["median_s"]) == {"step", "forward+backward", "optimizer", "reset grad"}
        assert all(seconds > 0 for seconds in entry["median_s"].values())
        assert entry["peak_memory_mb"] > 0 and len(entry["round_medians_s"]) == 1
    # same weights, data and step count: the losses agree
    assert abs(by_config["ours"]["last_loss"] - by_config["torch"]["last_loss"]) < 1e-3

    table = md_path.read_text()
    assert "| model | config | step | steps/s | vs torch | vs torch compiled | vs ORT |" in table
    assert "| mlp | ours eager (a) |" in table and "| mlp | ORT 1.19.2 (d) | n/a |" in table


@pytest.mark.slow
def test_mixed_precision_benchmark_names_the_attention_kernels(tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "harness" / "run.py"),
            "--quick",
            "--models",
            "gpt32",
            "--no-ort",
            "--threads",
            "1",
            "--steps",
            "2",
            "--mixed-precision",
            "bf16",
            "--configs",
            "ours",
            "torch",
            "--out",
            str(out),
            "--cache",
            str(tmp_path / "cache"),
        ],
        capture_output=True,
        text=True,
        timeout=scaled(300),
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr

    [json_path] = out.glob("*.json")
    report = json.loads(json_path.read_text())
    assert report["settings"]["mixed_precision"] == "bf16"
    by_config = {entry["config"]: entry for entry in report["results"]}
    assert "float32 only" in by_config["ort"]["error"]
    for config in ("ours", "torch"):  # eager SDPA on CPU: the CPU flash-attention kernel, forward and backward
        kernels = by_config[config]["attention_kernels"]
        assert {
            "aten::_scaled_dot_product_flash_attention_for_cpu",
            "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
        } <= set(kernels), kernels
        assert not any("Backward" in name or name.startswith("autograd::") for name in kernels)
        assert f"gpt32 / {config}: attention ran as aten::" in proc.stdout
    assert abs(by_config["ours"]["last_loss"] - by_config["torch"]["last_loss"]) < 0.05
    assert "bf16; torch" in next(out.glob("*.md")).read_text()


@pytest.mark.slow
def test_eager_floor_counts_nodes_and_prints_each_model(tmp_path: Path) -> None:
    import torch

    autograd_nodes = load_script(ROOT / "bench" / "experiments" / "eager_floor.py").autograd_nodes

    a, b = torch.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)
    assert autograd_nodes((a * b).sum()) == 4  # SumBackward0, MulBackward0, two AccumulateGrad
    assert autograd_nodes((a * a).sum()) == 3  # a leaf reached twice is one node

    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "experiments" / "eager_floor.py"),
            "--models",
            "mlp",
            "--no-ort",
            "--threads",
            "1",
            "--blocks",
            "1",
            "--rounds",
            "1",
            "--steps",
            "3",
            "--warmup",
            "1",
            "--cache",
            str(tmp_path / "cache"),
        ],
        capture_output=True,
        text=True,
        timeout=scaled(180),
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ORT not timed: --no-ort given" in proc.stdout
    [row] = [line.split() for line in proc.stdout.splitlines() if line.startswith("mlp ")]
    step, untracked, forward, backward = map(float, row[1:5])
    forward_ops, backward_ops, nodes = int(row[5]), int(row[7]), int(row[9])
    tracked_op, node, backward_call = float(row[10]), float(row[12]), float(row[14])
    assert min(step, untracked, forward) > 0
    # the unit costs are differences of timed medians: one block on a busy machine may put one below zero
    assert all(math.isfinite(cost) for cost in (tracked_op, node, backward_call))
    assert forward_ops > 0 and backward_ops > 0 and nodes > forward_ops // 2
    floor = forward_ops * tracked_op + nodes * node + backward_call
    assert abs(float(row[15]) - floor) <= 1 and row[16:] == ["-", "-", "-"]
