"""Kafka: the source's options, administration, offsets and lag, lost offsets."""
