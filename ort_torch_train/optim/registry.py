"""The optimizer algorithms an optimizer model may name, by the (domain, op type) of its node.

ORT's two (``AdamWOptimizer``, ``SGDOptimizerV2``) are listed here; ``register`` adds another
algorithm's record (``optim/algorithm.py``) for this process.
"""

from __future__ import annotations

from ort_torch_train.optim.adamw_record import ADAMW_ALGORITHM
from ort_torch_train.optim.algorithm import OptimizerAlgorithm
from ort_torch_train.optim.sgd_record import SGD_ALGORITHM

_ALGORITHMS: dict[tuple[str, str], OptimizerAlgorithm] = {
    (algorithm.domain, algorithm.op_type): algorithm for algorithm in (ADAMW_ALGORITHM, SGD_ALGORITHM)
}


def find_algorithm(domain: str, op_type: str) -> OptimizerAlgorithm | None:
    """The algorithm of an optimizer node of this domain and op type; None for no registered one."""
    return _ALGORITHMS.get((domain, op_type))


def algorithms() -> tuple[OptimizerAlgorithm, ...]:
    """Every registered algorithm, ORT's first."""
    return tuple(_ALGORITHMS.values())


def register(algorithm: OptimizerAlgorithm) -> None:
    """Let optimizer models name ``algorithm``; ValueError when its (domain, op type) is taken."""
    key = (algorithm.domain, algorithm.op_type)
    if key in _ALGORITHMS:
        raise ValueError(f"register: an optimizer algorithm for {key[0]}::{key[1]} is registered already")
    _ALGORITHMS[key] = algorithm


def unregister(algorithm: OptimizerAlgorithm) -> None:
    """Undo ``register(algorithm)``; ValueError when that record is not the registered one."""
    key = (algorithm.domain, algorithm.op_type)
    if _ALGORITHMS.get(key) is not algorithm:
        raise ValueError(f"unregister: {algorithm!r} is not registered")
    del _ALGORITHMS[key]
