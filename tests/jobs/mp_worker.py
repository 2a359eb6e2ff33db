"""A job worker run as a real subprocess by test_multiprocess.py (not a test module).

Usage: mp_worker.py DB_PATH TYPE OUT_DIR MODE ACCEPT_TIMEOUT_S MAX_JOBS

MODE "drain": accept jobs (waiting up to ACCEPT_TIMEOUT_S for each), append each accepted id
to OUT_DIR/<pid>.log (fsynced, before finishing), finish it with {"by": pid}; exit 0 when no
job comes within the timeout or after MAX_JOBS jobs (0: no limit).
MODE "hang": accept one job, write its id to OUT_DIR/hang.<pid>, then sleep until killed.
"""

from __future__ import annotations

import os
import sys
import time

from smoosh.jobs import Jobs, NotFound
from smoosh.store import open_store


def main(argv: list[str]) -> int:
    db_path, job_type, out_dir, mode, accept_timeout_s, max_jobs = argv
    store = open_store(f"sqlite:{db_path}")
    jobs = Jobs(store)
    done = 0
    try:
        while True:
            try:
                job, data = jobs.accept(job_type, timeout=float(accept_timeout_s))
            except NotFound:
                return 0
            if mode == "hang":
                marker = os.path.join(out_dir, f"hang.{os.getpid()}")
                with open(marker + ".tmp", "w") as f:
                    f.write(job.id)
                os.rename(marker + ".tmp", marker)
                while True:
                    time.sleep(60)
            with open(os.path.join(out_dir, f"{os.getpid()}.log"), "a") as log:
                log.write(job.id + "\n")
                log.flush()
                os.fsync(log.fileno())
            jobs.finish(job, {**data, "by": os.getpid()})
            done += 1
            if int(max_jobs) and done >= int(max_jobs):
                return 0
    finally:
        jobs.close()
        store.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
