"""The ingest queries: Kafka records to bronze, validation, quarantine and silver."""
