"""Writing Delta tables idempotently."""
