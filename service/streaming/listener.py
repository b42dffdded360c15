"""A StreamingQueryListener whose progress events cross py4j once, as Spark's JSON.

PySpark hands a Python listener each progress event converted field by field over py4j
(`QueryProgressEvent.fromJObject`): a round trip per field, and each Java map or list it
walks ends in a `NoSuchElementException` that PySpark's py4j error handler classifies
with fourteen more round trips, each resolving a class by name through the driver's
classpath. With the driver's two listeners at one batch per second, that was 430 Java
exceptions in 133 s and 9 % of the driver JVM's sampled CPU (docs/performance.md). A
`JsonProgressListener` asks for the progress's JSON instead (one round trip) and parses
it into the `QueryProgressEvent` PySpark's Spark Connect client builds from the same JSON.
"""

from __future__ import annotations

import json
from typing import Any

from py4j.java_gateway import JavaObject
from pyspark import SparkContext
from pyspark.sql.streaming.listener import (
    JStreamingQueryListener,
    QueryProgressEvent,
    StreamingQueryListener,
)

# Fields of a source's progress that Spark's JSON leaves out when they have no value (an
# offset not known yet, a rate that is not a number); PySpark's parser requires them.
_SOURCE_FIELDS = (
    "startOffset",
    "endOffset",
    "latestOffset",
    "inputRowsPerSecond",
    "processedRowsPerSecond",
)


def progress_event(progress_json: str) -> QueryProgressEvent:
    """The event of Spark's JSON of one `StreamingQueryProgress` (`progress.json`); a
    source field Spark leaves out reads as None (its offsets as the string "null")."""
    progress: dict[str, Any] = json.loads(progress_json)
    progress["sources"] = [
        {**dict.fromkeys(_SOURCE_FIELDS), **source} for source in progress.get("sources", [])
    ]
    return QueryProgressEvent.fromJson({"progress": progress})


class _JsonEvents(JStreamingQueryListener):
    """PySpark's py4j callback object, reading progress events as JSON."""

    def onQueryProgress(self, jevent: JavaObject) -> None:  # noqa: N802 - Spark's name
        self.pylistener.onQueryProgress(progress_event(jevent.progress().json()))


class JsonProgressListener(StreamingQueryListener):
    """A StreamingQueryListener (same callbacks, same event objects) whose progress events
    reach Python as one JSON string each."""

    @property
    def _jlistener(self) -> JavaObject:
        if not hasattr(self, "_jlistenerobj"):
            jvm = SparkContext._jvm
            assert jvm is not None, "a listener is registered with a running SparkSession"
            self._jlistenerobj = jvm.PythonStreamingQueryListenerWrapper(_JsonEvents(self))
        return self._jlistenerobj
