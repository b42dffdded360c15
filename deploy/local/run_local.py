"""`make run`: local Kafka + the generator + the service on a local-filesystem lakehouse.

Everything lives under ./var (Kafka data, the lakehouse, logs). The generator sends
``GENERATOR_RATE`` readings/s (default 200) and, unless ``GENERATOR_MIX`` says otherwise,
a small share of bad, late and duplicate readings, profile updates and tombstones, so
that quarantine, duplicates and users changes have rows to show (``GENERATOR_MIX=''``:
valid readings only). Each run seeds the generator anew (``GENERATOR_SEED`` to repeat
one): with the same seed a second run would send the first one's event ids again, all
of them duplicates within the dedup horizon. Ctrl-C stops the generator and the service
gracefully, then the broker.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from devstack import KafkaBroker, free_port

REPO = Path(__file__).resolve().parents[2]
VAR = REPO / "var"
# The generator's default share of records that are not plain valid readings (generate's
# fractions of the reading slots); GENERATOR_MIX replaces it, '' sends valid readings only.
DEFAULT_MIX = (
    "--bad-fraction 0.01 --late-fraction 0.01 --duplicate-fraction 0.01"
    " --user-update-fraction 0.005 --tombstone-fraction 0.0005"
)
READ_HINT = """
Tables (Delta Lake) under {root}: bronze/{{users,sensors}}, silver/{{sensor_readings,
  quarantine,sensor_duplicates,users}}, gold/{{sensor_stats_1m,heart_rate_5m,...}}
Look at them without a JVM (delta-rs), in another shell, from {repo}:
  . .venv/bin/activate
  export INGEST_STORAGE_ROOT={root} INGEST_KAFKA_BOOTSTRAP_SERVERS={bootstrap} \\
    INGEST_HTTP_PORT={http_port}
  lakehouse-ingest status
  lakehouse-ingest show silver/sensor_readings --limit 5
  lakehouse-ingest show silver/quarantine --where "error_code = 'malformed_json'" --limit 5
  lakehouse-ingest reconcile
Metrics: http://localhost:{http_port}/metrics   health: /healthz /readyz   Spark UI: http://localhost:4040
Generator: {rate} readings/s (GENERATOR_RATE), mixed in: {mix} (GENERATOR_MIX), seed {seed}
Ctrl-C stops everything.
"""


def _port(preferred: int) -> int:
    """``preferred`` if it is free, else any free port."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", preferred))
        except OSError:
            return free_port()
    return preferred


@dataclass(frozen=True)
class Generator:
    """What `make run`'s generator sends: ``GENERATOR_RATE``, ``GENERATOR_MIX`` and
    ``GENERATOR_SEED`` of the environment, or their defaults (the seed: this run's own)."""

    rate: str
    mix: tuple[str, ...]
    seed: str

    @classmethod
    def from_env(cls, environ: Mapping[str, str], seed: int) -> Generator:
        """The generator ``environ`` asks for, seeded with ``seed`` unless it names one."""
        return cls(
            rate=environ.get("GENERATOR_RATE", "200"),
            mix=tuple(environ.get("GENERATOR_MIX", DEFAULT_MIX).split()),
            seed=environ.get("GENERATOR_SEED", str(seed)),
        )

    def args(self) -> list[str]:
        """The ``generate`` verb's arguments."""
        return ["generate", "--users", "500", "--rate", self.rate, "--seed", self.seed, *self.mix]


def main(argv: Sequence[str] | None = None) -> int:
    """Start the stack, wait for Ctrl-C (or a child's exit), stop it all."""
    # No options (the environment configures it); --help answers without starting anything.
    argparse.ArgumentParser(
        prog="make run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args(argv)
    VAR.mkdir(exist_ok=True)
    stopping = False

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    broker = KafkaBroker(VAR / "kafka", port=_port(9092), log_path=VAR / "kafka.log")
    print(f"starting Kafka on {broker.bootstrap_servers} (log: var/kafka.log) ...", flush=True)
    broker.start()
    broker.create_topics(["users", "sensors"], partitions=3)
    http_port = _port(int(os.environ.get("INGEST_HTTP_PORT", "8080")))
    env = {
        **os.environ,
        "INGEST_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
        "INGEST_STORAGE_ROOT": str(VAR / "lakehouse"),
        "INGEST_HTTP_PORT": str(http_port),
        "INGEST_LOG_FORMAT": os.environ.get("INGEST_LOG_FORMAT", "console"),
    }
    generator = Generator.from_env(os.environ, secrets.randbits(31))
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "service", *generator.args()],
            cwd=REPO,
            env={**env, "INGEST_LOG_LEVEL": "WARNING"},
        ),
        subprocess.Popen([sys.executable, "-m", "service", "run"], cwd=REPO, env=env),
    ]
    hint = READ_HINT.format(
        repo=REPO,
        root=VAR / "lakehouse",
        bootstrap=broker.bootstrap_servers,
        http_port=http_port,
        rate=generator.rate,
        mix=" ".join(generator.mix) or "nothing, valid readings only",
        seed=generator.seed,
    )
    print(hint, flush=True)
    exit_code = 0
    try:
        while not stopping and all(c.poll() is None for c in children):
            time.sleep(0.5)
        exit_code = next((c.returncode for c in children if c.returncode), 0)
    finally:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(timeout=120)
            except subprocess.TimeoutExpired:
                child.kill()
        broker.stop()
        print("stopped: Kafka, generator and service", flush=True)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
