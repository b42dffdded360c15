"""The local Kafka and MinIO servers really work: data round-trips and survives restarts."""

import uuid
from pathlib import Path

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)
from devstack import KafkaBroker, MinioServer

pytestmark = pytest.mark.integration

Record = tuple[int, int, bytes]


def produce(bootstrap: str, topic: str, values: list[bytes]) -> set[Record]:
    """Produce keyed values; return the acknowledged (partition, offset, value)."""
    acked: set[Record] = set()
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(err)
        else:
            acked.add((msg.partition() or 0, msg.offset() or 0, msg.value() or b""))

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i, value in enumerate(values):
        producer.produce(topic, value, key=f"key-{i}".encode(), on_delivery=on_delivery)
    assert producer.flush(30) == 0
    assert errors == []
    return acked


def consume_all(bootstrap: str, topic: str, partitions: int, count: int) -> set[Record]:
    """Read `count` records from the start of every partition."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-{uuid.uuid4()}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    seen: set[Record] = set()
    try:
        for _ in range(300):
            if len(seen) >= count:
                break
            for msg in consumer.consume(num_messages=500, timeout=0.1):
                assert msg.error() is None, msg.error()
                seen.add((msg.partition() or 0, msg.offset() or 0, msg.value() or b""))
    finally:
        consumer.close()
    return seen


def test_kafka_produce_consume_round_trip(kafka_broker: KafkaBroker) -> None:
    kafka_broker.create_topics(["round-trip"], partitions=3)
    kafka_broker.create_topics(["round-trip"], partitions=3)  # idempotent
    values = [f"value-{i}".encode() for i in range(300)]

    acked = produce(kafka_broker.bootstrap_servers, "round-trip", values)

    assert sorted(v for _, _, v in acked) == sorted(values)
    assert {p for p, _, _ in acked} == {0, 1, 2}
    assert consume_all(kafka_broker.bootstrap_servers, "round-trip", 3, len(values)) == acked


def test_kafka_data_survives_stop_and_kill(tmp_path: Path) -> None:
    with KafkaBroker(tmp_path / "kafka") as broker:
        broker.create_topics(["durable"], partitions=3)
        first = produce(broker.bootstrap_servers, "durable", [b"a", b"b", b"c", b"d"])

        broker.stop()
        assert not broker.running
        broker.start()
        second = produce(broker.bootstrap_servers, "durable", [b"e", b"f"])
        assert consume_all(broker.bootstrap_servers, "durable", 3, 6) == first | second

        broker.kill()
        broker.start()
        assert consume_all(broker.bootstrap_servers, "durable", 3, 6) == first | second


def test_s3_put_get_list(minio_server: MinioServer) -> None:
    s3 = minio_server.s3_client()
    minio_server.create_bucket("lakehouse")  # idempotent
    prefix = f"rt-{uuid.uuid4()}/"
    objects = {f"{prefix}part-{i}.txt": f"payload {i}".encode() for i in range(3)}
    for key, body in objects.items():
        s3.put_object(Bucket="lakehouse", Key=key, Body=body)

    listed = s3.list_objects_v2(Bucket="lakehouse", Prefix=prefix)
    assert sorted(o["Key"] for o in listed["Contents"]) == sorted(objects)
    for key, body in objects.items():
        assert s3.get_object(Bucket="lakehouse", Key=key)["Body"].read() == body


def test_minio_objects_survive_stop_and_kill(tmp_path: Path) -> None:
    with MinioServer(tmp_path / "minio") as server:
        server.create_bucket("keep")
        server.s3_client().put_object(Bucket="keep", Key="k", Body=b"kept")

        server.stop()
        server.start()
        assert server.s3_client().get_object(Bucket="keep", Key="k")["Body"].read() == b"kept"

        server.kill()
        server.start()
        assert server.s3_client().get_object(Bucket="keep", Key="k")["Body"].read() == b"kept"


def test_missing_binaries_explain_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKEHOUSE_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(RuntimeError, match="make kafka-jars"):
        KafkaBroker(tmp_path / "kafka").start()
    with pytest.raises(RuntimeError, match="make minio"):
        MinioServer(tmp_path / "minio").start()
