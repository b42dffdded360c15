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

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from service.contracts.model import Contract
from service.ingest.fast_path import FAST, FastPath
from service.ingest.modes.entities import Entities
from service.ingest.modes.events import Events
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
    is false): the same outcome, for less work.
    """
    mode = mode_of(contract)
    skew = (
        contract.max_future_seconds
        if contract.max_future_seconds is not None
        else max_future_seconds
    )
    today = today if today is not None else F.current_date()
    path = FastPath.of(contract) if fast else None
    marked = path.mark(bronze, max_payload_bytes, skew) if path is not None else bronze
    skip = F.col(FAST) if path is not None else None
    staged = stage_fields(
        with_parsed_payload(marked, max_payload_bytes, contract.framing, skip),
        json_fields(contract).values(),
    )
    staged = with_other_members(staged, contract)
    staged = with_member_checks(staged, member_fields(contract), today)
    tombstone = mode.tombstone()
    checked = with_error(
        staged,
        [
            *payload_violations(max_payload_bytes, tombstone, contract.framing),
            *mode.key_violations(),
            *contract_violations(contract, ~tombstone, today, skew),
        ],
        [*bronze.columns, mode.record(path).alias("record")],
        skip,
    )
    return checked.select(*bronze.columns, "error_code", "error_detail", "record")
