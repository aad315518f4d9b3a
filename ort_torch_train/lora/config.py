"""``LoraConfig``: which weight matrices get low-rank adapters, of what rank and scale."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

LORA_PROPERTY = "ort_torch_train.lora"  # the checkpoint property holding the config of Module(lora=)
ALL_LINEAR = "all-linear"
# the names frozen_dtype may be given as -> the torch dtype's name (torch is imported only for a config that sets one)
FROZEN_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16"}


@dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters next to the targeted weight matrices, as PEFT's ``LoraConfig`` defines them.

    Fields:
        r: the adapters' rank (> 0).
        alpha: the scale numerator: the adapter's product is multiplied by ``alpha / r``.
        dropout: dropout probability on the adapter's input in the training graph (0: none).
        targets: fnmatch patterns over the weight (initializer / parameter) names, e.g. ``"*q_proj*"``,
            or ``"all-linear"``: every weight only used as a MatMul/Gemm matrix, except the output
            layer (a name containing ``lm_head``), as PEFT's "all-linear" does.
        frozen_dtype: hold the frozen parameters in this dtype (``torch.bfloat16``/``torch.float16``),
            cast back to their graph type where they are used; None keeps them as they are.
        seed: seeds the Kaiming-uniform initialisation of the A matrices (B starts at zero).

    Examples:
        ```python
        from ort_torch_train.api import CheckpointState, Module, Optimizer
        from ort_torch_train.lora import LoraConfig

        state = CheckpointState.load_checkpoint("artifacts/checkpoint")  # the README Quick start's artifacts
        lora = LoraConfig(r=4, alpha=8, targets=["all-linear"])  # or LoraConfig.parse("r=4,alpha=8,targets=all-linear")
        module = Module("artifacts/training_model.onnx", state, "artifacts/eval_model.onnx", lora=lora)
        optimizer = Optimizer("artifacts/optimizer_model.onnx", module)  # updates the adapters only
        ```
    """

    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = field(default=(ALL_LINEAR,))
    frozen_dtype: torch.dtype | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r <= 0:
            raise ValueError(f"LoraConfig.r: expected an integer rank > 0, got {self.r!r}")
        alpha = self.alpha
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < math.inf:
            raise ValueError(f"LoraConfig.alpha: expected a finite number > 0, got {alpha!r}")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise ValueError(f"LoraConfig.dropout: expected a probability in [0, 1), got {self.dropout!r}")
        targets = self.targets
        if isinstance(targets, str):
            targets = (targets,)
        if not isinstance(targets, Sequence) or not targets or not all(isinstance(t, str) and t for t in targets):
            raise ValueError(
                f"LoraConfig.targets: expected non-empty name patterns or 'all-linear', got {self.targets!r}"
            )
        object.__setattr__(self, "targets", tuple(targets))
        dtype = self.frozen_dtype
        if dtype is None:
            return
        import torch

        if isinstance(dtype, str):
            if dtype not in FROZEN_DTYPES:
                raise ValueError(f"LoraConfig.frozen_dtype: expected one of {sorted(FROZEN_DTYPES)}, got {dtype!r}")
            object.__setattr__(self, "frozen_dtype", getattr(torch, FROZEN_DTYPES[dtype]))
        elif dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"LoraConfig.frozen_dtype: expected torch.bfloat16, torch.float16 or None, got {dtype!r}")

    @property
    def scaling(self) -> float:
        """The factor on the adapter's product: alpha / r."""
        return float(self.alpha) / self.r

    def to_json(self) -> str:
        """The config as JSON (kept in a checkpoint's properties so that later runs re-apply it)."""
        dtype = None if self.frozen_dtype is None else str(self.frozen_dtype).removeprefix("torch.")
        return json.dumps(
            {"r": self.r, "alpha": self.alpha, "dropout": self.dropout, "targets": list(self.targets),
             "frozen_dtype": dtype, "seed": self.seed}
        )  # fmt: skip

    @classmethod
    def from_json(cls, text: str) -> LoraConfig:
        """The config written by ``to_json``."""
        data = json.loads(text)
        return cls(**{**data, "targets": tuple(data["targets"])})

    @classmethod
    def from_peft(cls, directory: str | os.PathLike, seed: int = 0) -> LoraConfig:
        """The config of a PEFT LoRA adapter folder (its ``adapter_config.json``): rank, alpha, dropout,
        and PEFT's ``target_modules`` (module names or paths) as patterns over the weights' names.
        Load the adapter's weights after building the Module with ``lora.peft.load_peft_weights``."""
        path = Path(directory) / "adapter_config.json"
        if not path.is_file():
            raise FileNotFoundError(f"not a PEFT adapter folder: {os.fspath(path)!r} not found")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as error:
            raise ValueError(f"{os.fspath(path)!r} is not readable JSON ({error})") from error
        if not isinstance(data, dict):
            raise ValueError(f"{os.fspath(path)!r}: expected a JSON object, got {type(data).__name__}")
        if data.get("peft_type", "LORA") != "LORA":
            raise ValueError(f"{os.fspath(path)!r}: a {data.get('peft_type')} adapter, expected LORA")
        unsupported = [key for key in ("use_dora", "use_rslora") if data.get(key)]
        unsupported += [key for key in ("rank_pattern", "alpha_pattern", "modules_to_save") if data.get(key)]
        if data.get("bias", "none") != "none":
            unsupported.append(f"bias={data['bias']!r}")
        if unsupported:
            raise ValueError(f"{os.fspath(path)!r}: {', '.join(unsupported)} have no counterpart here")
        modules = data.get("target_modules")
        if isinstance(modules, str):
            targets: tuple[str, ...] = (ALL_LINEAR,) if modules == "all-linear" else ()
            if not targets:
                raise ValueError(
                    f"{os.fspath(path)!r}: target_modules as a regular expression ({modules!r}) is not supported; list the modules"
                )
        elif isinstance(modules, list) and modules and all(isinstance(name, str) and name for name in modules):
            # PEFT's name `q_proj` or path `model.layers.0.q_proj` ends a module path: its weight's name ends
            # with it (a wider match than PEFT's would leave PEFT tensors unmatched: load_peft_weights says so)
            targets = tuple(f"*{name}.weight" for name in modules)
        else:
            raise ValueError(f"{os.fspath(path)!r}: target_modules: expected module names, got {modules!r}")
        rank = data.get("r")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0:
            raise ValueError(f"{os.fspath(path)!r}: r: expected an integer rank > 0, got {rank!r}")
        numbers = {"lora_alpha": data.get("lora_alpha", 8), "lora_dropout": data.get("lora_dropout", 0.0)}
        for key, value in numbers.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{os.fspath(path)!r}: {key}: expected a finite number, got {value!r}")
        try:
            alpha, dropout = float(numbers["lora_alpha"]), float(numbers["lora_dropout"])
            return cls(r=rank, alpha=alpha, dropout=dropout, targets=targets, seed=seed)
        except ValueError as error:
            raise ValueError(f"{os.fspath(path)!r}: {error}") from None

    @classmethod
    def parse(cls, text: str) -> LoraConfig:
        """A config from ``"r=8,alpha=16,dropout=0.05,targets=*q_proj*,*v_proj*,frozen_dtype=bf16,seed=0"``.

        Items after ``targets=`` without an ``=`` are further target patterns.
        """
        values: dict[str, object] = {}
        targets: list[str] = []
        key = None
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            if "=" not in item:
                if key != "targets":
                    raise ValueError(f"--lora: expected key=value items, got {item!r} in {text!r}")
                targets.append(item)
                continue
            key, value = (side.strip() for side in item.split("=", 1))
            try:
                if key == "targets":
                    targets.append(value)
                elif key in ("r", "seed"):
                    values[key] = int(value)
                elif key in ("alpha", "dropout"):
                    values[key] = float(value)
                elif key == "frozen_dtype":
                    values[key] = value
                else:
                    raise ValueError(
                        f"--lora: unknown key {key!r} in {text!r}; expected r, alpha, dropout, targets, frozen_dtype, seed"
                    )
            except ValueError as error:
                if "unknown key" in str(error):
                    raise
                raise ValueError(f"--lora: {key}={value!r} is not a valid number") from None
        if targets:
            values["targets"] = tuple(targets)
        return cls(**values)  # type: ignore[arg-type]
