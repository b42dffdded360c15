"""The two write modes of a contract, one module each, and the one place a contract's mode is
looked at (`mode_of`).

- ``events`` (`service.ingest.modes.events`): every valid record appended to silver once,
  repeats of an id within the dedup horizon to the duplicates table;
- ``entities`` (`service.ingest.modes.entities`): the newest change per key MERGEd into
  silver, tombstones marking entities deleted.

Each mode owns what differs between them: a tombstone and the key's checks, the typed
record, the silver rows, the columns that name a silver row (``promote``'s merge key), and
its silver writes (the driver's batches and ``replay-quarantine``). `parse_records` is the
one validation of a topic's records, the same for the driver and ``replay-quarantine``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from service.contracts.model import Contract
from service.ingest.fast_path import FAST, FastPath
from service.ingest.modes.entities import Entities
from service.ingest.modes.events import Events
from service.ingest.recipe import Recipe
from service.ingest.rules import (
    contract_violations,
    json_fields,
    member_fields,
    with_member_checks,
    with_other_members,
)
from service.ingest.validation import (
    payload_violations,
    stage_fields,
    with_error,
    with_parsed_payload,
)

WriteMode = Events | Entities


def mode_of(contract: Contract) -> WriteMode:
    """The write mode of ``contract``."""
    return Events(contract) if contract.mode == "events" else Entities(contract)


# The ``error_code`` of a marked row the fast path did not decide (`Validation.mark`): its
# verdict is the exact checks' (`Validation.complete`). Never written to a table.
PENDING = "pending_exact_checks"
# The columns validation adds to the bronze columns.
OUTCOME = ("error_code", "error_detail", "record")
# Whether a marked row's outcome is known (`Validation.mark`).
DECIDED = "_decided"


@dataclass(frozen=True)
class Validation:
    """A contract's validation in two steps: `mark`, the typed fast path over every row,
    then `complete`, the exact checks over the rows it did not decide.

    The exact checks' plan is ~1,000 expressions: built over a batch's rows it would cost
    seconds of py4j calls, and run over rows the fast path decided it costs their code's
    generation and a pass over their columns. So it is recorded once (`recipe`) and
    replayed only on the undecided rows.
    """

    contract: Contract
    max_payload_bytes: int
    skew: int | None
    today: Column
    path: FastPath | None

    @classmethod
    def of(
        cls,
        contract: Contract,
        max_payload_bytes: int,
        max_future_seconds: int | None,
        today: Column | None = None,
        fast: bool = True,
    ) -> Validation:
        """``contract``'s validation; ``max_future_seconds`` (the contract's, else this)
        bounds its event time, ``today`` (default ``current_date()``) its dates; without
        ``fast``, every record takes the exact checks."""
        skew = (
            contract.max_future_seconds
            if contract.max_future_seconds is not None
            else max_future_seconds
        )
        today = today if today is not None else F.current_date()
        path = FastPath.of(contract) if fast else None
        return cls(contract, max_payload_bytes, skew, today, path)

    def mark(self, bronze: DataFrame) -> DataFrame:
        """``bronze`` with `DECIDED` and the outcome (`OUTCOME`) of the rows it holds on:
        the fast path's, and a tombstone's whose key names an entity (its one rule); the
        other rows' ``error_code`` is `PENDING`. Without a fast path, every row is decided
        here by the exact checks."""
        if self.path is None:
            return self.exact(bronze).withColumn(DECIDED, F.lit(True))
        mode = mode_of(self.contract)
        marked = self.path.mark(bronze, self.max_payload_bytes, self.skew, self.today)
        broken = F.lit(False)
        for violation in mode.key_violations():
            broken = broken | F.coalesce(violation.broken, F.lit(False))
        fast = F.col(FAST) | (mode.tombstone() & ~broken)
        return marked.select(
            *bronze.columns,
            fast.alias(DECIDED),
            F.when(~fast, F.lit(PENDING)).alias("error_code"),
            F.lit(None).cast("string").alias("error_detail"),
            F.when(fast, mode.record(self.path)).alias("record"),
        )

    def exact(self, bronze: DataFrame) -> DataFrame:
        """``bronze`` with its outcome (`OUTCOME`) from the exact checks alone."""
        contract, mode = self.contract, mode_of(self.contract)
        staged = stage_fields(
            with_parsed_payload(bronze, self.max_payload_bytes, contract.framing),
            json_fields(contract).values(),
        )
        staged = with_other_members(staged, contract)
        staged = with_member_checks(staged, member_fields(contract), self.today)
        tombstone = mode.tombstone()
        checked = with_error(
            staged,
            [
                *payload_violations(self.max_payload_bytes, tombstone, contract.framing),
                *mode.key_violations(),
                *contract_violations(contract, ~tombstone, self.today, self.skew),
            ],
            [*bronze.columns, mode.record().alias("record")],
        )
        return checked.select(*bronze.columns, *OUTCOME)

    def recipe(self, columns: StructType) -> Recipe:
        """`exact` recorded for rows of ``columns`` (`service.ingest.recipe`)."""
        spark = SparkSession.active()
        return Recipe(self.exact, spark.createDataFrame([], columns))

    def complete(self, marked: DataFrame, checked: DataFrame | None = None) -> DataFrame:
        """`mark`'s rows with their outcome, without `DECIDED`: the exact checks' where the fast
        path left it `PENDING` (``checked``: those rows checked already, with the bronze
        columns and `OUTCOME`, as the driver's `recipe` does; by default `exact` here)."""
        if self.path is None:
            return marked.drop(DECIDED)
        columns = [c for c in marked.columns if c != DECIDED and c not in OUTCOME]
        if checked is None:
            checked = self.exact(marked.where(~F.col(DECIDED)).select(*columns))
        record = checked.schema["record"].dataType
        decided = marked.where(F.col(DECIDED)).select(
            *columns, "error_code", "error_detail", F.col("record").cast(record).alias("record")
        )
        return decided.unionByName(checked.select(*columns, *OUTCOME))


def parse_records(
    contract: Contract,
    bronze: DataFrame,
    max_payload_bytes: int,
    max_future_seconds: int | None,
    today: Column | None = None,
    fast: bool = True,
) -> DataFrame:
    """Validate bronze rows against ``contract``: add ``error_code``/``error_detail`` and
    ``record``, the typed record (complete on valid rows).

    Every input row comes out once, with the bronze columns. ``today`` (a date column,
    default ``current_date()``) bounds dates the contract bounds by "today";
    ``max_future_seconds`` (the contract's, else the setting) bounds its event time.
    Records the contract's `FastPath` finds valid skip the exact checks (unless ``fast``
    is false): the same outcome, for less work (`Validation`).
    """
    validation = Validation.of(contract, max_payload_bytes, max_future_seconds, today, fast)
    return validation.complete(validation.mark(bronze))
