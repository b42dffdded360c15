"""Record ``tests/fixtures/previous_release/``: a lake and its checkpoints written by the
previous release, which `tests/integration/test_upgrade.py` resumes with this one.

Run by hand before a release changes Spark, Delta or a table's layout, from a checkout
of the *previous* release with its own virtualenv and jars, naming this file and the
fixture directory of this checkout::

    cd <previous checkout> && make setup && \\
      PYTHONPATH=deploy/local .venv/bin/python <this checkout>/tests/support/previous_release.py \\
      <this checkout>/tests/fixtures/previous_release

It uses nothing of this checkout but this file: a throw-away broker (the previous
checkout's ``devstack``), the previous release's ``generate`` and ``run --available-now``
(gold on) over a local lake, twice, then packs the storage root (tables and checkpoints)
and writes what the test needs to know about it to ``manifest.json``. Every reading's
event time lies within a few seconds, so every gold window is still open in the state
the checkpoints hold: the test closes them with this release.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
from importlib.metadata import version
from pathlib import Path

from devstack import KafkaBroker

USERS_TOPIC, SENSORS_TOPIC, ALERTS_TOPIC = "upgrade-users", "upgrade-sensors", "upgrade-alerts"
LAKE_ARCHIVE = "lake.tar.gz"
MANIFEST = "manifest.json"
# (seed, readings) of each run: bad, duplicate and profile-update records mixed in, so
# the quarantine, duplicates and users tables have rows too.
RUNS = ((11, 1500), (12, 900))


def _service(args: list[str], env: dict[str, str], log: Path) -> None:
    with log.open("a") as out:
        subprocess.run(
            [sys.executable, "-m", "service", *args], env=env, stdout=out, stderr=out, check=True
        )


def record(fixture_dir: Path) -> None:
    """Write the lake archive and its manifest into ``fixture_dir``."""
    fixture_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, KafkaBroker(Path(tmp) / "kafka") as broker:
        root = Path(tmp) / "lake"
        broker.create_topics([USERS_TOPIC, SENSORS_TOPIC], partitions=3)
        env = {
            **os.environ,
            "INGEST_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
            "INGEST_USERS_TOPIC": USERS_TOPIC,
            "INGEST_SENSORS_TOPIC": SENSORS_TOPIC,
            "INGEST_ALERTS_TOPIC": ALERTS_TOPIC,
            "INGEST_STORAGE_ROOT": str(root),
            "INGEST_HTTP_PORT": "0",
            "INGEST_SPARK_UI_ENABLED": "false",
            "INGEST_SPARK_MASTER": "local[2]",
            "INGEST_SPARK_SHUFFLE_PARTITIONS": "2",
            "INGEST_GOLD_ENABLED": "true",
            "INGEST_RECONCILE_INTERVAL_SECONDS": "0",
            "INGEST_KAFKA_MAX_OFFSETS_PER_TRIGGER": "800",
            "INGEST_LOG_LEVEL": "WARNING",
        }
        log = Path(tmp) / "service.log"
        for seed, readings in RUNS:
            _service(
                ["generate", "--users", "60", "--readings", str(readings), "--seed", str(seed),
                 "--bad-fraction", "0.03", "--duplicate-fraction", "0.03",
                 "--user-update-fraction", "0.05"],
                env, log,
            )  # fmt: skip
            _service(["run", "--available-now"], env, log)
        with tarfile.open(fixture_dir / LAKE_ARCHIVE, "w:gz") as archive:
            archive.add(root, arcname="lake")
    manifest = {
        "pyspark": version("pyspark"),
        "delta_spark": version("delta-spark"),
        "users_topic": USERS_TOPIC,
        "sensors_topic": SENSORS_TOPIC,
        "alerts_topic": ALERTS_TOPIC,
        "runs": [{"seed": seed, "readings": readings} for seed, readings in RUNS],
    }
    (fixture_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


if __name__ == "__main__":
    record(Path(sys.argv[1]))
