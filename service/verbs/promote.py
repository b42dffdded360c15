"""`lakehouse-ingest promote --topic T FIELD…`: fill a contract's new columns for the rows silver
already holds, from the value each kept in ``_rescued``, exactly once.

A field producers sent before the contract named it sits in ``_rescued`` (a JSON object
of the fields the contract did not know). Once the contract adds it (a compatible
change, applied at start: the column exists, null for those rows), `promote` MERGEs
into silver, for every row whose ``_rescued`` holds the field: the value as the typed
column when it satisfies the field's own schema, and ``_rescued`` without it. A value
the schema refuses stays in ``_rescued`` and is counted as kept.

Exactly once: the MERGE selects only rows whose ``_rescued`` still holds a field, so a run
after a complete one changes nothing and a run after one killed part-way finishes it
(the MERGE is one Delta commit: all of a run's rows or none). Each run writes a
``started`` row to silver/promotions before the MERGE and a ``done`` row with its counts
after it. It runs under the driver lease, with the driver stopped, and applies the
contract to silver first (`service.lake.evolution`), as a driver's start would.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

import structlog
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from service.config import Settings
from service.contracts.model import Contract, Field
from service.errors import ConfigError
from service.ingest.modes import mode_of
from service.ingest.rules import json_field, own_rules, with_member_checks
from service.ingest.validation import json_object, stage_fields
from service.lake.checkpoints import APP_ID_PREFIX
from service.lake.delta import append_once, ensure_table
from service.lake.evolution import apply_evolution, plan_evolution
from service.lake.lakeview import LakeReader
from service.lake.lease import acquire_driver_lease
from service.lake.local_rows import local_frame
from service.lake.merge import merge_once
from service.lake.object_files import ObjectFiles
from service.lake.schemas import PROMOTIONS, RESCUED
from service.lake.tables import PROMOTIONS_TABLE, contract_tables
from service.streaming.session import build_spark

log = structlog.get_logger(__name__)

_STARTED, _DONE = 0, 1  # txn versions of a run's two audit rows
_MERGE = 0  # txn version of its silver MERGE


@dataclass(frozen=True)
class PromoteReport:
    """What a run did: its rows promoted and kept, and the earlier runs it found unfinished."""

    run_id: str
    contract: str
    table: str
    fields: list[str]
    rows_promoted: int
    rows_kept: int
    unfinished: list[str]

    def to_json(self) -> str:
        """The report as one JSON document."""
        return json.dumps(asdict(self))

    def to_text(self) -> str:
        """The report for a terminal."""
        lines = [
            f"promoted {', '.join(self.fields)} in {self.table} (contract {self.contract}, "
            f"run {self.run_id}): {self.rows_promoted} rows",
            f"  kept in _rescued (invalid under the contract): {self.rows_kept} rows",
        ]
        if self.unfinished:
            lines.append(f"  earlier runs killed part-way, finished by this one: "
                         f"{', '.join(self.unfinished)}")  # fmt: skip
        return "\n".join(lines)


def promotable(contract: Contract, names: list[str]) -> list[Field]:
    """The top-level, non-object fields ``names`` of ``contract``; `ConfigError` otherwise."""
    fields = []
    top_level = [f.path for f in contract.leaves if "." not in f.path and not f.others]
    for name in names:
        if name not in top_level:
            raise ConfigError(
                f"promote: {name!r} is not a top-level field of contract {contract.name} "
                f"(fields: {', '.join(top_level)})"
            )
        fields.append(contract.field(name))
    return fields


def promoted_rows(
    silver: DataFrame, contract: Contract, fields: list[Field], identity: list[str]
) -> DataFrame:
    """For each silver row whose ``_rescued`` holds one of ``fields``: its ``identity``, each
    field's typed value where it satisfies the field's schema (else its current column),
    ``_rescued`` without the promoted ones, and whether any was promoted (pure)."""
    named = [F.col(f"`{RESCUED.name}`").contains(f'"{f.path}":') for f in fields]
    holding = silver.where(F.col(RESCUED.name).isNotNull() & _any(named))
    parsed = holding.withColumn(
        "_json", F.try_parse_json(F.concat(F.lit("["), F.col(RESCUED.name), F.lit("]")))
    )
    staged_fields = {f.path: json_field(f) for f in fields}
    today = F.current_date()
    staged = with_member_checks(
        stage_fields(parsed, staged_fields.values()),
        [(f, staged_fields[f.path]) for f in fields],
        today,
    )
    staged = staged.where(_any([f.kind.isNotNull() for f in staged_fields.values()]))
    values: dict[str, Column] = {}
    good: dict[str, Column] = {}
    for f in fields:
        field = staged_fields[f.path]
        broken = [r.broken for r in own_rules(f, field, today)]
        valid = field.kind.isNotNull() & ~F.coalesce(_any(broken), F.lit(False))
        good[f.path] = valid
        assert f.data_type is not None
        values[f.column] = F.when(valid, field.as_type(f.data_type)).otherwise(F.col(f.column))
    kept = F.map_filter(
        json_object(F.col("_json")),
        lambda k, _: ~_any([(k == F.lit(path)) & valid for path, valid in good.items()]),
    )
    return staged.select(
        *identity,
        *[values[f.column].alias(f.column) for f in fields],
        F.when(F.size(kept) > 0, F.to_json(kept)).alias(RESCUED.name),
        _any(list(good.values())).alias("_promoted"),
    )


def _any(conditions: list[Column]) -> Column:
    result = F.lit(False)
    for condition in conditions:
        result = result | condition
    return result


def promote(settings: Settings, topic: str, names: list[str]) -> PromoteReport:
    """The ``promote`` verb: under the driver lease, apply the contract, then promote."""
    contracts = settings.contracts
    matches = [c for c in contracts if topic in (c.topic, c.name)]
    if not matches:
        raise ConfigError(f"promote: no contract reads topic {topic!r}")
    contract = matches[0]
    fields = promotable(contract, names)
    lease = acquire_driver_lease(settings)
    try:
        reader = LakeReader.from_settings(settings)
        plans = plan_evolution(contracts, reader.root, reader.options)
        spark = build_spark(settings, "lakehouse-ingest-promote", jvm_log_target="SYSTEM_ERR")
        apply_evolution(spark, settings.storage_uri, [p for p in plans if p.exists], lease.fence)
        return _Promoter(spark, settings, contract, lease.fence).run(fields)
    finally:
        lease.release()


class _Promoter:
    """One run over one contract's silver table."""

    def __init__(
        self,
        spark: SparkSession,
        settings: Settings,
        contract: Contract,
        fence: Callable[[], None],
    ) -> None:
        self.spark = spark
        self.settings = settings
        self.contract = contract
        self.fence = fence
        self.silver = contract_tables(contract).silver
        self.audit_uri = PROMOTIONS_TABLE.uri(settings.storage_uri)

    def _audit(
        self, run_id: str, fields: list[Field], outcome: str, counts: tuple[int, int] | None
    ) -> None:
        row = local_frame(
            self.spark,
            [(run_id, self.contract.name, self.silver.name, ",".join(f.path for f in fields),
              outcome, datetime.now(UTC), *(counts or (None, None)))],
            PROMOTIONS,
        )  # fmt: skip
        app_id = f"{APP_ID_PREFIX}:promote:{run_id}"
        append_once(row, self.audit_uri, app_id, _STARTED if outcome == "started" else _DONE)

    def unfinished(self) -> list[str]:
        """Runs with a ``started`` row and no ``done`` one (killed part-way)."""
        audit = self.spark.read.format("delta").load(self.audit_uri)
        runs = (
            audit.where(F.col("contract") == self.contract.name)
            .groupBy("run_id")
            .agg(F.max(F.when(F.col("outcome") == "done", 1).otherwise(0)).alias("done"))
        )
        return sorted(str(r["run_id"]) for r in runs.where(F.col("done") == 0).collect())

    def run(self, fields: list[Field]) -> PromoteReport:
        ensure_table(ObjectFiles(self.settings), self.audit_uri, PROMOTIONS_TABLE)
        unfinished = self.unfinished()
        run_id = uuid.uuid4().hex
        self._audit(run_id, fields, "started", None)
        log.info("promote_started", run_id=run_id, contract=self.contract.name,
                 fields=[f.path for f in fields], unfinished=unfinished)  # fmt: skip
        uri = self.silver.uri(self.settings.storage_uri)
        silver = self.spark.read.format("delta").load(uri)
        identity = list(mode_of(self.contract).identity)
        rows = promoted_rows(silver, self.contract, fields, identity).persist()
        try:
            promoted = rows.where("_promoted").count()
            kept = rows.count() - promoted
            if promoted:
                on = " AND ".join(f"t.`{c}` = s.`{c}`" for c in identity)
                update = {f"`{f.column}`": f"s.`{f.column}`" for f in fields}
                update[RESCUED.name] = f"s.{RESCUED.name}"
                self.fence()
                merge_once(
                    rows.where("_promoted"),
                    uri,
                    f"{APP_ID_PREFIX}:promote:{run_id}",
                    _MERGE,
                    (on, "TRUE", dict(update), {}),
                )
        finally:
            rows.unpersist()
        self._audit(run_id, fields, "done", (promoted, kept))
        report = PromoteReport(
            run_id, self.contract.name, self.silver.name, [f.path for f in fields],
            promoted, kept, unfinished,
        )  # fmt: skip
        log.info("promoted", **asdict(report))
        return report
