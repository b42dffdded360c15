"""The lake: the table catalogue, Delta writes, checkpoints, the lease, maintenance, storage."""
