"""The results table and its JSON/Markdown files, with the machine they were measured on."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path

import torch
from model_artifacts import ORT_PYTHON
from orchestrate import ConfigResult, Settings
from timing import format_duration, render_table, spread

LABELS = {
    "ours": "ours eager (a)",
    "ours-compile": "ours compile (b)",
    "ours-step": "ours one-graph step (e)",
    "ours-step-py": "ours one-graph step, Python wrapper (g)",
    "ours-step-graphs": "ours one-graph step, CUDA graphs (h)",
    "ours-step-dynamic": "ours one-graph step, dynamic axes (i)",
    "torch": "torch eager (c)",
    "torch-compile": "torch compiled (f)",
    "ort": "ORT 1.19.2 (d)",
}
HEADERS = [
    "model",
    "config",
    "step",
    "steps/s",
    "vs torch",
    "vs torch compiled",
    "vs ORT",
    "fwd+bwd",
    "fwd+bwd vs torch",
    "optimizer",
    "peak MB",
    "spread",
]


def run_header(command: str, settings: Settings, models: dict, torch_inputs: bool) -> dict:
    """The result file's header for ``models`` (name -> BenchModel), printed as one line."""
    header = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": command,
        "machine": machine_info(settings.device),
        "settings": {
            "threads": settings.threads,
            "device": settings.device,
            "rounds": settings.rounds,
            "torch_inputs": torch_inputs,
            "mixed_precision": settings.precision,
            "steps_per_round": {n: settings.steps_for(m) for n, m in models.items()},
            "warmup": {n: settings.warmup_for(m) for n, m in models.items()},
        },
        "models": {n: m.describe() for n, m in models.items()},
        "memory": "torch.cuda.max_memory_allocated"
        if settings.device.startswith("cuda")
        else "peak RSS of the configuration's process",
    }
    machine = header["machine"]
    print(
        f"{machine['cpu']}, {machine['cores']} cores, load {machine['load_average_1_5_15']}, "
        f"{settings.threads} threads, device {settings.device}, {settings.precision or 'float32'}",
        flush=True,
    )
    return header


def machine_info(device: str) -> dict:
    """CPU model, cores, load, versions (and the GPU on CUDA)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "load_average_1_5_15": list(os.getloadavg()),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "onnxruntime_training": ort_training_version(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def ort_training_version() -> str | None:
    """onnxruntime's version in the ORT venv, or None without one."""
    if not ORT_PYTHON.exists():
        return None
    proc = subprocess.run(
        [str(ORT_PYTHON), "-c", "import onnxruntime; print(onnxruntime.__version__)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.stdout.strip() or None


def _rate(step: float) -> str:
    return f"{1 / step:.0f}" if step < 0.01 else f"{1 / step:.1f}"


def _duration(seconds: float | None) -> str:
    return "-" if seconds is None else format_duration(seconds)  # a one-phase step has no fwd+bwd/optimizer


def _ratio(value: float | None, reference: float | None) -> str:
    return f"{value / reference:.2f}x" if value and reference else "-"


def table_rows(results: list[ConfigResult]) -> list[list[str]]:
    """One row per configuration; ratios against the same model's torch eager and ORT (lower = faster)."""
    by_key = {(r.model, r.config): r for r in results}
    rows = []
    for result in results:
        torch_result, ort_result = by_key.get((result.model, "torch")), by_key.get((result.model, "ort"))
        compiled_result = by_key.get((result.model, "torch-compile"))
        step = result.median()
        if step is None or result.error:
            rows.append([result.model, LABELS[result.config], "n/a"] + ["-"] * (len(HEADERS) - 3))
            continue
        forward_backward = result.median("forward+backward")
        rows.append(
            [
                result.model,
                LABELS[result.config],
                format_duration(step),
                _rate(step),
                _ratio(step, torch_result and torch_result.median()),
                _ratio(step, compiled_result and compiled_result.median()),
                _ratio(step, ort_result and ort_result.median()),
                _duration(forward_backward),
                _ratio(forward_backward, torch_result and torch_result.median("forward+backward")),
                _duration(result.median("optimizer")),
                f"{result.peak_memory_mb:.0f}" if result.peak_memory_mb is not None else "-",
                f"{spread(result.round_medians) * 100:.0f}%",
            ]
        )
    return rows


def to_json(results: list[ConfigResult], header: dict) -> dict:
    """Everything measured: medians, per-round medians, memory, final loss, errors."""
    entries = [
        {
            "model": r.model,
            "config": r.config,
            "label": LABELS[r.config],
            "error": r.error,
            "median_s": {phase: r.median(phase) for phase in r.times},
            "steps_timed": len(r.times.get("step", [])),
            "round_medians_s": r.round_medians,
            "peak_memory_mb": r.peak_memory_mb,
            "last_loss": r.last_loss,
            "setup_s": r.setup_s,
            "load_s": r.load_s,
            "first_step_s": r.first_step_s,
            "rss_after_load_mb": r.rss_after_load_mb,
            "attention_kernels": r.attention_kernels,
        }
        for r in results
    ]
    return {**header, "results": entries}


def markdown(results: list[ConfigResult], header: dict, notes: list[str]) -> str:
    """The README-ready table with what, where and how it was measured."""
    machine = header["machine"]
    lines = [
        f"Measured {header['date']} on {machine['cpu']} ({machine['cores']} cores; load average 1/5/15 min "
        f"{_loads(machine['load_average_1_5_15'])} at the start, {_loads(machine['load_average_at_end'])} at the end), "
        f"{header['settings']['threads']} threads, device {header['settings']['device']}"
        f"{'' if 'gpu' not in machine else ' (' + machine['gpu'] + ')'}, "
        f"{header['settings'].get('mixed_precision') or 'float32'}; torch {machine['torch']}, "
        f"onnxruntime-training {machine['onnxruntime_training'] or 'not installed'}.",
        f"Command: `{header['command']}`",
        "",
        render_table(HEADERS, table_rows(results), left=2, markdown=True),
        "",
        "step: median of per-step times (forward+backward, optimizer step, gradient reset); ratios: lower is "
        "faster; spread: (max - min) / median of the per-round medians; peak MB: " + header["memory"] + ".",
    ]
    lines += [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def _loads(values: list[float]) -> str:
    return " / ".join(f"{v:.2f}" for v in values)


def write_results(out_dir: Path, results: list[ConfigResult], header: dict, notes: list[str]) -> tuple[Path, Path]:
    """bench/results/<date>-<device>.json and .md; returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = time.strftime("%Y%m%d-%H%M%S") + "-" + header["settings"]["device"].replace(":", "")
    json_path, md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    json_path.write_text(json.dumps({**to_json(results, header), "notes": notes}, indent=2) + "\n")
    md_path.write_text(markdown(results, header, notes))
    return json_path, md_path
