"""Command line: ``lakehouse-ingest VERB`` (or ``python -m service``); ``--help`` lists verbs."""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import structlog

from service.errors import (
    CheckpointCorruptError,
    CheckpointMismatchError,
    ConfigError,
    ContractChangeRefusedError,
    IngestError,
    KafkaAccessRefusedError,
    KafkaOffsetsLostError,
    KafkaUnreachableError,
    LeaseHeldError,
    TableLayoutError,
    UnreachableError,
)

if TYPE_CHECKING:
    from service.config import Settings

EXIT_FAILURE = 1
EXIT_CONFIG = 2
EXIT_REFUSED = 3
EXIT_UNREACHABLE = 4


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lakehouse-ingest", description="Kafka → Delta Lake streaming ingest."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the streaming driver (all queries)")
    run.add_argument(
        "--available-now",
        action="store_true",
        help="process what is in Kafka now, then exit 0 (backfills, CronJob mode, tests)",
    )
    status = commands.add_parser(
        "status",
        help="per query: committed offsets vs the broker's (lag), last batch, table versions and "
        "row counts; works while the driver is down",
    )
    status.add_argument("--json", action="store_true", help="print one JSON document")
    commands.add_parser(
        "migrate",
        help="upgrade tables written by an earlier table layout or without their declared "
        "Delta properties, in place (driver stopped)",
    )
    _add_lake_verbs(commands)
    _add_replay_verb(commands)
    _add_promote_verb(commands)
    gen = commands.add_parser("generate", help="produce synthetic users and sensor readings")
    gen.add_argument("--users", type=int, default=100, help="number of distinct users")
    gen.add_argument("--readings", type=int, help="number of sensor readings (count mode)")
    gen.add_argument("--rate", type=float, help="readings per second (rate mode)")
    gen.add_argument(
        "--duration", type=float, help="seconds to run in rate mode (default: forever)"
    )
    gen.add_argument(
        "--seed",
        type=_seed,
        default=0,
        help="random seed (same seed, same records), or 'random' for a new one (in the summary)",
    )
    gen.add_argument("--partitions", type=int, default=3, help="partitions of topics it creates")
    for name, what in (
        ("bad", "readings the contract rejects (quarantined)"),
        ("late", "readings 15 min to 2 h late in event time"),
        ("duplicate", "re-sent readings (same event id)"),
        ("user-update", "slots that also update a user's profile"),
        ("tombstone", "slots that also delete a user (null value)"),
    ):
        gen.add_argument(
            f"--{name}-fraction", type=_fraction, default=0.0, help=f"fraction of {what}"
        )
    gen.add_argument(
        "--transaction-size",
        type=int,
        default=0,
        help="produce with a transactional producer, this many records per transaction"
        " (default 0: no transactions)",
    )
    gen.add_argument(
        "--abort-fraction",
        type=_fraction,
        default=0.0,
        help="fraction of transactions aborted (their records counted as <topic>.aborted)",
    )
    return parser


def _add_lake_verbs(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``show`` and ``reconcile``: read the tables with delta-rs (no JVM, no Spark)."""
    from service.verbs.show import DEFAULT_LIMIT, FORMATS

    show = commands.add_parser(
        "show",
        help="print rows of a table (delta-rs, no JVM); binary values as hex",
        description="Print rows of a table of the lake, read with delta-rs (no JVM). Binary "
        "values (Kafka's exact bytes) print as hex, timestamps as ISO-8601.",
    )
    show.add_argument(
        "table",
        metavar="TABLE",
        help="a table of the lake, e.g. bronze/sensors, silver/quarantine, gold/heart_rate_5m "
        "(each contract has its bronze and silver tables; `status` lists them all)",
    )
    show.add_argument(
        "--where",
        metavar="SQL",
        help="a SQL predicate over the table's columns (DataFusion SQL), "
        "e.g. \"error_code = 'malformed_json' AND kafka_partition = 2\"",
    )
    show.add_argument(
        "--limit",
        type=_count,
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"print at most N rows (default {DEFAULT_LIMIT}; 0 = all)",
    )
    show.add_argument(
        "--version", type=_count, metavar="V", help="read table version V (time travel)"
    )
    show.add_argument(
        "--format",
        choices=FORMATS,
        default="table",
        help="text table (long cells cut), JSON Lines or CSV (default: table)",
    )
    reconcile = commands.add_parser(
        "reconcile",
        help="check the lake's invariants from the tables alone (delta-rs, no JVM); "
        "exit 0 only if all hold",
        description="Check the lake's invariants by Kafka coordinates (delta-rs, no JVM): "
        "bronze offsets contiguous and one row each per topic partition; every record of an "
        "events contract once in its silver table, the quarantine or its duplicates; one row "
        "per key in an entities contract's silver table, its lineage in bronze; unique gold "
        "keys. "
        "Exit 0 only if all hold, 1 otherwise.",
    )
    reconcile.add_argument(
        "--since",
        type=_since,
        metavar="T",
        help="only records with a Kafka timestamp at or after T: ISO-8601 "
        "(2026-01-31T12:00:00Z; zone-less = UTC) or a duration back from now (90s, 15m, 6h, 7d)",
    )
    reconcile.add_argument("--json", action="store_true", help="print one JSON document")


def _add_promote_verb(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``promote``: fill a contract's new columns from the values rows kept in ``_rescued``."""
    promote = commands.add_parser(
        "promote",
        help="fill new contract fields for the rows silver holds, from their _rescued values, "
        "exactly once (driver stopped)",
        description="After a contract names a field producers already sent (kept in "
        "_rescued), copy each row's value into the new column where the field's schema "
        "accepts it, and take it out of _rescued. Runs under the driver lease; a run killed "
        "part-way is finished by the next; silver/promotions records every run.",
    )
    promote.add_argument("--topic", required=True, help="the contract's topic (or its name)")
    promote.add_argument("fields", nargs="+", metavar="FIELD", help="top-level field names")
    promote.add_argument("--json", action="store_true", help="print one JSON document")


def _add_replay_verb(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``replay-quarantine``: re-validate quarantined records, send those that pass to silver."""
    from service.ingest.validation import ERROR_CODES

    replay = commands.add_parser(
        "replay-quarantine",
        help="re-validate quarantined records under the current settings and send the ones "
        "that now pass to silver, exactly once (driver stopped)",
        description="Read the selected quarantined records back from bronze, validate, dedup "
        "and merge them as live records, and write the ones that pass to silver; record what "
        "happened to each in silver/quarantine_replays. Runs under the driver lease; a replay "
        "killed part-way is resumed by the next run.",
    )
    replay.add_argument(
        "--error-code", action="append", choices=ERROR_CODES, help="only this code (repeatable)"
    )
    replay.add_argument("--topic", help="only records of this topic")
    for bound, meaning in (("since", "at or after"), ("until", "before")):
        replay.add_argument(
            f"--{bound}",
            type=_since,
            metavar="T",
            help=f"only records with the --by time {meaning} T (ISO-8601 or a duration "
            "back from now: 90s, 15m, 6h, 7d)",
        )
    replay.add_argument(
        "--by",
        choices=("quarantined_at", "kafka_timestamp"),
        default="quarantined_at",
        help="the time --since/--until compare (default: quarantined_at)",
    )
    replay.add_argument(
        "--dry-run", action="store_true", help="print what would move; take no lease, write nothing"
    )
    replay.add_argument("--json", action="store_true", help="print one JSON document")


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def _since(text: str) -> datetime:
    from service.verbs.reconcile import parse_since

    try:
        return parse_since(text, datetime.now(UTC))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _seed(text: str) -> int:
    """An integer seed, or a new one for ``random``: a run that must not repeat an earlier
    run's event ids (each would be a duplicate within the dedup horizon)."""
    return secrets.randbits(31) if text == "random" else int(text)


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a fraction between 0 and 1")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run the command, map failures to exit codes."""
    args = _parser().parse_args(argv)
    from service.config import load_settings
    from service.logs import configure_logging, secret_values

    try:
        settings = load_settings()
    except ConfigError as e:
        print(f"lakehouse-ingest: {e}", file=sys.stderr)
        return EXIT_CONFIG
    # The verbs that print a report on stdout send their own logs to stderr.
    log_stream = sys.stderr if args.command in _REPORTS else sys.stdout
    configure_logging(settings.log_format, settings.log_level, secret_values(settings), log_stream)
    try:
        settings.contracts  # noqa: B018 - read once, at start: an invalid one stops every verb
        return _VERBS[args.command](args, settings)
    except Exception as e:  # noqa: BLE001 - each failure is one line and an exit code
        return _failed(e, settings)


# The verbs that print a report on stdout.
_REPORTS = ("status", "migrate", "show", "reconcile", "replay-quarantine", "promote")


def _failed(error: Exception, settings: Settings) -> int:
    """Log ``error`` as one line (a traceback only for what no class names) and return the
    command's exit code."""
    from service.failures import named_failure

    log = structlog.get_logger("service")
    if isinstance(error, KafkaAccessRefusedError):
        log.error("kafka_access_refused", error=str(error))
        return EXIT_CONFIG
    if isinstance(error, ConfigError):
        log.error("invalid_configuration", error=str(error))
        return EXIT_CONFIG
    if isinstance(error, _REFUSALS):
        log.error("refusing_to_start", error_class=type(error).__name__, error=str(error))
        return EXIT_REFUSED
    if isinstance(error, UnreachableError):
        event = (
            "kafka_unreachable"
            if isinstance(error, KafkaUnreachableError)
            else "storage_unreachable"
        )
        log.error(event, error_class=type(error).__name__, error=str(error))
        return EXIT_UNREACHABLE
    if isinstance(error, IngestError):
        log.error("failed", error_class=type(error).__name__, error=str(error))
        return EXIT_FAILURE
    # Jobs outside a query (table preparation, the checkpoint checks) fail here.
    named = named_failure(
        str(error), settings.spark_local_dir, (settings.storage_uri, settings.checkpoint_uri)
    )
    if named is not None:
        log.error("failed", error_class=type(named).__name__, error=str(named))
        return EXIT_FAILURE
    log.exception("crashed")
    return EXIT_FAILURE


# Why a command refuses to start (exit 3).
_REFUSALS = (
    CheckpointCorruptError,
    CheckpointMismatchError,
    ContractChangeRefusedError,
    KafkaOffsetsLostError,
    LeaseHeldError,
    TableLayoutError,
)


def _run(args: argparse.Namespace, settings: Settings) -> int:
    from service.driver.app import run

    return run(settings, available_now=args.available_now)


def _status(args: argparse.Namespace, settings: Settings) -> int:
    from service.verbs.status import collect_status

    report = collect_status(settings)
    print(report.to_json() if args.json else report.to_text())
    return 0 if report.ok else EXIT_FAILURE


def _migrate(args: argparse.Namespace, settings: Settings) -> int:
    from service.verbs.migrate import migrate

    migrated = migrate(settings)
    print(f"migrated: {', '.join(migrated)}" if migrated else "nothing to migrate")
    return 0


def _promote(args: argparse.Namespace, settings: Settings) -> int:
    from service.verbs.promote import promote

    promoted = promote(settings, args.topic, args.fields)
    print(promoted.to_json() if args.json else promoted.to_text())
    return 0


def _replay(args: argparse.Namespace, settings: Settings) -> int:
    from service.verbs.replay import ReplayRequest, replay_quarantine

    request = ReplayRequest(
        error_codes=tuple(args.error_code or ()),
        topic=args.topic,
        since=args.since,
        until=args.until,
        time_column=args.by,
        dry_run=args.dry_run,
    )
    replayed = replay_quarantine(settings, request)
    print(replayed.to_json() if args.json else replayed.to_text())
    return 0


def _generate(args: argparse.Namespace, settings: Settings) -> int:
    from service.verbs.generate import GeneratorOptions, generate

    if (args.readings is None) == (args.rate is None):
        print(
            "lakehouse-ingest generate: give exactly one of --readings or --rate", file=sys.stderr
        )
        return EXIT_CONFIG
    options = GeneratorOptions(
        users=args.users,
        readings=args.readings,
        rate=args.rate,
        duration=args.duration,
        seed=args.seed,
        partitions=args.partitions,
        bad_fraction=args.bad_fraction,
        late_fraction=args.late_fraction,
        duplicate_fraction=args.duplicate_fraction,
        user_update_fraction=args.user_update_fraction,
        tombstone_fraction=args.tombstone_fraction,
        transaction_size=args.transaction_size,
        abort_fraction=args.abort_fraction,
    )
    summary = generate(settings, options)
    print(summary.to_json())
    return 0


def _lake_verb(args: argparse.Namespace, settings: Settings) -> int:
    """Run ``show`` or ``reconcile``: a bad request exits 2, an unreadable lake 1, one line each."""
    from service.errors import LakeReadError, LakeRequestError
    from service.lake.lakeview import LakeReader

    reader = LakeReader.from_settings(settings)
    try:
        if args.command == "show":
            from service.verbs.show import ShowRequest, show

            table = reader.table(args.table)
            request = ShowRequest(table, args.where, args.limit, args.version, args.format)
            show(reader, request, sys.stdout)
            return 0
        from service.lake.invariants import reconcile

        report = reconcile(reader, settings, args.since)
        print(report.to_json() if args.json else report.to_text())
        return 0 if report.ok else EXIT_FAILURE
    except LakeRequestError as e:
        print(f"lakehouse-ingest {args.command}: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except LakeReadError as e:
        print(f"lakehouse-ingest {args.command}: {e}", file=sys.stderr)
        return EXIT_FAILURE
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep Python's exit flush quiet too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


# Each command's function: its arguments and the settings in, its exit code out.
_VERBS: dict[str, Callable[[argparse.Namespace, Settings], int]] = {
    "run": _run,
    "status": _status,
    "migrate": _migrate,
    "show": _lake_verb,
    "reconcile": _lake_verb,
    "promote": _promote,
    "replay-quarantine": _replay,
    "generate": _generate,
}


if __name__ == "__main__":
    sys.exit(main())
