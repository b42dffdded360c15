"""The package's exception root and its specific failures."""


class IngestError(Exception):
    """Base of every error this service raises on purpose."""


class ConfigError(IngestError):
    """Configuration is invalid; the message names the offending key."""


class ContractError(ConfigError):
    """A contract file is invalid or uses a keyword the engine does not support."""


class KafkaAccessRefusedError(ConfigError):
    """The brokers refused the configured credentials or did not pass TLS verification."""


class CheckpointMismatchError(IngestError):
    """A checkpoint and the tables it protects disagree; continuing would lose or duplicate."""


class CheckpointCorruptError(IngestError, ValueError):
    """A checkpoint file is truncated or unparseable; starting would fail or lose the place."""


class KafkaOffsetsLostError(IngestError):
    """Kafka no longer has offsets a checkpoint still has to read (`service.kafka.lost_offsets`)."""


class ContractChangeRefusedError(IngestError):
    """A contract changed in a way the tables it wrote cannot follow (a breaking change)."""


class TableLayoutError(IngestError):
    """A table was written with an earlier layout; `lakehouse-ingest migrate` upgrades it."""


class LeaseHeldError(IngestError):
    """Another live driver owns the storage root."""


class LeaseLostError(IngestError):
    """This driver's lease was taken over by another driver while running."""


class QueryFailedError(IngestError):
    """A streaming query terminated with an exception; the checkpoint makes a restart safe."""


class StorageAccessDeniedError(QueryFailedError):
    """The storage refused a query's request (HTTP 401/403: credentials revoked or rotated)."""


class LocalDiskFullError(QueryFailedError):
    """Spark's local directory (shuffle and spill files) has no space left."""


class UnreachableError(IngestError):
    """A service the driver needs did not answer at start (exit 4: a restart retries)."""


class KafkaUnreachableError(UnreachableError):
    """No Kafka broker answered at the configured bootstrap servers."""


class StorageUnreachableError(UnreachableError):
    """The object store did not answer at the configured endpoint."""


class QueryNotBoundError(IngestError):
    """A micro-batch started before its query was bound to its checkpoint's id."""


class LakeReadError(IngestError):
    """A table could not be read: storage unreachable, or a query failed to run."""


class LakeRequestError(LakeReadError):
    """What was asked of the lake cannot be answered: no such table or version, invalid SQL."""
