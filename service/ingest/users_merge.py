"""The idempotent MERGE of user changes into silver/users.

The row's state is a function of the set of changes ever seen, not of their
order or of how they fell into micro-batches: the profile (and ``updated_at``,
``_rescued``, lineage) is that of the newest upsert by (updated_at, partition,
offset), so an older ``updated_at`` never overwrites a newer one; the user is
deleted (``is_deleted``, ``deleted_at`` = the newest tombstone's arrival) while
no upsert is newer than that tombstone, so a newer upsert resurrects. A
tombstone for an unknown user inserts a deleted row without a profile. The
MERGE commits with ``txnAppId``/``txnVersion`` so that Delta skips a replayed
micro-batch as a whole (and replaying a change is a no-op anyway).
"""

from __future__ import annotations

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame

from service.lake.schemas import INGESTED_AT, LINEAGE, RESCUED, USER_PROFILE

_TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION = "spark.databricks.delta.write.txnVersion"
_MATERIALIZE_SOURCE = "spark.databricks.delta.merge.materializeSource"

_PROFILE = (*USER_PROFILE.fieldNames(), RESCUED.name)
_LINEAGE = (*(c.name for c in LINEAGE), INGESTED_AT.name)
# The batch's newest upsert beats the row's profile: (updated_at, partition, offset) order.
_PROFILE_NEWER = (
    "s.upsert IS NOT NULL AND (t.updated_at IS NULL OR"
    " struct(s.upsert.updated_at, s.upsert.kafka_partition, s.upsert.kafka_offset)"
    " > struct(t.updated_at, t.kafka_partition, t.kafka_offset))"
)
_UPDATED_AT = f"CASE WHEN {_PROFILE_NEWER} THEN s.upsert.updated_at ELSE t.updated_at END"
# A deletion stands while no upsert is newer; a tombstone wins a tie with an upsert.
_DELETED_AT = (
    "CASE WHEN greatest(t.deleted_at, s.tombstone_at) >= "
    f"coalesce({_UPDATED_AT}, TIMESTAMP'0001-01-01 00:00:00') "
    "THEN greatest(t.deleted_at, s.tombstone_at) END"
)
_TOMBSTONE_NEWER = (
    "s.tombstone_at IS NOT NULL AND (t.deleted_at IS NULL OR s.tombstone_at > t.deleted_at)"
    " AND (t.updated_at IS NULL OR s.tombstone_at >= t.updated_at)"
)
_UPDATE: dict[str, str | Column] = {
    **{c: f"CASE WHEN {_PROFILE_NEWER} THEN s.upsert.{c} ELSE t.{c} END" for c in _PROFILE},
    "deleted_at": _DELETED_AT,
    "is_deleted": f"({_DELETED_AT}) IS NOT NULL",
    # Lineage is the upsert's that set the profile (the tombstone's while there is none).
    **{
        c: f"CASE WHEN {_PROFILE_NEWER} THEN s.upsert.{c} "
        f"WHEN t.updated_at IS NULL AND {_TOMBSTONE_NEWER} THEN s.tombstone.{c} ELSE t.{c} END"
        for c in _LINEAGE
    },
}
_INSERT_DELETED_AT = (
    "CASE WHEN s.tombstone_at >= coalesce(s.upsert.updated_at, TIMESTAMP'0001-01-01 00:00:00')"
    " THEN s.tombstone_at END"
)
_INSERT: dict[str, str | Column] = {
    "user_id": "s.user_id",
    **{c: f"s.upsert.{c}" for c in _PROFILE},
    "deleted_at": _INSERT_DELETED_AT,
    "is_deleted": f"({_INSERT_DELETED_AT}) IS NOT NULL",
    **{c: f"coalesce(s.upsert.{c}, s.tombstone.{c})" for c in _LINEAGE},
}


def merge_users_once(
    latest_changes: DataFrame, uri: str, txn_app_id: str, txn_version: int
) -> None:
    """MERGE one row per user (see `latest_user_changes`) into the table at ``uri``.

    Delta reads the txn pair from the session conf; it is set on the DataFrame's
    own session (inside ``foreachBatch``, the query's) and unset afterwards,
    because Delta 4.0 does not reset it by default and any later write from the
    session would carry it.

    Delta would first copy a source that is not a Delta scan, so that its two passes
    (find the touched files, rewrite them) see the same rows. Ours is a deterministic
    aggregate of the batch's cached rows, read again from the same Kafka offsets if a
    cached block is lost: the copy (one more job per batch) is skipped.
    """
    session = latest_changes.sparkSession
    target = DeltaTable.forPath(session, uri)
    session.conf.set(_TXN_APP_ID, txn_app_id)
    session.conf.set(_TXN_VERSION, str(txn_version))
    session.conf.set(_MATERIALIZE_SOURCE, "none")
    try:
        (
            target.alias("t")
            .merge(latest_changes.alias("s"), "t.user_id = s.user_id")
            .whenMatchedUpdate(condition=f"({_PROFILE_NEWER}) OR ({_TOMBSTONE_NEWER})", set=_UPDATE)
            .whenNotMatchedInsert(values=_INSERT)
            .execute()
        )
    finally:
        session.conf.unset(_TXN_APP_ID)
        session.conf.unset(_TXN_VERSION)
        session.conf.unset(_MATERIALIZE_SOURCE)
