"""Synthetic users and sensor readings produced to Kafka, reproducible from a seed.

Each user wears a watch (heart rate + accelerometer) and some own a thermometer;
a few weather stations belong to nobody (``user_id`` null). Values are
realistic for the sensor type and the wearer's current activity. Optional
fractions of the reading slots become bad records (several kinds the contract
rejects), late readings, re-sent duplicates (same payload and event id),
profile updates (a fifth of them stale) and tombstones; every record is
counted under one category, so a run can be reconciled. With a transaction size,
records go out in Kafka transactions, a fraction of them aborted: an aborted
transaction's records count as ``<topic>.aborted``, whatever they were.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from types import FrameType
from typing import Any

import structlog
from confluent_kafka import KafkaError, Message, Producer

from service.config import Settings
from service.errors import IngestError
from service.kafka.admin import ensure_topics

log = structlog.get_logger(__name__)

FIRST_NAMES = ("Ada", "Grace", "Alan", "Edsger", "Barbara", "Ken", "Radia", "Linus", "Margaret")
LAST_NAMES = (
    "Lovelace",
    "Hopper",
    "Turing",
    "Dijkstra",
    "Liskov",
    "Thompson",
    "Perlman",
    "Hamilton",
)
COUNTRIES = (("Paris", "FR"), ("Berlin", "DE"), ("Lisbon", "PT"), ("Austin", "US"), ("Osaka", "JP"))
ACTIVITIES = ("stand", "sit", "walk", "bike", "stairsup", "stairsdown")
# Typical heart rate (bpm) and acceleration spread (m/s²) per activity.
ACTIVITY_PROFILE = {
    "stand": (72.0, 0.3),
    "sit": (65.0, 0.2),
    "walk": (100.0, 1.5),
    "bike": (135.0, 2.5),
    "stairsup": (125.0, 2.0),
    "stairsdown": (105.0, 2.0),
}
MODELS = ("watch-a1", "watch-b2", "thermo-t9", "station-s3")
STATIONS = 5
# json.dumps' output without its per-call set-up and cycle check (records are trees).
_to_json = json.JSONEncoder(check_circular=False).encode
# Delivery reports are served at most this often (and at the end, by flush): about
# every 1,000 records at 10,000 readings/s, after every record at a slow rate.
_POLL_SECONDS = 0.1


@dataclass(frozen=True)
class GeneratorOptions:
    """What to produce: a count of readings, or a rate for a duration."""

    users: int = 100
    readings: int | None = None
    rate: float | None = None
    duration: float | None = None
    seed: int = 0
    partitions: int = 3
    bad_fraction: float = 0.0
    late_fraction: float = 0.0
    duplicate_fraction: float = 0.0
    user_update_fraction: float = 0.0
    tombstone_fraction: float = 0.0
    # Records per Kafka transaction (0: a plain idempotent producer), and the fraction of
    # transactions aborted.
    transaction_size: int = 0
    abort_fraction: float = 0.0


@dataclass
class GeneratorSummary:
    """Counts of what was produced, per topic and category."""

    seed: int
    produced: Counter[str] = field(default_factory=Counter)
    by_category: Counter[str] = field(default_factory=Counter)
    delivery_errors: int = 0

    def to_json(self) -> str:
        """One JSON line for the console and for tests."""
        return json.dumps(
            {
                "seed": self.seed,
                "produced": dict(self.produced),
                "by_category": dict(self.by_category),
                "delivery_errors": self.delivery_errors,
            },
            sort_keys=True,
        )


@dataclass(frozen=True)
class Device:
    """A sensor device and the user who owns it (None for stations)."""

    device_id: str
    user_id: int | None
    sensor_types: tuple[str, ...]
    model: str
    city: str
    country: str


class RecordFactory:
    """Makes user profiles and readings from one seeded random stream."""

    def __init__(self, users: int, seed: int) -> None:
        self._rng = random.Random(seed)
        self.users = users
        self.devices: list[Device] = []
        self._activity: dict[int, str] = {}
        for user_id in range(1, users + 1):
            city, country = self._rng.choice(COUNTRIES)
            self.devices.append(
                Device(
                    f"watch-{user_id:06d}",
                    user_id,
                    ("heart_rate", "accelerometer"),
                    self._rng.choice(MODELS[:2]),
                    city,
                    country,
                )
            )
            if self._rng.random() < 0.5:
                self.devices.append(
                    Device(
                        f"thermo-{user_id:06d}", user_id, ("temperature",), MODELS[2], city, country
                    )
                )
        for station in range(1, STATIONS + 1):
            city, country = COUNTRIES[station % len(COUNTRIES)]
            self.devices.append(
                Device(f"station-{station:03d}", None, ("temperature",), MODELS[3], city, country)
            )

    def _uuid(self) -> str:
        return uuid4_text(self._rng.getrandbits(128))

    def user(self, user_id: int, updated_at: datetime) -> dict[str, Any]:
        """A full profile of ``user_id`` as of ``updated_at``."""
        dob = date(1940, 1, 1) + timedelta(days=self._rng.randrange(0, 70 * 365))
        country = self._rng.choice(COUNTRIES)[1]
        return {
            "user_id": user_id,
            "first_name": self._rng.choice(FIRST_NAMES),
            "last_name": self._rng.choice(LAST_NAMES),
            "dob": dob.isoformat(),
            "gender": self._rng.choice(("F", "M", "X")),
            "country": country,
            "updated_at": _iso(updated_at),
        }

    def reading(self, event_time: datetime) -> tuple[Device, dict[str, Any]]:
        """One valid reading from a random device at ``event_time``."""
        device = self._rng.choice(self.devices)
        sensor_type = self._rng.choice(device.sensor_types)
        record: dict[str, Any] = {
            "event_id": self._uuid(),
            "device_id": device.device_id,
            "user_id": device.user_id,
            "sensor_type": sensor_type,
            "event_time": _iso(event_time),
            "model": device.model,
            "geolocation": {"city": device.city, "country": device.country},
        }
        activity = self._current_activity(device.user_id)
        bpm_mean, spread = ACTIVITY_PROFILE[activity]
        if sensor_type == "heart_rate":
            record["value"] = round(min(220.0, max(35.0, self._rng.gauss(bpm_mean, 8))), 1)
            record["unit"] = "bpm"
        elif sensor_type == "temperature":
            celsius = round(self._rng.gauss(36.8 if device.user_id else 18.0, 1.2), 2)
            record["value"] = celsius
            record["unit"] = "C"
            record["danger_level"] = (
                "HIGH" if celsius >= 39 else "MEDIUM" if celsius >= 38 else "LOW"
            )
        else:
            x, y = self._rng.gauss(0, spread), self._rng.gauss(0, spread)
            z = 9.81 + self._rng.gauss(0, spread)
            record.update({"x": round(x, 4), "y": round(y, 4), "z": round(z, 4)})
            record["activity"] = activity
            record["unit"] = "m/s2"
        return device, record

    def bad_reading(self, event_time: datetime) -> tuple[str, bytes]:
        """A reading the contract rejects, one of several kinds, keyed like a real one."""
        device, record = self.reading(event_time)
        kind = self._rng.randrange(9)
        if kind == 0:
            return device.device_id, b""
        if kind == 1:
            return device.device_id, json.dumps(record).encode()[:25]
        if kind == 2:
            return device.device_id, b'{"event_id": "\xff\xfe"}'
        if kind == 3:
            return device.device_id, json.dumps([record]).encode()
        if kind == 4:
            del record["event_id"]
        elif kind == 5:
            record["event_time"] = "not a time"
        elif kind == 6:
            record["sensor_type"] = "pressure"
        elif kind == 7:
            record.update({"sensor_type": "heart_rate", "value": 400.0, "unit": "bpm"})
        else:
            record["event_time"] = _iso(event_time + timedelta(days=1))
        return device.device_id, json.dumps(record).encode()

    def late_time(self, now: datetime) -> datetime:
        """An event time 15 minutes to 2 hours in the past (beyond the default watermark)."""
        return now - timedelta(seconds=self._rng.uniform(15 * 60, 2 * 3600))

    def random_user(self) -> int:
        """A random existing user id."""
        return self._rng.randint(1, self.users)

    def stale_time(self, now: datetime) -> datetime:
        """An ``updated_at`` one to thirty days old: must never win over a newer profile."""
        return now - timedelta(days=self._rng.uniform(1, 30))

    def roll(self) -> float:
        """A uniform draw in [0, 1) from the seeded stream."""
        return self._rng.random()

    def _current_activity(self, user_id: int | None) -> str:
        if user_id is None:
            return "stand"
        if user_id not in self._activity or self._rng.random() < 0.05:
            self._activity[user_id] = self._rng.choice(ACTIVITIES)
        return self._activity[user_id]


def uuid4_text(bits: int) -> str:
    """``str(uuid.UUID(int=bits, version=4))`` without building the object (pure)."""
    bits = (bits & ~(0xC000 << 48)) | (0x8000 << 48)  # the RFC 4122 variant
    bits = (bits & ~(0xF000 << 64)) | (4 << 76)  # version 4
    h = f"{bits:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def count_schedule(readings: int, end: datetime) -> Iterator[datetime]:
    """Event times of ``readings`` readings in count mode: 1 ms apart, the last at ``end``.

    Every one is in the past when produced, like a real device's: counted forward from
    the start instead, a backlog of more than 300,000 readings (`make bench`) ran
    beyond ``INGEST_MAX_FUTURE_SECONDS`` and its tail was quarantined as
    ``event_time_in_future``.
    """
    for i in range(readings):
        yield end - timedelta(milliseconds=readings - 1 - i)


def _schedule(options: GeneratorOptions, stop: list[bool]) -> Iterator[datetime]:
    """Event times of the readings to produce, paced in rate mode."""
    if options.readings is not None:
        yield from count_schedule(options.readings, datetime.now(UTC))
        return
    assert options.rate is not None
    began = time.monotonic()
    sent = 0
    while not stop[0]:
        elapsed = time.monotonic() - began
        if options.duration is not None and elapsed >= options.duration:
            return
        due = math.floor(elapsed * options.rate) + 1
        if sent >= due:
            # Until the next reading is due, but at least 1 ms: a fast rate then goes out
            # in small bursts instead of a wake-up per reading.
            time.sleep(min(0.05, max(0.001, sent / options.rate - elapsed)))
            continue
        sent += 1
        yield datetime.now(UTC)


def users_topic(settings: Settings) -> str:
    """The topic of the users contract, which the generator's profiles follow."""
    return settings.contracts["users"].topic


def sensors_topic(settings: Settings) -> str:
    """The topic of the sensors contract, which the generator's readings follow."""
    return settings.contracts["sensors"].topic


def _user_change(
    settings: Settings,
    options: GeneratorOptions,
    factory: RecordFactory,
    now: datetime,
    send: Callable[[str, str, dict[str, Any] | bytes | None, str], None],
) -> None:
    """Maybe send a profile update (a fifth of them stale) or a tombstone of a random user."""
    roll = factory.roll()
    if roll < options.tombstone_fraction:
        send(users_topic(settings), str(factory.random_user()), None, "users.tombstone")
    elif roll < options.tombstone_fraction + options.user_update_fraction:
        user_id = factory.random_user()
        if factory.roll() < 0.2:
            send(
                users_topic(settings),
                str(user_id),
                factory.user(user_id, factory.stale_time(now)),
                "users.stale_update",
            )
        else:
            send(
                users_topic(settings),
                str(user_id),
                factory.user(user_id, now),
                "users.update",
            )


class Transaction:
    """The generator's Kafka transactions (with a transaction size; else a pass-through).

    Categories and deliveries of the records sent in the open transaction count once it
    commits; when it aborts, its records count as ``<topic>.aborted`` instead.
    """

    def __init__(
        self,
        options: GeneratorOptions,
        summary: GeneratorSummary,
        recent: deque[tuple[str, dict[str, Any]]] | None = None,
    ) -> None:
        self._size = options.transaction_size
        # The readings a duplicate may repeat: an aborted transaction's leave it (a
        # repeat of a reading that was never committed would be no duplicate).
        self._recent = recent if recent is not None else deque()
        self._recent_sent = 0
        self._abort = options.abort_fraction
        self._summary = summary
        self._rng = random.Random(options.seed + 1)
        self._categories: Counter[str] = Counter()
        self._delivered: Counter[str] = Counter()

    def begin(self, producer: Producer) -> None:
        """Start the producer's first transaction."""
        if self._size:
            producer.init_transactions()
            producer.begin_transaction()

    def delivered(self, topic: str) -> None:
        """A record of ``topic`` was acknowledged."""
        (self._delivered if self._size else self._summary.produced)[topic] += 1

    def sent(self, category: str) -> None:
        """A record of ``category`` was produced."""
        if not self._size:
            self._summary.by_category[category] += 1
            return
        self._categories[category] += 1

    def remember(self, key: str, reading: dict[str, Any]) -> None:
        """Keep ``reading`` as one a later duplicate may repeat."""
        self._recent.append((key, reading))
        self._recent_sent += 1

    def maybe_end(self, producer: Producer) -> None:
        """Commit or abort the open transaction once it holds its size, and begin the next."""
        if self._size and sum(self._categories.values()) >= self._size:
            self.end(producer)
            producer.begin_transaction()

    def end(self, producer: Producer) -> None:
        """Commit or abort the open transaction (a roll against the abort fraction)."""
        if not self._size or not self._categories:
            return
        producer.flush()  # every record acknowledged: its delivery report served
        if self._rng.random() < self._abort:
            producer.abort_transaction()
            for category, count in self._categories.items():
                self._summary.by_category[category.split(".")[0] + ".aborted"] += count
            for _ in range(min(self._recent_sent, len(self._recent))):
                self._recent.pop()
        else:
            producer.commit_transaction()
            self._summary.by_category.update(self._categories)
            self._summary.produced.update(self._delivered)
        self._categories.clear()
        self._delivered.clear()
        self._recent_sent = 0


def generate(settings: Settings, options: GeneratorOptions) -> GeneratorSummary:
    """Produce every user's profile, then readings; return what was delivered."""
    topics = [users_topic(settings), sensors_topic(settings)]
    ensure_topics(settings, topics, options.partitions)
    summary = GeneratorSummary(options.seed)

    sent: deque[tuple[str, dict[str, Any]]] = deque(maxlen=100)
    transaction = Transaction(options, summary, sent)

    def delivered(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            summary.delivery_errors += 1
            log.error("delivery_failed", topic=msg.topic(), error=str(err))
        else:
            transaction.delivered(str(msg.topic()))

    config = {
        **settings.kafka.librdkafka_config(),
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 20,
        "compression.type": "lz4",
    }
    if options.transaction_size:
        config["transactional.id"] = f"lakehouse-ingest-generate-{options.seed}-{os.getpid()}"
    producer = Producer(config)
    transaction.begin(producer)
    stop = [False]

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop[0] = True

    previous = signal.signal(signal.SIGTERM, on_signal), signal.signal(signal.SIGINT, on_signal)
    factory = RecordFactory(options.users, options.seed)
    polled_at = time.monotonic()

    def send(topic: str, key: str, value: dict[str, Any] | bytes | None, category: str) -> None:
        nonlocal polled_at
        payload = value if value is None or isinstance(value, bytes) else _to_json(value).encode()
        while True:
            try:
                producer.produce(topic, key=key.encode(), value=payload, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.5)
        transaction.sent(category)
        transaction.maybe_end(producer)
        now = time.monotonic()
        if now - polled_at >= _POLL_SECONDS:
            producer.poll(0)
            polled_at = now

    try:
        now = datetime.now(UTC)
        for user_id in range(1, options.users + 1):
            send(
                users_topic(settings),
                str(user_id),
                factory.user(user_id, now),
                "users.profile",
            )
        for event_time in _schedule(options, stop):
            _user_change(settings, options, factory, event_time, send)
            roll = factory.roll()
            if roll < options.bad_fraction:
                key, payload = factory.bad_reading(event_time)
                send(sensors_topic(settings), key, payload, "sensors.bad")
                continue
            roll -= options.bad_fraction
            if roll < options.duplicate_fraction and sent:
                key, reading = sent[-1 - int(factory.roll() * len(sent))]
                send(sensors_topic(settings), key, reading, "sensors.duplicate")
                continue
            roll -= options.duplicate_fraction
            late = roll < options.late_fraction
            device, reading = factory.reading(factory.late_time(event_time) if late else event_time)
            send(
                sensors_topic(settings),
                device.device_id,
                reading,
                "sensors.late" if late else "sensors.valid",
            )
            transaction.remember(device.device_id, reading)
        transaction.end(producer)
    finally:
        remaining = producer.flush(60)
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
    if remaining or summary.delivery_errors:
        raise IngestError(
            f"{summary.delivery_errors} records failed delivery and {remaining} were still queued"
        )
    log.info("generated", **{k: v for k, v in summary.by_category.items()})
    return summary
