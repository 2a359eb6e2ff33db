"""Child process of test_checkpoint_crash: write checkpoints to one path until killed.

Run as ``python crash_writer.py PATH FIRST_GENERATION``. Each mapping is a pure function of
its generation (see :func:`mapping_for`), and the generation is stored inside it, so the
parent can tell exactly which complete checkpoint it found after a kill -9.
"""

from __future__ import annotations

import math
import sys

#: Key holding the generation number inside each mapping.
GENERATION_KEY = "#generation"


def mapping_for(generation: int) -> dict[str, float]:
    """The checkpoint written as ``generation``: 1 to ~25,000 entries (up to 3 chunks)."""
    size = 1 + (generation * 7919) % 25_000
    mapping: dict[str, float] = {GENERATION_KEY: generation}
    for i in range(size):
        mapping[f"/srv/db/{generation}/{i}.sqlite"] = math.inf if i % 7 == 0 else i / 16
    return mapping


def main() -> None:
    from persist.checkpoint import write_checkpoint

    path, generation = sys.argv[1], int(sys.argv[2])
    print("ready", flush=True)
    while True:
        write_checkpoint(path, mapping_for(generation))
        generation += 1


if __name__ == "__main__":
    main()
