"""One BLAS thread for steps whose matrix products are too small to share out.

torch's CPU build runs float32 products on MKL with every intra-op thread (torch turns MKL's own
sizing off), though small products run faster on one thread. ORT's rule: MLAS gives a product one
thread per 2^16 multiply-accumulates. So a CPU step whose products (``convert/matrix_products.py``)
average under 2^16 per thread that an extra thread would take over runs its BLAS calls on one thread,
through MKL's thread-local count (``MKL_Set_Num_Threads_Local``, restored after the step). Inductor's
loops, oneDNN and attention keep every thread. Without MKL (other CPUs' builds) nothing changes.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

SERIAL_MACS_PER_THREAD = 1 << 16
_UNCHANGED = contextlib.nullcontext()


def _mkl_thread_setter() -> Any:
    """MKL's ``MKL_Set_Num_Threads_Local`` inside torch's CPU library, or None."""
    if not torch.backends.mkl.is_available() or sys.platform != "linux":
        return None
    try:
        setter = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so")).MKL_Set_Num_Threads_Local
    except (OSError, AttributeError) as error:
        log.info("MKL's thread-local thread count is not reachable (%s); BLAS keeps torch's threads", error)
        return None
    setter.argtypes, setter.restype = [ctypes.c_int], ctypes.c_int
    return setter


_set_mkl_threads = _mkl_thread_setter()


def serial_pays(products: Sequence[int], threads: int) -> bool:
    """Whether products of these sizes (multiply-accumulates) run faster on one thread than on ``threads``:
    one thread saves a fixed cost per product, ``threads`` save a share ``1 - 1/threads`` of its work."""
    if threads < 2 or not products:
        return False
    return sum(products) * (1 - 1 / threads) < SERIAL_MACS_PER_THREAD * len(products)


class _OneBlasThread:
    """MKL's thread-local count at one inside, what it was before outside."""

    __slots__ = ("previous",)

    def __enter__(self) -> None:
        self.previous = _set_mkl_threads(1)

    def __exit__(self, *exception: object) -> None:
        _set_mkl_threads(self.previous)


def blas_threads_for(products: Sequence[int] | None, device: torch.device) -> contextlib.AbstractContextManager:
    """One BLAS thread inside when a graph running matrix products of these sizes (None: not all known)
    is better served so on ``device`` at the current thread count; else a context that changes nothing."""
    if device.type != "cpu":
        return _UNCHANGED
    if _set_mkl_threads is None:
        return _UNCHANGED
    if products is None or not serial_pays(products, torch.get_num_threads()):
        return _UNCHANGED
    return _OneBlasThread()
