"""The idempotent MERGE of user changes into silver/users.

A change applies only if it is newer than the row's last applied change,
compared as (change time, Kafka partition, Kafka offset) against
(greatest(updated_at, deleted_at), kafka_partition, kafka_offset) of the row: an
older change never overwrites a newer one, and replaying an applied change is a
no-op. An upsert newer than a delete resurrects the user; a tombstone marks the
row deleted and keeps the profile; a tombstone for an unknown user inserts a
deleted row. The MERGE commits with ``txnAppId``/``txnVersion`` so that Delta
skips a replayed micro-batch as a whole.
"""

from __future__ import annotations

from delta.tables import DeltaTable
from pyspark.sql import DataFrame

_TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION = "spark.databricks.delta.write.txnVersion"

_NEWER = (
    "struct(s.change_time, s.kafka_partition, s.kafka_offset)"
    " > struct(greatest(t.updated_at, t.deleted_at), t.kafka_partition, t.kafka_offset)"
)
_LINEAGE = {
    "kafka_topic": "s.kafka_topic",
    "kafka_partition": "s.kafka_partition",
    "kafka_offset": "s.kafka_offset",
    "kafka_timestamp": "s.kafka_timestamp",
    "ingested_at": "s.ingested_at",
}
_PROFILE = {
    "first_name": "s.first_name",
    "last_name": "s.last_name",
    "dob": "s.dob",
    "gender": "s.gender",
    "country": "s.country",
    "updated_at": "s.updated_at",
}
_UPSERT = {
    **_PROFILE,
    "is_deleted": "false",
    "deleted_at": "null",
    "_rescued": "s._rescued",
    **_LINEAGE,
}
# A tombstone carries no profile: the row keeps the one it had.
_DELETE = {"is_deleted": "true", "deleted_at": "s.change_time", **_LINEAGE}


def merge_users_once(
    latest_changes: DataFrame, uri: str, txn_app_id: str, txn_version: int
) -> None:
    """MERGE one change per user (see `latest_user_changes`) into the table at ``uri``.

    Delta reads the txn pair from the session conf; it is set on the DataFrame's
    own session (inside ``foreachBatch``, the query's) and unset afterwards,
    because Delta 4.0 does not reset it by default and any later write from the
    session would carry it.
    """
    session = latest_changes.sparkSession
    target = DeltaTable.forPath(session, uri)
    session.conf.set(_TXN_APP_ID, txn_app_id)
    session.conf.set(_TXN_VERSION, str(txn_version))
    try:
        (
            target.alias("t")
            .merge(latest_changes.alias("s"), "t.user_id = s.user_id")
            .whenMatchedUpdate(
                condition=f"s.is_tombstone AND {_NEWER}", set=_DELETE
            )
            .whenMatchedUpdate(condition=f"NOT s.is_tombstone AND {_NEWER}", set=_UPSERT)
            .whenNotMatchedInsert(
                condition="s.is_tombstone",
                values={"user_id": "s.user_id", **_DELETE},
            )
            .whenNotMatchedInsert(values={"user_id": "s.user_id", **_UPSERT})
            .execute()
        )
    finally:
        session.conf.unset(_TXN_APP_ID)
        session.conf.unset(_TXN_VERSION)

