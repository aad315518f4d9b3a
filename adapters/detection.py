"""NonMaxSuppression in plain torch/Python (ONNX's greedy per-class selection; no torchvision needed)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .common import Inline, OperationConverterResult, attributes, result
from .registry import ConversionContext, register

if TYPE_CHECKING:
    from onnx2torch.onnx_graph import OnnxGraph
    from onnx2torch.onnx_node import OnnxNode


def _corners(box: list[float], center_point: bool) -> tuple[float, float, float, float]:
    """``(y_min, x_min, y_max, x_max)`` of a box given as corners (any order) or as a centre and size."""
    if center_point:
        x, y, width, height = box
        return y - height / 2, x - width / 2, y + height / 2, x + width / 2
    return min(box[0], box[2]), min(box[1], box[3]), max(box[0], box[2]), max(box[1], box[3])


def _overlaps(a: tuple, b: tuple, threshold: float) -> bool:
    """Whether the IoU of ``a`` and ``b`` exceeds ``threshold`` (empty boxes never suppress)."""
    height = min(a[2], b[2]) - max(a[0], b[0])
    width = min(a[3], b[3]) - max(a[1], b[1])
    if height <= 0 or width <= 0:
        return False
    intersection = height * width
    area_a, area_b = (a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1])
    union = area_a + area_b - intersection
    if area_a <= 0 or area_b <= 0 or union <= 0:
        return False
    return intersection / union > threshold


def non_max_suppression(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    max_per_class: torch.Tensor | None = None,
    iou_threshold: torch.Tensor | None = None,
    score_threshold: torch.Tensor | None = None,
    *,
    center_point: bool,
) -> torch.Tensor:
    """``[selected, 3]`` int64 rows ``(batch, class, box)``: per class, boxes by falling score (ties: lower
    index first), each kept unless it overlaps a kept one by more than ``iou_threshold``."""
    limit = max(int(max_per_class.reshape(-1)[0]), 0) if max_per_class is not None and max_per_class.numel() else 0
    iou = float(iou_threshold.reshape(-1)[0]) if iou_threshold is not None and iou_threshold.numel() else 0.0
    floor = float(score_threshold.reshape(-1)[0]) if score_threshold is not None and score_threshold.numel() else None
    selected = []
    all_boxes, all_scores = boxes.tolist(), scores.tolist()
    for batch, (batch_boxes, batch_scores) in enumerate(zip(all_boxes, all_scores)):
        corners = [_corners(box, center_point) for box in batch_boxes]
        for klass, class_scores in enumerate(batch_scores):
            order = sorted(
                (i for i, s in enumerate(class_scores) if floor is None or s > floor),
                key=lambda i: (-class_scores[i], i),
            )
            kept: list[int] = []
            for index in order:
                if len(kept) >= limit:
                    break
                if not any(_overlaps(corners[index], corners[other], iou) for other in kept):
                    kept.append(index)
                    selected.append((batch, klass, index))
    return torch.tensor(selected, dtype=torch.int64, device=boxes.device).reshape(-1, 3)


@register("NonMaxSuppression", since=10, data_dependent_shape=True)
def non_max_suppression_op(node: OnnxNode, graph: OnnxGraph, context: ConversionContext) -> OperationConverterResult:
    return result(Inline(non_max_suppression, center_point=bool(attributes(node).get("center_point_box", 0))), node)
