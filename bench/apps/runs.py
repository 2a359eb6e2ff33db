"""One run of the application beside smoosh (or without it), and its checks.

A run, in order:

1. a fresh copy of the template fleet (its compacted twin in mode ``compacted``), flushed;
2. in modes ``compact`` and ``watch``, ``smoosh run`` (the project's ``.venv/bin/smoosh``, or
   ``--smoosh``) with a config the harness writes (:func:`smoosh_config`): the fleet watched,
   state, store and HTTP port of its own, JSON log; everything else smoosh's defaults (``watch``
   sets every channel's ``concurrency = 0``: it watches and measures, never compacts);
3. the application process (``.venv-apps``), set up and waiting; the run waits out the lead
   (``lead_s`` from smoosh's launch, the same idle wait in every mode, so the copies' page
   cache and writeback are alike): smoosh's channels start paused for its ``wait_secs`` (30 s
   by default), and the lead lets the application's run begin a few seconds before they open,
   so the compactions fall inside it, on a smoosh that has already walked the fleet as a
   long-running daemon has;
4. the application's run (``duration_s``); smoosh's CPU read before and after it;
5. smoosh stopped (SIGTERM: a compaction still running is interrupted and rolled back);
6. every tenant checked: ``PRAGMA integrity_check``, and every row against the template and
   the application's ledger (:mod:`bench.apps.ledger`).

A run's working directory is removed afterwards unless it failed its checks (kept for a
post-mortem) or ``keep`` is set.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from bench._daemon import Daemon, free_port, process_cpu_s
from bench.apps.fleet import Template, copy_fleet
from bench.apps.ledger import TenantCheck, check_tenant, merge_ledgers
from bench.apps.windows import Window, widen_with_history, windows_from_log
from smoosh.cli.demo import disk_bytes

__all__ = ["MODES", "DEFAULT_MODES", "HARNESS_KEYS", "uses_smoosh", "RunSpec", "RunOutcome", "smoosh_config", "Smoosh", "run_one"]

#: The modes of a run: no smoosh; smoosh with its default config; smoosh watching only
#: (every channel at concurrency 0); no smoosh on the fleet already compacted (the control);
#: and the first two again with a second smoosh (``--smoosh-b``: another tree, for an A/B in
#: one sitting).
MODES = ("none", "compact", "watch", "compacted", "compact-b", "watch-b")
#: The [smoosh] keys every run's config sets (:func:`smoosh_config`): ``--config-b`` may not set them.
HARNESS_KEYS = ("watch", "state_dir", "store", "http", "log_format")
#: The modes that run the default modes' defaults: those :data:`MODES` a sitting runs unasked.
DEFAULT_MODES = ("none", "compact", "watch", "compacted")


def uses_smoosh(mode: str) -> bool:
    """Whether a run in ``mode`` has smoosh beside the application."""
    return mode in ("compact", "watch", "compact-b", "watch-b")
#: Seconds to wait for smoosh to answer on its port, and for the application to set up.
START_TIMEOUT_S = 120.0
#: Seconds past the run's length the application may take to finish and write its record.
FINISH_GRACE_S = 300.0


@dataclass
class RunSpec:
    """What one run is: which application, journal mode and mode, and the workload's settings."""

    app: str
    journal_mode: str
    mode: str
    number: int  # its place in the sitting (1, 2, ...)
    duration_s: float
    lead_s: float
    threads: int
    rate_per_s: float
    seed: int
    margin_s: float

    @property
    def label(self) -> str:
        return f"{self.number:02d}-{self.app}-{self.journal_mode}-{self.mode}"


@dataclass
class RunOutcome:
    """What a run left: the application's record, smoosh's windows and figures, the checks."""

    spec: RunSpec
    paths: list[str]
    record: dict[str, Any]
    windows: list[Window]
    before_bytes: list[int]
    after_bytes: list[int]
    checks: list[TenantCheck]
    smoosh_cpu_run_s: float | None = None
    smoosh_cpu_total_s: float | None = None
    smoosh_reclaimed_metric: int | None = None
    config_keys: dict[str, str] = field(default_factory=dict)
    kept: str | None = None
    #: Per window matched with its ``started`` event in /jobs: the log's start minus that event's time (s).
    start_gaps_s: list[float] = field(default_factory=list)
    #: The machine's 1-minute load average as the application started and as it ended (other
    #: users of a shared machine show here, and explain a noisy run).
    load_avg: tuple[float, float] = (0.0, 0.0)
    #: smoosh's ``/status`` ``application`` counters over the application's run (the end's less
    #: the start's): its looks with and without a SQLite lock, its waits for a quiet moment.
    application: dict[str, float] = field(default_factory=dict)

    @property
    def violations(self) -> list[str]:
        """Every damaged database and every row not as it should be, one line each."""
        out = []
        for c in self.checks:
            if not c.ok:
                out.append(json.dumps(c.summary()))
        out += [f"application anomaly: {a}" for a in self.record.get("anomalies", [])]
        return out


def smoosh_config(base: Path, fleet_dir: str, port: int, *, watch_only: bool,
                  channels: Sequence[str], extra: Sequence[str] = ()) -> tuple[Path, dict[str, str]]:
    """Write the run's smoosh config; its path and the keys it sets (everything else: defaults).

    Parameters:
        base: the run's directory (state goes in ``base/state``).
        fleet_dir: the directory smoosh watches.
        port: its HTTP port on 127.0.0.1.
        watch_only: every channel in ``channels`` gets ``concurrency = 0`` (queue, never start).
        channels: the channels of smoosh's default config (database and cleanup channels).
        extra: more ``key = value`` lines of the ``[smoosh]`` section (``--config-b``).
    """
    state = base / "state"
    state.mkdir(parents=True, exist_ok=True)
    keys = {
        "watch": fleet_dir,
        "state_dir": str(state),
        "store": f"sqlite:{state / 'jobs.db'}",
        "http": f"127.0.0.1:{port}",
        "log_format": "json",
    }
    for line in extra:
        key, _, value = line.partition("=")
        keys[key.strip()] = value.strip()
    text = "[smoosh]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items())
    if watch_only:
        for ch in channels:
            text += f"\n[smoosh.{ch}]\nconcurrency = 0\n"
            keys[f"[smoosh.{ch}] concurrency"] = "0"
    config = base / "smoosh.ini"
    config.write_text(text)
    return config, keys


class Smoosh(Daemon):
    """``smoosh run --config PATH`` as its own process (``command``), its log (JSON lines) in ``base/smoosh.log``."""

    def __init__(self, command: str, config: Path, port: int) -> None:
        env = dict(os.environ)
        env.pop("SMOOSH_LOG_LEVEL", None)  # smoosh's default level (INFO): its per-run lines
        super().__init__(config, port, command=command, env=env, log_name="smoosh.log", stop_timeout_s=60.0)

    def cpu_s(self) -> float:
        return process_cpu_s(self.proc.pid) or 0.0

    def reclaimed_bytes(self) -> int | None:
        """``smoosh_reclaimed_bytes_total`` summed over channels (smoosh's own figure), None if unreadable."""
        body = self._body("/metrics")
        if body is None:
            return None
        total = 0.0
        for line in body.decode(errors="replace").splitlines():
            if line.startswith("smoosh_reclaimed_bytes_total"):
                total += float(line.rsplit(" ", 1)[1])
        return int(total)

    def jobs(self) -> list[dict[str, Any]]:
        """``GET /jobs``'s rows, every key (empty when unreadable)."""
        body = self._body("/jobs")
        return list(json.loads(body).get("jobs", [])) if body is not None else []

    def log_lines(self) -> list[str]:
        return self.log_path.read_text(errors="replace").splitlines()


def _start_app(spec: RunSpec, apps_python: str, repo_root: str, out: str, paths: Sequence[str]) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=repo_root, PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [apps_python, "-m", f"bench.apps.{spec.app}_app", "run", out, str(spec.seed), str(spec.threads),
         str(spec.rate_per_s), str(spec.duration_s), f"{spec.number}", *paths],
        cwd=repo_root, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _expect(proc: subprocess.Popen[str], word: str, timeout_s: float) -> None:
    """Wait for ``word`` on ``proc``'s stdout; raise if the process ends first (or the wait runs out)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                proc.kill()
                raise RuntimeError(f"the application did not say {word!r} within {timeout_s:.0f} s")
            if sel.select(min(left, 1.0)):
                line = proc.stdout.readline()
                if line.strip() == word:
                    return
                if line == "":
                    proc.wait()
                    raise RuntimeError(f"the application exited with {proc.returncode} before {word!r}")


def run_one(spec: RunSpec, template: Template, *, work: str, smoosh_command: str, apps_python: str, repo_root: str,
            channels: Sequence[str], keep: bool = False, say: Callable[[str], None] = print,
            smoosh_b_command: str | None = None, config_b: Sequence[str] = ()) -> RunOutcome:
    """Run ``spec`` on a fresh copy of ``template`` and check every tenant afterwards.

    Parameters:
        spec: the run.
        template: the fleet's template (its compacted twin is used in mode ``compacted``).
        work: a directory for the run's files (a subdirectory named for the run is made).
        smoosh_command: the ``smoosh`` executable.
        smoosh_b_command: the second one, for modes ``compact-b`` and ``watch-b``.
        config_b: ``key = value`` lines added to the ``[smoosh]`` section in those modes.
        apps_python: the applications' interpreter.
        repo_root: the checkout (the application imports ``bench.apps`` from it).
        channels: smoosh's default channels (for mode ``watch``).
        keep: keep the run's directory even when its checks pass.
        say: prints progress.

    Returns:
        The outcome; its :attr:`RunOutcome.violations` are empty when every tenant is sound
        and every row as it should be (the caller fails loudly otherwise).
    """
    base = Path(work) / spec.label
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    fleet_dir = str(base / "fleet")
    paths = copy_fleet(template.paths(compacted=spec.mode == "compacted"), fleet_dir)
    before = [disk_bytes(p) for p in paths]
    smoosh: Smoosh | None = None
    keys: dict[str, str] = {}
    app: subprocess.Popen[str] | None = None
    out = str(base / "app.json")
    outcome: RunOutcome | None = None
    try:
        launched = time.monotonic()
        if uses_smoosh(spec.mode):
            port = free_port()
            config, keys = smoosh_config(base, os.path.realpath(fleet_dir), port,
                                         watch_only=spec.mode.startswith("watch"), channels=channels,
                                         extra=config_b if spec.mode.endswith("-b") else ())
            command = smoosh_b_command if spec.mode.endswith("-b") else smoosh_command
            if not command:
                raise ValueError(f"mode {spec.mode} needs a second smoosh (--smoosh-b)")
            smoosh = Smoosh(command, config, port)
            smoosh.wait_ready(START_TIMEOUT_S)
        app = _start_app(spec, apps_python, repo_root, out, paths)
        _expect(app, "ready", START_TIMEOUT_S)
        time.sleep(max(0.0, launched + spec.lead_s - time.monotonic()))
        cpu0 = smoosh.cpu_s() if smoosh else None
        seen0 = smoosh.application() if smoosh else {}
        load0 = os.getloadavg()[0]
        assert app.stdin is not None
        app.stdin.write("go\n")
        app.stdin.flush()
        _expect(app, "done", spec.duration_s + FINISH_GRACE_S)
        app.wait(60)
        if app.returncode != 0:
            raise RuntimeError(f"the application exited with {app.returncode}")
        cpu1 = smoosh.cpu_s() if smoosh else None
        load1 = os.getloadavg()[0]
        reclaimed = smoosh.reclaimed_bytes() if smoosh else None
        seen1 = smoosh.application() if smoosh else {}
        jobs = smoosh.jobs() if smoosh else []
        if smoosh:
            smoosh.stop()
        windows = windows_from_log(smoosh.log_lines(), spec.margin_s) if smoosh else []
        windows, gaps = widen_with_history(windows, jobs)
        with open(out, encoding="utf-8") as f:
            record = json.load(f)
        after = [disk_bytes(p) for p in paths]
        say(f"  checking {len(paths)} tenants (integrity_check, every row against the template and the ledger)")
        originals = template.paths()
        checks = [check_tenant(p, originals[i], template.table, merge_ledgers(record["ledger"][i]))
                  for i, p in enumerate(paths)]
        outcome = RunOutcome(
            spec=spec, paths=paths, record=record, windows=windows, before_bytes=before, after_bytes=after,
            checks=checks, config_keys=keys,
            smoosh_cpu_run_s=None if cpu0 is None or cpu1 is None else cpu1 - cpu0,
            smoosh_cpu_total_s=cpu1, smoosh_reclaimed_metric=reclaimed, start_gaps_s=gaps,
            load_avg=(load0, load1),
            application={k: round(v - seen0.get(k, 0.0), 3) for k, v in seen1.items()},
        )
        return outcome
    finally:
        if app is not None and app.poll() is None:
            app.kill()
            app.wait()
        if smoosh is not None:
            smoosh.stop()
        if outcome is not None and not outcome.violations and not keep:
            shutil.rmtree(base, ignore_errors=True)
        elif outcome is not None:
            outcome.kept = str(base)
