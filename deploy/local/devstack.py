"""Local Kafka (single-node KRaft) and MinIO server processes on loopback.

Used by `make run` and the integration tests; also a CLI:

    python deploy/local/devstack.py kafka --data-dir DIR [--port N] [--topics a,b --partitions 3]
    python deploy/local/devstack.py minio --data-dir DIR [--port N] [--bucket NAME]

Jars and the MinIO binary come from the cache filled by `make kafka-jars` / `make minio`
($LAKEHOUSE_CACHE, default ~/.cache/lakehouse-ingest); nothing is downloaded here.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Self

import boto3
from botocore.config import Config
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._scram import (  # not re-exported by the typed package
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from confluent_kafka.cimpl import NewTopic  # the typed stub; admin re-exports it implicitly

from service.config import default_cache_dir

KAFKA_LOG4J_CONFIG = Path(__file__).resolve().with_name("kafka-log4j2.yaml")


EPHEMERAL_PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST_PORT = 15000


def free_port(ephemeral_range: Path = EPHEMERAL_PORT_RANGE) -> int:
    """A TCP port on 127.0.0.1 that is free right now, below the kernel's ephemeral range.

    A server restarted on its port (a MinIO or broker outage in a test) must find it free: an
    ephemeral port can meanwhile go to any outgoing connection, even to a client that retries
    the dead server and connects to itself on it. Falls back to a kernel-chosen port when the
    range leaves no room below it.
    """
    try:
        ephemeral_low = int(ephemeral_range.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    rng = random.SystemRandom()
    below = ephemeral_low - _LOWEST_PORT >= 1000
    candidates = [rng.randrange(_LOWEST_PORT, ephemeral_low) for _ in range(200)] if below else []
    for candidate in [*candidates, 0]:  # 0: the kernel's choice
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            port: int = sock.getsockname()[1]
            return port
    raise RuntimeError("no free TCP port on 127.0.0.1")


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class _ServerProcess:
    """A server subprocess in its own process group, logging to a file."""

    name = "server"

    def __init__(self, data_dir: Path, log_path: Path) -> None:
        self.data_dir = data_dir
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    def _prepare(self) -> list[str]:
        """Check prerequisites, write config; return the command line."""
        raise NotImplementedError

    def _env(self) -> dict[str, str]:
        return dict(os.environ)

    def _ready(self) -> bool:
        raise NotImplementedError

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The process id (and process group id) while started, else None."""
        return None if self._proc is None else self._proc.pid

    def log_tail(self, lines: int = 40) -> str:
        """Last lines of the process log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def start(self, timeout: float = 60) -> None:
        """Start and wait until ready; raise RuntimeError with the log tail on failure."""
        if self.running:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = self._prepare()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env(),
                start_new_session=True,
            )
        self._proc = proc
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with code {proc.returncode} during start-up "
                    f"(log {self.log_path}):\n{self.log_tail()}"
                )
            if self._ready():
                return
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(
                    f"{self.name} not ready after {timeout:.0f}s (log {self.log_path}):\n"
                    f"{self.log_tail()}"
                )
            time.sleep(0.2)

    def _signal(self, sig: signal.Signals) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, sig)

    def stop(self, timeout: float = 30) -> None:
        """Stop gracefully (SIGTERM), SIGKILL after `timeout` seconds."""
        if self._proc is None:
            return
        self._signal(signal.SIGTERM)
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        self._proc = None

    def kill(self) -> None:
        """Kill at once (SIGKILL), as in a crash."""
        if self._proc is None:
            return
        self._signal(signal.SIGKILL)
        self._proc.wait()
        self._proc = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class KafkaBroker(_ServerProcess):
    """Apache Kafka 4.x, single node in KRaft mode (broker + controller), on 127.0.0.1."""

    name = "Kafka broker"

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        log_path: Path | None = None,
        sasl_ssl: bool = False,
    ) -> None:
        super().__init__(data_dir, log_path or data_dir / "kafka.log")
        self.port = port or free_port()
        self.controller_port = free_port()
        self.bootstrap_servers = f"127.0.0.1:{self.port}"
        # Two more listeners, SASL_SSL with SCRAM-SHA-512 (`add_scram_user`), the broker's
        # certificate signed by a CA made here (`ca_location`); the second ("MTLS") also
        # requires a client certificate signed by that CA (`client_keystore`).
        self.sasl_ssl_port = free_port() if sasl_ssl else None
        self.mtls_port = free_port() if sasl_ssl else None
        self.ca_location = data_dir / "tls" / "ca.pem"

    @property
    def sasl_ssl_bootstrap_servers(self) -> str:
        """The SASL_SSL listener's address."""
        assert self.sasl_ssl_port is not None, "started without sasl_ssl"
        return f"127.0.0.1:{self.sasl_ssl_port}"

    @property
    def mtls_bootstrap_servers(self) -> str:
        """The address of the SASL_SSL listener that requires a client certificate."""
        assert self.mtls_port is not None, "started without sasl_ssl"
        return f"127.0.0.1:{self.mtls_port}"

    def client_keystore(self, name: str) -> Path:
        """A PEM file with a new client key and its certificate (CN=``name``), signed by
        the broker's CA: what `INGEST_KAFKA_SSL_KEYSTORE_LOCATION` names."""
        tls = self.ca_location.parent
        keystore = tls / f"{name}-keystore.pem"
        self._sign(name, name, "")
        keystore.write_text((tls / f"{name}.key").read_text() + (tls / f"{name}.pem").read_text())
        return keystore

    def add_scram_user(self, username: str, password: str) -> None:
        """Create (or reset) a SCRAM-SHA-512 user, through the PLAINTEXT listener."""
        credential = UserScramCredentialUpsertion(
            username, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), password.encode()
        )
        admin = self.admin()  # referenced until the futures resolve
        for future in admin.alter_user_scram_credentials([credential]).values():
            future.result(timeout=30)

    def start(self, timeout: float = 90) -> None:
        """Start (formatting storage on first use) and wait until clients can connect."""
        super().start(timeout)

    def _prepare(self) -> list[str]:
        jars = default_cache_dir() / "jars" / "kafka"
        if not any(jars.glob("kafka_2.13-*.jar")):
            raise RuntimeError(f"Kafka jars not found in {jars}: run `make kafka-jars`")
        java_home = os.environ.get("JAVA_HOME")
        java = str(Path(java_home, "bin", "java")) if java_home else "java"
        # A single-node dev broker on a couple of cores: C1 only and the serial collector
        # (idle 1.8 CPU-s a minute against 2.2 with G1 and C2, starting 2.5-3.0 CPU-s
        # against 3.8-4.1), fewer threads and no-op records (below; idle 1.1-1.2).
        jvm = [java, "-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]
        jvm += ["-Djava.awt.headless=true"]
        jvm += [f"-Dlog4j2.configurationFile={KAFKA_LOG4J_CONFIG}", "-cp", f"{jars}/*"]
        log_dir = self.data_dir / "kafka-logs"
        props = self.data_dir / "server.properties"
        listeners = {"PLAINTEXT": self.port}
        protocols = {"PLAINTEXT": "PLAINTEXT"}
        if self.sasl_ssl_port is not None and self.mtls_port is not None:
            listeners |= {"SASL_SSL": self.sasl_ssl_port, "MTLS": self.mtls_port}
            protocols |= {"SASL_SSL": "SASL_SSL", "MTLS": "SASL_SSL"}
        advertised = ",".join(f"{name}://127.0.0.1:{port}" for name, port in listeners.items())
        props.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    # Static quorum: survives a restart with different ports.
                    f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
                    f"listeners={advertised},CONTROLLER://127.0.0.1:{self.controller_port}",
                    f"advertised.listeners={advertised}",
                    "controller.listener.names=CONTROLLER",
                    "inter.broker.listener.name=PLAINTEXT",
                    "listener.security.protocol.map="
                    + ",".join(f"{name}:{protocol}" for name, protocol in protocols.items())
                    + ",CONTROLLER:PLAINTEXT",
                    *self._sasl_ssl_properties(),
                    f"log.dirs={log_dir}",
                    "num.partitions=3",
                    "default.replication.factor=1",
                    "min.insync.replicas=1",
                    "offsets.topic.replication.factor=1",
                    "offsets.topic.num.partitions=5",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "transaction.state.log.num.partitions=5",
                    "share.coordinator.state.topic.replication.factor=1",
                    "share.coordinator.state.topic.min.isr=1",
                    "group.initial.rebalance.delay.ms=0",
                    # Threads for one node's few clients (the defaults size a production broker).
                    "num.network.threads=1",
                    "num.io.threads=2",
                    "background.threads=2",
                    "num.recovery.threads.per.data.dir=1",
                    # The log cleaner looks for compactable logs every second (not 15 s),
                    # so a compacted topic's older versions go soon after its segment rolls.
                    "log.cleaner.backoff.ms=1000",
                    # A transaction its producer left open is aborted within a second of
                    # its timeout (not up to 10 s later).
                    "transaction.abort.timed.out.transaction.cleanup.interval.ms=1000",
                    "auto.create.topics.enable=false",
                    # After a SIGKILL the restarted broker stays fenced until its old
                    # session expires: keep that short (default 9 s).
                    "broker.session.timeout.ms=3000",
                    "broker.heartbeat.interval.ms=500",
                    # The controller appends a no-op record to its metadata log every 500 ms
                    # by default, only to show the log alive: every 5 s is plenty for one
                    # node (idle 1.1-1.2 CPU-s a minute against 1.7).
                    "metadata.max.idle.interval.ms=5000",
                    "",
                ]
            )
        )
        if not (log_dir / "meta.properties").exists():
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
            # `=`: an id may start with "-", which would otherwise read as an option.
            format_args = [f"--cluster-id={cluster_id}", "-c", str(props)]
            fmt = subprocess.run(
                [*jvm, "kafka.tools.StorageTool", "format", *format_args],
                capture_output=True,
                text=True,
                check=False,
            )
            if fmt.returncode != 0:
                raise RuntimeError(f"kafka storage format failed:\n{fmt.stdout}{fmt.stderr}")
        return [*jvm, "kafka.Kafka", str(props)]

    def _sasl_ssl_properties(self) -> list[str]:
        if self.sasl_ssl_port is None:
            return []
        keystore = self._make_certificates()
        jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        return [
            "sasl.enabled.mechanisms=SCRAM-SHA-512",
            f"listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config={jaas}",
            f"listener.name.mtls.scram-sha-512.sasl.jaas.config={jaas}",
            "listener.name.mtls.ssl.client.auth=required",
            "listener.name.mtls.ssl.truststore.type=PEM",
            f"listener.name.mtls.ssl.truststore.location={self.ca_location}",
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={keystore}",
        ]

    def _make_certificates(self) -> Path:
        """A CA (``ca.pem``) and the broker's key and certificate for 127.0.0.1, signed by
        it, in one PEM keystore; made once per data directory. Returns the keystore."""
        tls = self.ca_location.parent
        keystore = tls / "broker-keystore.pem"
        if keystore.exists():
            return keystore
        tls.mkdir(parents=True, exist_ok=True)
        self._openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
                      "-out", "ca.pem", "-days", "30", "-subj", "/CN=test CA")  # fmt: skip
        self._sign("broker", "127.0.0.1", "subjectAltName=IP:127.0.0.1\n")
        keystore.write_text((tls / "broker.key").read_text() + (tls / "broker.pem").read_text())
        return keystore

    def _sign(self, name: str, common_name: str, extensions: str) -> None:
        """``<name>.key`` and ``<name>.pem``: a new key and its certificate signed by the CA."""
        tls = self.ca_location.parent
        (tls / f"{name}.ext").write_text(extensions)
        self._openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
                      "-out", f"{name}.csr", "-subj", f"/CN={common_name}")  # fmt: skip
        self._openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                      "-CAcreateserial", "-out", f"{name}.pem", "-days", "30",
                      "-extfile", f"{name}.ext")  # fmt: skip

    def _openssl(self, *args: str) -> None:
        subprocess.run(
            ["openssl", *args], cwd=self.ca_location.parent, check=True, capture_output=True
        )

    def admin(self) -> AdminClient:
        """An AdminClient for this broker."""
        return AdminClient({"bootstrap.servers": self.bootstrap_servers})

    def _ready(self) -> bool:
        if not _port_open(self.port):
            return False
        try:
            return bool(self.admin().list_topics(timeout=5).brokers)
        except KafkaException:
            return False

    def create_topics(
        self, names: Sequence[str], partitions: int, config: Mapping[str, str] | None = None
    ) -> None:
        """Create topics (existing ones are fine), with the topic ``config`` if given, and wait
        until all partitions have leaders."""
        admin = self.admin()
        futures = admin.create_topics(
            [
                NewTopic(
                    name, num_partitions=partitions, replication_factor=1, config=dict(config or {})
                )
                for name in names
            ]
        )
        for future in futures.values():
            try:
                future.result(timeout=30)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
        deadline = time.monotonic() + 30
        while True:
            topics = admin.list_topics(timeout=10).topics
            if all(
                name in topics
                and topics[name].partitions
                and all(p.leader >= 0 for p in topics[name].partitions.values())
                for name in names
            ):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"topics {list(names)} not ready after 30s")
            time.sleep(0.2)


class MinioServer(_ServerProcess):
    """MinIO (S3 API) on 127.0.0.1, single drive."""

    name = "MinIO"

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        access_key: str = "minioadmin",
        secret_key: str = "minioadmin",  # noqa: S107 - MinIO's well-known local default
        log_path: Path | None = None,
    ) -> None:
        super().__init__(data_dir, log_path or data_dir / "minio.log")
        self.port = port or free_port()
        self.console_port = free_port()
        self.access_key = access_key
        self.secret_key = secret_key
        self.endpoint_url = f"http://127.0.0.1:{self.port}"

    def _prepare(self) -> list[str]:
        binary = default_cache_dir() / "bin" / "minio"
        if not binary.exists():
            raise RuntimeError(f"MinIO binary not found at {binary}: run `make minio`")
        return [
            str(binary),
            "server",
            str(self.data_dir / "data"),
            "--address",
            f"127.0.0.1:{self.port}",
            "--console-address",
            f"127.0.0.1:{self.console_port}",
        ]

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "MINIO_ROOT_USER": self.access_key,
            "MINIO_ROOT_PASSWORD": self.secret_key,
            "MINIO_UPDATE": "off",
        }

    def _ready(self) -> bool:
        # /minio/health/ready answers 200 before the object layer is up (CreateBucket then
        # fails with XMinioServerNotInitialized); /cluster waits for it, IAM and buckets.
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
        try:
            conn.request("GET", "/minio/health/cluster")
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def s3_client(self) -> Any:
        """A boto3 S3 client for this server (path-style, us-east-1)."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}),
        )

    def create_bucket(self, name: str) -> None:
        """Create a bucket; an existing one is fine."""
        s3 = self.s3_client()
        with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
            s3.create_bucket(Bucket=name)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one server in the foreground until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="component", required=True)
    kafka = sub.add_parser("kafka", help="single-node KRaft Kafka broker")
    kafka.add_argument("--topics", default="", help="comma-separated topics to create")
    kafka.add_argument("--partitions", type=int, default=3)
    minio = sub.add_parser("minio", help="MinIO S3 server")
    minio.add_argument("--bucket", help="bucket to create")
    for p in (kafka, minio):
        p.add_argument("--data-dir", type=Path, required=True)
        p.add_argument("--port", type=int)
    args = parser.parse_args(argv)

    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    server: KafkaBroker | MinioServer
    if args.component == "kafka":
        server = KafkaBroker(args.data_dir, args.port)
    else:
        server = MinioServer(args.data_dir, args.port)
    try:
        server.start()
        if isinstance(server, KafkaBroker):
            if topics := [t for t in args.topics.split(",") if t]:
                server.create_topics(topics, args.partitions)
            print(f"kafka ready: bootstrap.servers={server.bootstrap_servers}", flush=True)
        else:
            if args.bucket:
                server.create_bucket(args.bucket)
            print(f"minio ready: endpoint_url={server.endpoint_url}", flush=True)
        while not stopping.wait(1):
            if not server.running:
                print(f"{server.name} died:\n{server.log_tail()}", file=sys.stderr)
                return 1
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
