"""Imported once by the rank fork server (``rank_processes.py``) before it forks any rank: OpenMP on one
thread, as the ranks run, read when torch loads it; then the package, and with it torch, onnx and
torch.distributed."""

import os

os.environ["OMP_NUM_THREADS"] = "1"

import ort_torch_train.api  # noqa: E402,F401
