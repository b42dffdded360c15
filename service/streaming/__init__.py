"""The streaming machinery ingest and gold share: the Spark session, the query runner."""
