"""The built image (``make image``), and a working container of it run by buildah as the
image's user: its root filesystem with /opt and /usr read-only, and host directories for
the two paths the chart and compose make writable (/tmp, the scratch directory)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

IMAGE = os.environ.get("LAKEHOUSE_IMAGE", "localhost/lakehouse-ingest:dev")
READ_ONLY = ("/opt", "/usr")
# What buildah's runtime says when it failed before the command started (`Container.run`).
_RUNTIME_NOT_STARTED = "sealing memfd copy"


def buildah(*args: str, timeout: float = 120) -> str:
    """Run ``buildah ARGS`` and return its stdout; fail the test with its stderr."""
    result = subprocess.run(
        ["buildah", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert 0 == result.returncode, f"buildah {' '.join(args)}: {result.stderr}"
    return result.stdout


@dataclass(frozen=True)
class Container:
    """A working container of the image, with host directories for its writable paths."""

    name: str
    root: Path
    scratch: Path
    tmp: Path
    user: str
    home: str

    def command(self, args: Sequence[str], env: Mapping[str, str] = {}) -> list[str]:
        """The ``buildah run`` command line that runs ``args`` in the container."""
        volumes = [f"--volume={self.root}{path}:{path}:ro" for path in READ_ONLY]
        volumes += [f"--volume={self.scratch}:{self.home}", f"--volume={self.tmp}:/tmp"]
        return [
            "buildah",
            "run",
            "--isolation=chroot",
            f"--user={self.user}",
            # The host's name, which its /etc/hosts resolves (buildah's chroot names the
            # container after its id without adding that name to /etc/hosts; Spark
            # resolves its own host name, as it does in a pod from the pod's /etc/hosts).
            "--uts=host",
            *volumes,
            # buildah's chroot has no PID namespace, so tini is not PID 1 there; as a
            # subreaper it reaps the JVM's children as it does as PID 1.
            "--env=TINI_SUBREAPER=1",
            *[f"--env={k}={v}" for k, v in env.items()],
            self.name,
            "--",
            *args,
        ]

    def run(
        self,
        args: Sequence[str],
        env: Mapping[str, str] = {},
        timeout: float = 300,
        stdin: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``args`` to completion in the container, ``stdin`` as its input.

        Run again (at most twice) when buildah's runtime could not start the command: on
        a busy host it can fail to seal the copy of itself it runs the command from
        ("sealing memfd copy: Device or resource busy"), before the command starts.
        """
        for attempt in range(3):
            result = subprocess.run(
                self.command(args, env),
                input=stdin or "",
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
            if result.returncode == 0 or _RUNTIME_NOT_STARTED not in result.stderr:
                break
            time.sleep(1 + attempt)
        return result

    def start(
        self, args: Sequence[str], env: Mapping[str, str], log: Path
    ) -> subprocess.Popen[bytes]:
        """Start ``args`` in the container, in its own process group, logging to ``log``."""
        with log.open("ab") as out:
            return subprocess.Popen(
                self.command(args, env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
