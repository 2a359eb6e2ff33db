"""Batched HTTP enqueue against a real daemon (DESIGN §9): >= 20,000 keys/s.

A `smoosh run` subprocess (SQLite job store, no watch, roots = the benchmark's directory,
channels paused) receives ``POST /enqueue`` bodies of 1000 valid keys each: paths of
existing small SQLite files under the roots. Measured twice per run: the first pass sends
keys the daemon has never seen (each is canonicalised, validated and handed to the examine
threads; the response does not wait for routing), the second pass sends them again
(dropped by the staleness hot path once a channel has accepted them).
Rate = keys sent / wall time of the POSTs (one connection per request, as curl would).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._daemon import Daemon, free_port  # noqa: E402
from bench._fixtures import SMALL_DB_ROWS, SMALL_MIN_SIZE, clone_fleet, config_text, make_bloated_db  # noqa: E402
from bench._harness import Metric, parse_args, repeat, report  # noqa: E402

#: Keys per POST /enqueue.
BATCH_KEYS = 1000


def one_run(work: Path, template: str, n: int) -> dict[str, float]:
    base = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    keys = clone_fleet(template, str(base / "dbs"), n)
    port = free_port()
    text = config_text(base, store=f"sqlite:{base / 'state' / 'jobs.db'}", http=f"127.0.0.1:{port}", min_size=SMALL_MIN_SIZE)
    # Every key must fit in whichever channel takes it (slack, for the small template).
    for channel in ("ratio_dbs", "slack_dbs"):
        text = text.replace(f"[smoosh.{channel}]\n", f"[smoosh.{channel}]\ncapacity = {2 * n}\n")
    (base / "smoosh.ini").write_text(text)
    daemon = Daemon(base / "smoosh.ini", port)
    try:
        daemon.wait_ready()
        out = {}
        for name in ("new", "seen"):
            if name == "seen":
                # The second pass measures the hot path: every key must be queued first.
                deadline = time.monotonic() + 120
                while (waiting := daemon.waiting()) < n:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"only {waiting} of {n} keys queued after 120 s")
                    time.sleep(0.1)
            t0 = time.perf_counter()
            for i in range(0, n, BATCH_KEYS):
                status, body = daemon.request("POST", "/enqueue", {"keys": keys[i:i + BATCH_KEYS]})
                if status != 202 or body["rejected"]:
                    raise RuntimeError(f"enqueue refused: {status} {str(body)[:300]}")
            out[name] = n / (time.perf_counter() - t0)
        return out
    finally:
        daemon.stop()
        shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    n = 5000 if args.quick else 20_000
    work = Path(tempfile.mkdtemp(prefix="smoosh-bench-http-"))
    try:
        template = str(work / "template.sqlite")
        make_bloated_db(template, rows=SMALL_DB_ROWS, row_bytes=400, journal_mode="wal")  # slack qualifies it on cheap sizes
        res = repeat(lambda: one_run(work, template, n), args.runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    metrics = [
        Metric("HTTP enqueue, new keys, 1000/batch", "keys/s", res["new"], budget=20_000),
        Metric("HTTP enqueue, already queued keys, 1000/batch", "keys/s", res["seen"], budget=20_000),
    ]
    report("http", "HTTP: batched POST /enqueue to a real daemon", metrics, args,
           [f"{n:,} keys per pass in batches of {BATCH_KEYS}; daemon = `smoosh run` subprocess, SQLite job store."],
           command="python -m bench.http_enqueue")
    return 0


if __name__ == "__main__":
    sys.exit(main())
