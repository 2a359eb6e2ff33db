"""smoosh's version, read one way by everything that shows it (``smoosh_build_info``, ``--version``).

The installed distribution's metadata is the truth for an installed smoosh; a source checkout
run without installing falls back to ``smoosh.__version__``. The distribution is found by the
import packages it ships rather than by its name: the name on the package index is not
``smoosh`` (another project owns that one), and an unrelated distribution that also ships a
top-level ``smoosh`` never ships ``channels`` and ``persist`` beside it.
"""

from __future__ import annotations

import functools
from importlib import metadata

__all__ = ["version"]

#: The import packages only smoosh's own distribution ships together.
_OUR_PACKAGES = ("smoosh", "channels", "persist")


@functools.lru_cache(maxsize=1)
def version() -> str:
    """The version of this smoosh (cached: it does not change while the process runs).

    Returns:
        The version of the one installed distribution that ships every package of
        ``_OUR_PACKAGES``, or ``smoosh.__version__`` when there is none (or several).
    """
    try:
        shipped = metadata.packages_distributions()
        candidates = set(shipped.get(_OUR_PACKAGES[0], ()))
        for package in _OUR_PACKAGES[1:]:
            candidates &= set(shipped.get(package, ()))
        if len(candidates) == 1:
            return metadata.version(candidates.pop())
    except (OSError, ValueError, metadata.PackageNotFoundError):
        pass  # unreadable metadata: the source's own version below is still right
    from smoosh import __version__

    return __version__
