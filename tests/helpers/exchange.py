"""``renameat2(RENAME_EXCHANGE)``: two names swap their files in one step (Linux 3.15+, glibc 2.28+)."""

from __future__ import annotations

import ctypes
import os

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _libc_renameat2() -> object | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_renameat2 = _libc_renameat2()


def exchange(a: str, b: str) -> None:
    """Swap the files named ``a`` and ``b`` atomically.

    Raises:
        OSError: the call failed (ENOSYS or EINVAL where the kernel or the file system cannot).
    """
    if _renameat2 is None:
        raise OSError(38, "renameat2 is not in this C library")
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:  # type: ignore[operator]
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), a)


def exchange_works(directory: str) -> bool:
    """Whether ``directory``'s file system swaps names (probed with two empty files)."""
    a, b = os.path.join(directory, ".xa"), os.path.join(directory, ".xb")
    try:
        for p in (a, b):
            with open(p, "wb"):
                pass
        exchange(a, b)
        return True
    except OSError:
        return False
    finally:
        for p in (a, b):
            try:
                os.unlink(p)
            except OSError:
                pass
