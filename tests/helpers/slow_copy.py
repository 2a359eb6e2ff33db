"""A slow copy, stepped by the test: another process writes a database under its final name, a chunk at a time.

``python slow_copy.py SRC DST CHUNKS`` opens DST as ``cp`` does (created, or an existing file
cut to nothing) and writes SRC's bytes in ``CHUNKS`` equal pieces, the header first, as ``cp`` does: one piece for each line read on stdin, each
written to the file and answered with ``wrote <bytes so far>``. It writes outside SQLite's
locks, as any copy does. At the end of its input it exits.

:class:`SlowCopy` drives it from a test: :meth:`SlowCopy.step` writes the next piece and waits
for its answer, so the copy is exactly as far as the test says, whatever the machine's speed.
"""

from __future__ import annotations

import os
import subprocess
import sys


class SlowCopy:
    """The copying process (see the module docstring); ``close()`` ends it."""

    def __init__(self, src: str, dst: str, chunks: int) -> None:
        self.size_bytes = os.path.getsize(src)
        self.chunks = chunks
        self.done = 0
        self.proc = subprocess.Popen(
            [sys.executable, __file__, src, dst, str(chunks)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )

    def step(self) -> int:
        """Write the next piece; the bytes written so far."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("next\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer.startswith("wrote "):
            raise AssertionError(f"the copying process answered {answer!r} (exit {self.proc.poll()})")
        self.done += 1
        return int(answer.split()[1])

    def finish(self) -> None:
        """Write every piece left."""
        while self.done < self.chunks:
            self.step()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(60)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _main(argv: list[str]) -> int:
    src, dst, chunks = argv[0], argv[1], int(argv[2])
    with open(src, "rb") as f:
        data = f.read()
    piece = -(-len(data) // chunks)
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        written = 0
        for _line in sys.stdin:
            if written >= len(data):
                break
            chunk = data[written:written + piece]
            os.pwrite(fd, chunk, written)
            written += len(chunk)
            print(f"wrote {written}", flush=True)
    finally:
        os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
