"""The start-up check of the state directory: exists, is a directory, readable, writable."""

from __future__ import annotations

import os
import secrets

from persist.errors import StateDirError

__all__ = ["check_setup", "PROBE_PREFIX"]

#: Name prefix of the probe file written (and deleted) to prove the directory is writable.
PROBE_PREFIX = ".smoosh-probe-"


def check_setup(state_dir: str | os.PathLike[str]) -> None:
    """Check that checkpoints can be kept in ``state_dir``, by trying it.

    The directory must exist, be a directory, be listable, and accept a new file: a probe
    file is created exclusively, written, fsynced, and deleted. Testing with real
    operations (not ``os.access``) gives the true answer under root, ACLs, read-only
    mounts and full disks alike.

    Parameters
    ----------
    state_dir:
        The directory.

    Raises
    ------
    StateDirError
        An ``OSError`` whose message names the directory and the problem: "does not
        exist", "is a broken symbolic link", "is not a directory", "is not readable: ...",
        "is not writable: ...", or "keeps files: cannot delete the probe file ...".
    """
    path = os.fspath(state_dir)
    try:
        if not os.path.isdir(path):
            if os.path.islink(path) and not os.path.exists(path):
                raise StateDirError(path, "is a broken symbolic link", 2)  # ENOENT
            if os.path.lexists(path):
                raise StateDirError(path, "is not a directory", 20)  # ENOTDIR
            raise StateDirError(path, "does not exist", 2)  # ENOENT
        os.listdir(path)
    except StateDirError:
        raise
    except OSError as exc:
        raise StateDirError(path, f"is not readable: {exc.strerror}", exc.errno) from exc
    probe = os.path.join(path, f"{PROBE_PREFIX}{os.getpid()}-{secrets.token_hex(4)}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, b"smoosh state_dir probe\n")
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        try:
            os.unlink(probe)
        except OSError:
            pass
        raise StateDirError(
            path, f"is not writable: cannot create a file there ({exc.strerror})", exc.errno
        ) from exc
    try:
        os.unlink(probe)
    except OSError as exc:
        raise StateDirError(
            path, f"keeps files: cannot delete the probe file {probe!r} ({exc.strerror})",
            exc.errno,
        ) from exc
