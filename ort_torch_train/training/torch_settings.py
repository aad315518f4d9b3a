"""The process-wide torch settings this package changes: every one is set here, and none at import.

- torch's intra-op thread count (``torch.set_num_threads``): the process's thread policy decides it
  (``threads.py``). torch keeps one count for the whole process, so a process has one policy.
- inductor's ``cpp.vec_isa_ok``: True where a compile cache holds a former process's vector-ISA probe
  that found every ISA this CPU reports working (``compile/cache_entries.py``), sparing the probe's
  builds (inductor's settings are the process's).

MKL's thread-local count (``blas_threads.py``) belongs to the calling thread and is restored after each
step; per-object options (the compile cache, torch.compile's arguments) live on the engine that uses them.
torch's global random seed is the caller's: ORT's ``set_seed`` (``session``) and the CLI's ``train``
(``--seed``) set it, the library's steps never do.
"""

from __future__ import annotations

import torch

from ort_torch_train.torch_internals import inductor_config


def set_intra_op_threads(count: int) -> None:
    """torch's intra-op thread count, for the whole process."""
    torch.set_num_threads(count)


def trust_vector_isas() -> None:
    """Let inductor skip its vector-ISA probe for the rest of the process."""
    inductor_config().cpp.vec_isa_ok = True
