"""Returning the host memory that freed tensors leave in glibc's heaps to the operating system.

On CPU every tensor lives in the C heap. glibc keeps what tensors free for later allocations, and the phases of a
training step allocate very differently (a rollout: many small key/value tensors growing token by token; a forward
pass: the activations and the LM head's chunks; a backward pass: the gradients), so what one phase freed often does
not fit the next and stays resident on top of it. ``ACPOTrainer`` on CPU calls :func:`release_freed_memory` after
each rollout, between each forward and backward pass, and after each micro-step: on the offline demo this lowers the
peak resident memory by about 0.35 GB. ``malloc_trim(0)`` costs a few milliseconds (8 ms to return 0.6 GB here).

Within a phase, glibc gives a block its own mapping, returned to the OS when freed, only above its mmap threshold,
which rises as large blocks are freed (up to 32 MB): most tensors of a step then come from the heap and what they
free stays resident. ``acpo-train`` on CPU fixes the threshold at :data:`MMAP_THRESHOLD` (``cap_mmap_threshold``;
``low_memory: false`` leaves it):
the demo's peak resident memory went from 3.60 to 3.38 GB for 35 s more system time (+18 s wall on 2 cores; README,
"The demo's time and memory"). Both are no-ops where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

MMAP_THRESHOLD = 512 * 1024  # bytes; 1 MB left the demo at 3.49 GB, 256 KB gave 3.38 GB for 5 s more
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)


@functools.lru_cache(maxsize=1)
def _glibc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        return libc if libc is not None and hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:  # not glibc (musl, macOS): nothing to do
        return None


def release_freed_memory() -> bool:
    """Ask glibc to return the free memory of its heaps to the operating system; False where it cannot."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def cap_mmap_threshold(nbytes: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``nbytes`` for the rest of the process (blocks at least that large get their
    own mapping, returned to the OS when freed); False where it cannot."""
    libc = _glibc()
    return libc is not None and bool(libc.mallopt(_M_MMAP_THRESHOLD, nbytes))
