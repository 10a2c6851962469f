"""Returning the host memory that freed tensors leave in glibc's heaps to the operating system.

On CPU every tensor lives in the C heap. glibc keeps what tensors free for later allocations, and the phases of a
training step allocate very differently (a rollout: many small key/value tensors growing token by token; a forward
pass: the activations and the LM head's chunks; a backward pass: the gradients), so what one phase freed often does
not fit the next and stays resident on top of it. ``ACPOTrainer`` on CPU calls :func:`release_freed_memory` after
each rollout, between each forward and backward pass, and after each micro-step: on the offline demo this lowers the
peak resident memory by about 0.35 GB (README, "The demo's time and memory"). ``malloc_trim(0)`` costs a few
milliseconds (8 ms to return 0.6 GB here); it is a no-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None


def release_freed_memory() -> bool:
    """Ask glibc to return the free memory of its heaps to the operating system; False where it cannot."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
