"""Command line: ``lakehouse-ingest run|status|generate`` (also ``python -m service``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import structlog

from service.errors import (
    CheckpointMismatchError,
    ConfigError,
    IngestError,
    LeaseHeldError,
)

EXIT_FAILURE = 1
EXIT_CONFIG = 2
EXIT_REFUSED = 3


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
    gen = commands.add_parser("generate", help="produce synthetic users and sensor readings")
    gen.add_argument("--users", type=int, default=100, help="number of distinct users")
    gen.add_argument("--readings", type=int, help="number of sensor readings (count mode)")
    gen.add_argument("--rate", type=float, help="readings per second (rate mode)")
    gen.add_argument(
        "--duration", type=float, help="seconds to run in rate mode (default: forever)"
    )
    gen.add_argument("--seed", type=int, default=0, help="random seed (same seed, same records)")
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
    return parser


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

    log = structlog.get_logger("service")
    try:
        settings = load_settings()
    except ConfigError as e:
        print(f"lakehouse-ingest: {e}", file=sys.stderr)
        return EXIT_CONFIG
    # `status` prints its report on stdout: its own logs go to stderr.
    log_stream = sys.stderr if args.command == "status" else sys.stdout
    configure_logging(settings.log_format, settings.log_level, secret_values(settings), log_stream)
    try:
        if args.command == "run":
            from service.app import run

            return run(settings, available_now=args.available_now)
        if args.command == "status":
            from service.status import collect_status, status_spark

            report = collect_status(status_spark(settings), settings)
            print(report.to_json() if args.json else report.to_text())
            return 0 if report.ok else EXIT_FAILURE
        from service.generator import GeneratorOptions, generate

        if (args.readings is None) == (args.rate is None):
            print(
                "lakehouse-ingest generate: give exactly one of --readings or --rate",
                file=sys.stderr,
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
        )
        summary = generate(settings, options)
        print(summary.to_json())
        return 0
    except ConfigError as e:
        log.error("invalid_configuration", error=str(e))
        return EXIT_CONFIG
    except (CheckpointMismatchError, LeaseHeldError) as e:
        log.error("refusing_to_start", error_class=type(e).__name__, error=str(e))
        return EXIT_REFUSED
    except IngestError as e:
        log.error("failed", error_class=type(e).__name__, error=str(e))
        return EXIT_FAILURE
    except Exception:
        log.exception("crashed")
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
