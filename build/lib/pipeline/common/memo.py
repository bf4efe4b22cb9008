"""Per-object memos that die with their object (a model, a tokenizer, a trace): never keyed by id(), which
keeps the value alive forever and can hand it to a new object that reuses the address."""

from __future__ import annotations

import functools
import threading
import weakref


def per_object(fn):
    """Memoise fn(obj) in a weak-keyed dictionary: one value per live `obj`, freed when `obj` is."""
    memo: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    lock = threading.Lock()

    @functools.wraps(fn)
    def wrapper(obj):
        with lock:
            if obj in memo:
                return memo[obj]
        value = fn(obj)
        with lock:
            return memo.setdefault(obj, value)

    wrapper.memo = memo
    return wrapper


def give_back_freed_memory() -> None:
    """glibc's malloc_trim: return freed heap pages to the system (a no-op elsewhere). Freed tensors below glibc's
    (self-raising) mmap threshold stay in the heap otherwise: after a trace or a model is dropped, RSS would keep
    the high-water mark instead of saying what the process holds."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
