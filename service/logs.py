"""Logging: one JSON (or console) line per event on stdout, from Python and from the JVM.

structlog renders every record; stdlib loggers (py4j, pyspark, warnings) go
through the same formatter. Spark's JVM logs through log4j2, which reads the
configuration file `jvm_log_config` writes: JSON lines with the same keys
(``timestamp``, ``level``, ``logger``, ``event``; ``source`` = ``jvm``).
Secrets never reach the output: exception locals are not rendered, and every
configured secret value is masked wherever it appears in an event.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

import structlog
from pydantic import SecretStr
from structlog.tracebacks import ExceptionDictTransformer
from structlog.typing import EventDict, WrappedLogger

from service.config import Settings

MASK = "**********"
# Secrets shorter than this are not masked by value (they would mask ordinary words).
_MIN_SECRET_LENGTH = 4

_SHARED: list[Any] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]

# The JVM's records, shaped like ours (log4j2 JsonTemplateLayout, shipped with Spark).
_JVM_JSON_TEMPLATE = (
    '{"timestamp":{"$resolver":"timestamp","pattern":{"format":'
    '"yyyy-MM-dd\'T\'HH:mm:ss.SSSSSS\'Z\'","timeZone":"UTC"}},'
    # Without stackTraceEnabled false, a pattern appends the record's stack trace.
    '"level":{"$resolver":"pattern","pattern":"%level{lowerCase=true}",'
    '"stackTraceEnabled":false},'
    '"logger":{"$resolver":"logger","field":"name"},'
    '"event":{"$resolver":"message","stringified":true},'
    '"source":"jvm",'
    '"thread":{"$resolver":"thread","field":"name"},'
    '"exception":{"exc_type":{"$resolver":"exception","field":"className"},'
    '"exc_value":{"$resolver":"exception","field":"message"},'
    '"stack_trace":{"$resolver":"exception","field":"stackTrace",'
    '"stackTrace":{"stringified":true}}}}'
)
# Spark logs every task at INFO: the JVM runs one level quieter than Python.
_JVM_LEVEL = {"DEBUG": "info", "INFO": "warn", "WARNING": "warn", "ERROR": "error"}
# How Delta's warning that a MERGE's cached source was not copied begins (dropped).
MERGE_SOURCE_NOT_COPIED = "Cached source plans must be materialized in MERGE"


def configure_logging(
    fmt: str = "json",
    level: str = "INFO",
    secrets: Iterable[str] = (),
    stream: TextIO | None = None,
) -> None:
    """Send structlog and stdlib logging (py4j, warnings) to ``stream`` (stdout) in one format.

    Every value in ``secrets`` is replaced by a mask wherever it occurs in an event.
    """
    json_output = fmt == "json"
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json_output
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            *_SHARED,
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_SHARED,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            # Tracebacks as data; never with the frames' locals (they may hold credentials).
            structlog.processors.ExceptionRenderer(ExceptionDictTransformer(show_locals=False))
            if json_output
            else structlog.processors.format_exc_info,
            SecretMasker(secrets),
            renderer,
        ],
    )
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.captureWarnings(True)
    # py4j logs every gateway round trip at DEBUG/INFO; keep its warnings only.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    librdkafka = logging.getLogger("librdkafka")
    for old in [f for f in librdkafka.filters if isinstance(f, ReconnectThrottle)]:
        librdkafka.removeFilter(old)
    librdkafka.addFilter(ReconnectThrottle())


class ReconnectThrottle(logging.Filter):
    """librdkafka logs each failed connection attempt (``FAIL``) as an error, many a second
    while a broker is down: pass one per client and broker a minute, as a warning. The
    outage shows where on-call looks for it: the lag poll's age
    (``kafka_lag_polled_timestamp_seconds``) and the queries' progress."""

    def __init__(self, interval_seconds: float = 60.0, clock: Any = time.monotonic) -> None:
        super().__init__()
        self._interval = interval_seconds
        self._clock = clock
        self._last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if not text.startswith("FAIL "):
            return True
        key = text.partition("]: ")[0]  # "FAIL [client] [thrd:broker" without the details
        now = self._clock()
        if now - self._last.get(key, -self._interval) < self._interval:
            return False
        self._last[key] = now
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


class SecretMasker:
    """A structlog processor that replaces known secret values anywhere in an event."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self._secrets = sorted(
            {s for s in secrets if len(s) >= _MIN_SECRET_LENGTH}, key=len, reverse=True
        )

    def __call__(self, _logger: WrappedLogger, _method: str, event: EventDict) -> EventDict:
        if not self._secrets:
            return event
        masked: EventDict = self._mask(event)
        return masked

    def _mask(self, value: Any) -> Any:
        if isinstance(value, str):
            for secret in self._secrets:
                if secret in value:
                    value = value.replace(secret, MASK)
            return value
        if isinstance(value, dict):
            return {k: self._mask(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._mask(v) for v in value]
        if isinstance(value, SecretStr):
            return MASK
        if isinstance(value, bytes | int | float | bool) or value is None:
            return value
        return self._mask(str(value))


def secret_values(settings: Settings) -> list[str]:
    """The secret values in ``settings`` (every `SecretStr` field), for `configure_logging`."""
    return [v.get_secret_value() for _, v in settings if isinstance(v, SecretStr)]


def jvm_log_config(
    fmt: str = "json",
    level: str = "INFO",
    target: str = "SYSTEM_OUT",
    directory: Path | None = None,
) -> Path:
    """Write the JVM's log4j2 configuration (JSON or pattern lines); return its path.

    Pass it to the driver JVM as ``-Dlog4j2.configurationFile=<path>``. The file
    name carries a hash of its content, so concurrent drivers never clash.
    """
    layout = (
        [
            "appender.out.layout.type = JsonTemplateLayout",
            f"appender.out.layout.eventTemplate = {_JVM_JSON_TEMPLATE}",
        ]
        if fmt == "json"
        else [
            "appender.out.layout.type = PatternLayout",
            "appender.out.layout.pattern = %d{ISO8601}{UTC}Z [%-5level] %c: %m%n%ex",
        ]
    )
    jvm_level = _JVM_LEVEL.get(level, "warn")
    text = "\n".join(
        [
            "# Written by lakehouse-ingest (service/logs.py): Spark's JVM logs as lines on stdout.",
            f"rootLogger.level = {jvm_level}",
            "rootLogger.appenderRef.out.ref = out",
            "appender.out.type = Console",
            "appender.out.name = out",
            f"appender.out.target = {target}",
            "appender.out.follow = true",
            *layout,
            # Known noise: harmless warnings every streaming query start prints.
            "logger.resolve.name = org.apache.spark.sql.execution.streaming.runtime"
            ".ResolveWriteToStream",
            "logger.resolve.level = error",
            "logger.nativeio.name = org.apache.hadoop.util.NativeCodeLoader",
            "logger.nativeio.level = error",
            "logger.jetty.name = org.sparkproject.jetty",
            "logger.jetty.level = warn",
            # Every users MERGE warns that its source (the batch's cached rows) was not
            # copied: the service chose so (`service.lake.merge`). Only that
            # warning is dropped.
            "logger.merge.name = org.apache.spark.sql.delta.commands.MergeIntoCommand",
            f"logger.merge.level = {jvm_level}",
            "logger.merge.filter.uncopied.type = RegexFilter",
            f"logger.merge.filter.uncopied.regex = {MERGE_SOURCE_NOT_COPIED}.*",
            "logger.merge.filter.uncopied.onMatch = DENY",
            "logger.merge.filter.uncopied.onMismatch = NEUTRAL",
            "",
        ]
    )
    return generated_file("log4j2", ".properties", text, directory)


def generated_file(kind: str, suffix: str, text: str, directory: Path | None = None) -> Path:
    """Write a generated configuration file named after its content's hash; return its path.

    The name carries the hash, so concurrent processes never clash; the file is
    replaced atomically and only when missing or different.
    """
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    path = (directory or Path(tempfile.gettempdir())) / f"lakehouse-ingest-{kind}-{digest}{suffix}"
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return path
