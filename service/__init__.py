"""lakehouse-ingest: Kafka → Delta Lake streaming ingest on PySpark."""

__version__ = "0.1.0"
