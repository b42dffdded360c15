"""The service run as a child process, ``python -m service ARGS``, and what it logs."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.repo import REPO

# A test's driver (and a cluster test's executor) lives seconds to a few minutes, and
# most of its CPU went to C2 compiling code for a run that ends before it pays back.
# C1 only and the serial collector: a 6,500-record `run --available-now` took 58-64 ->
# 35-37 CPU-s, 32-34 -> 25-26 s (docs/performance.md). Neither changes a result, only how
# fast the JVM gets there. C1 alone would reserve the client VM's 48 MB of code cache,
# which a driver with gold on fills ("Out of space in CodeCache", its queries fail):
# the default JVM's 240 MB.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ReservedCodeCacheSize=240m"


@dataclass
class ServiceProcess:
    """``python -m MODULE ARGS`` (the service) in its own process group, logging to a file."""

    env: Mapping[str, str]
    log_path: Path
    args: tuple[str, ...] = ("run",)
    module: str = "service"
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> ServiceProcess:
        """Launch the service."""
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module, *self.args],
            cwd=REPO,
            env={**os.environ, **self.env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    @property
    def pid(self) -> int:
        """The Python driver's pid."""
        assert self.proc is not None
        return self.proc.pid

    def wait(self, timeout: float) -> int:
        """Wait for exit and return the exit code."""
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def alive(self) -> bool:
        """Whether the driver process is still running."""
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        """Crash the driver: SIGKILL its whole process group (Python and the Spark JVM)."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def terminate(self) -> None:
        """Send SIGTERM to the driver process only, as Kubernetes (through tini) does."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    def terminate_group(self) -> None:
        """Send SIGTERM to the whole process group, as ``timeout``, ``kill -- -PGID`` and
        systemd's control-group stop do (Kubernetes, through tini, sends it to the driver
        alone)."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGTERM)

    def interrupt_group(self) -> None:
        """Send SIGINT to the whole process group, as Ctrl-C in a terminal does."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGINT)

    def cleanup(self) -> None:
        """Kill anything left of the process group."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def log_text(self) -> str:
        """Everything the service printed so far."""
        return self.log_path.read_text(errors="replace")

    def events(self, event: str | None = None) -> list[dict[str, Any]]:
        """The JSON log lines named ``event`` (None: all) printed so far, in order."""
        lines = []
        for line in self.log_text().splitlines():
            with contextlib.suppress(ValueError):
                parsed = json.loads(line)
                if isinstance(parsed, dict) and event in (None, parsed.get("event")):
                    lines.append(parsed)
        return lines

    def jvm_mapped_files(self) -> set[str]:
        """The files mapped into the memory of the driver's JVM (the java process of its group)."""
        assert self.proc is not None
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError):
                process_group = int(stat.read_text().rsplit(")", 1)[1].split()[2])
                java = (stat.parent / "comm").read_text() == "java\n"
                if process_group == self.proc.pid and java:
                    fields = (line.split(None, 5) for line in (stat.parent / "maps").open())
                    return {f[5].rstrip("\n") for f in fields if len(f) == 6}
        raise AssertionError(f"no JVM in the driver's process group:\n{self.log_text()[-4000:]}")

    def wait_for_log(self, needle: str, timeout: float, count: int = 1) -> None:
        """Block until ``needle`` appears ``count`` times in this run's log; fail if it dies."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.log_text().count(needle) >= count:
                return
            if not self.alive():
                raise AssertionError(
                    f"service exited before {needle!r}:\n{self.log_text()[-4000:]}"
                )
            time.sleep(0.5)
        raise AssertionError(f"{needle!r} not logged within {timeout}s:\n{self.log_text()[-4000:]}")
