"""Data contracts: each Kafka topic described by a file, a JSON Schema with an extension block.

A contract (`model.Contract`) says what a topic's records look like (the JSON Schema
document a producer can validate against too) and how the lake keeps them (the
``x-lakehouse`` block: the topic, the write mode, the id or key, the event time, the
tables). `loading` finds the shipped contracts (this package's ``*.json``) and those
of ``INGEST_CONTRACTS_DIR``, and refuses any keyword the engine does not support;
`evolution` decides whether a changed contract is compatible with the tables.
"""
