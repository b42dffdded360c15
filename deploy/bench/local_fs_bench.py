"""A checkpoint file on a local disk: the service's local file system against Hadoop's.

``python deploy/bench/local_fs_bench.py [--calls N] [--rounds K]`` times, in a local[2]
session configured as the service's, what Spark's checkpoint files and Delta's log
commits ask of the ``file:`` file system: a permission set, a link status, and a file
written through a ``FileContext`` and renamed onto its name. Each is timed through the
service's (`lakehouse.ingest.fs`, jvm/checker) and through Hadoop's own classes, in
alternating rounds; it prints each one's p50 per call over the rounds, and the driver
JVM's CPU per call with that of the processes it started (Hadoop's ``chmod`` and
``readlink``), read from /proc.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from local_session import local_session

_HADOOP = {
    "fs.file.impl": "org.apache.hadoop.fs.LocalFileSystem",
    "fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.LocalFs",
}


def _cpu_seconds(pid: int) -> float:
    """The process's CPU and that of the children it waited for, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(tick) for tick in fields[11:15]) / os.sysconf("SC_CLK_TCK")


class FileSystems:
    """One ``file:`` file system and file context, of the given Hadoop configuration."""

    def __init__(self, jvm: Any, gateway: Any, conf: Any, directory: Path) -> None:
        api = jvm.org.apache.hadoop.fs
        self.fs = api.FileSystem.newInstance(jvm.java.net.URI("file:///"), conf)
        self.fc = api.FileContext.getFileContext(jvm.java.net.URI("file:///"), conf)
        self.path = api.Path(directory.as_uri())
        self.file = api.Path((directory / "x").as_uri())
        self.fs.create(self.file, True).close()
        self.permission = api.permission.FsPermission.createImmutable(0o644)
        self.flags = jvm.java.util.EnumSet.of(api.CreateFlag.CREATE, api.CreateFlag.OVERWRITE)
        self.no_options = gateway.new_array(api.Options.CreateOpts, 0)
        self.overwrite = gateway.new_array(api.Options.Rename, 1)
        self.overwrite[0] = api.Options.Rename.OVERWRITE
        self.temp = api.Path((directory / ".7.tmp").as_uri())
        self.target = api.Path((directory / "7").as_uri())

    def operations(self) -> dict[str, Callable[[], None]]:
        def checkpoint_file() -> None:
            out = self.fc.create(self.temp, self.flags, self.no_options)
            out.write(7)
            out.close()
            self.fc.rename(self.temp, self.target, self.overwrite)

        return {
            "set permission": lambda: self.fs.setPermission(self.file, self.permission),
            "link status": lambda: self.fs.getFileLinkStatus(self.file),
            "checkpoint file": checkpoint_file,
        }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per round (200)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of each (4)")
    args = parser.parse_args(argv)

    root, _settings, spark = local_session("local-fs-bench-")
    jvm: Any = spark._jvm
    pid = int(jvm.java.lang.ProcessHandle.current().pid())
    service_conf = spark._jsc.hadoopConfiguration()
    hadoop_conf = jvm.org.apache.hadoop.conf.Configuration(service_conf)
    for key, value in _HADOOP.items():
        hadoop_conf.set(key, value)
    systems = {}
    for name, conf in (("service", service_conf), ("hadoop", hadoop_conf)):
        (root / name).mkdir()
        systems[name] = FileSystems(jvm, spark.sparkContext._gateway, conf, root / name)
    times: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], float] = {}
    for _round in range(args.rounds + 1):  # the first round warms up, not counted
        for name, system in systems.items():
            for operation, call in system.operations().items():
                started_cpu, started = _cpu_seconds(pid), time.perf_counter()
                for _ in range(args.calls):
                    call()
                elapsed = time.perf_counter() - started
                if _round:
                    times.setdefault((name, operation), []).append(elapsed / args.calls)
                    used = _cpu_seconds(pid) - started_cpu
                    cpu[(name, operation)] = cpu.get((name, operation), 0.0) + used
    for (name, operation), per_call in times.items():
        cpu_ms = cpu[(name, operation)] / (args.calls * args.rounds) * 1000
        print(
            f"{operation:16} {name:8} p50 {statistics.median(per_call) * 1000:7.2f} ms a call, "
            f"{cpu_ms:6.2f} ms of CPU (the JVM's and its processes')"
        )
    spark.stop()
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
