"""``python -m tests.support.crash_at ARGS``: the service, SIGKILLed at one commit phase.

The phase is ``CRASH_AT`` in the environment (a driver's writes, ingest's and gold's, and
``promote``'s MERGE):

- ``before:<table>``: when a batch is about to write ``<table>`` (its offsets are
  in the checkpoint, none of its tables may hold it yet);
- ``after:<table>``: right after a batch's commit to ``<table>`` (a write that
  a replay skipped is not a commit and does not count);
- ``checkpoint:<query>``: after every table write of a batch of ``<query>`` (ingest or gold)
  returned, before Spark commits the batch to the checkpoint.

At the first such point the whole process group (Python and the Spark JVM) is killed
with SIGKILL, as `ServiceProcess.kill9` does, after one ``crash_point`` line on stdout.
The service's own write functions run unchanged; they are wrapped, not replaced.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from pyspark.sql import Column, DataFrame

import service.gold.queries
import service.ingest.modes.entities
import service.ingest.writer
import service.verbs.promote
from service.__main__ import main
from service.lake.delta import append_once, table_transactions
from service.lake.merge import PlannedMerge, merge_once, plan_merge

T = TypeVar("T")

PHASE = os.environ["CRASH_AT"]


def crash(phase: str) -> None:
    """Kill this driver's process group now."""
    os.write(1, (json.dumps({"event": "crash_point", "phase": phase}) + "\n").encode())
    os.killpg(os.getpgid(0), signal.SIGKILL)


def _table(uri: str) -> str:
    return "/".join(uri.rstrip("/").split("/")[-2:])


def _committed(df: DataFrame, uri: str, app_id: str) -> int:
    return (table_transactions(df.sparkSession, uri) or {}).get(app_id, -1)


def crashing(write: Callable[..., T]) -> Callable[..., T]:
    """``write`` (an idempotent table write), with the ``before``/``after`` points."""

    def wrapped(
        df: DataFrame, uri: str, app_id: str, version: int, *args: Any, **options: Any
    ) -> T:
        table = _table(uri)
        if PHASE == f"before:{table}":
            crash(PHASE)
        was = _committed(df, uri, app_id) if PHASE == f"after:{table}" else None
        result = write(df, uri, app_id, version, *args, **options)
        if was is not None and _committed(df, uri, app_id) > was:
            crash(PHASE)
        return result

    return wrapped


def crashing_plan(plan: Callable[..., PlannedMerge]) -> Callable[..., PlannedMerge]:
    """``plan`` (`plan_merge`), whose planned MERGE runs with the points of `crashing`."""

    def wrapped(
        df: DataFrame, uri: str, app_id: str, version: int, *args: Any, **options: Any
    ) -> PlannedMerge:
        planned = plan(df, uri, app_id, version, *args, **options)

        def run(touching: Column | None) -> None:
            crashing(lambda *_: planned(touching))(df, uri, app_id, version)

        return run

    return wrapped


def _batch_then_crash(call: Callable[..., None]) -> Callable[..., None]:
    def wrapped(self: Any, batch: DataFrame, batch_id: int) -> None:
        call(self, batch, batch_id)
        if PHASE == f"checkpoint:{self.query.name}":
            crash(PHASE)

    return wrapped


service.ingest.writer.append_once = crashing(append_once)  # type: ignore[attr-defined]
service.ingest.modes.entities.plan_merge = crashing_plan(plan_merge)  # type: ignore[attr-defined]
service.verbs.promote.merge_once = crashing(merge_once)  # type: ignore[attr-defined]
service.ingest.writer.BatchWriter.__call__ = _batch_then_crash(  # type: ignore[method-assign]
    service.ingest.writer.BatchWriter.__call__
)
service.gold.queries.append_once = crashing(append_once)  # type: ignore[attr-defined]
service.gold.queries.GoldWriter.__call__ = _batch_then_crash(  # type: ignore[method-assign]
    service.gold.queries.GoldWriter.__call__
)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
