"""Reading from Kafka."""
