"""The local file system of a local-mode driver (lakehouse.ingest.fs): Hadoop's, with no
process started to set a permission or to tell a symbolic link apart."""

from __future__ import annotations

import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession


class Hadoop:
    """The session's Hadoop file system and file context for ``file:``, through py4j."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        jvm = spark._jvm
        assert jvm is not None
        self.jvm: Any = jvm
        self.fs_api = self.jvm.org.apache.hadoop.fs
        conf = spark._jsc.hadoopConfiguration()
        self.fs = self.fs_api.FileSystem.get(self.jvm.java.net.URI("file:///"), conf)
        self.fc = self.fs_api.FileContext.getFileContext(conf)

    def path(self, local: Path) -> Any:
        return self.fs_api.Path(local.as_uri())

    def permission(self, mode: int) -> Any:
        return self.fs_api.permission.FsPermission.createImmutable(mode)

    def write_atomically(self, target: Path, data: int, overwrite: bool) -> None:
        """What Spark's checkpoint files and Delta's local log do: a temporary file written
        through the file context, renamed onto ``target``."""
        gateway = self.spark.sparkContext._gateway
        assert gateway is not None
        temp = target.with_name(f".{target.name}.tmp")
        create = self.jvm.java.util.EnumSet.of(
            self.fs_api.CreateFlag.CREATE, self.fs_api.CreateFlag.OVERWRITE
        )
        out = self.fc.create(
            self.path(temp), create, gateway.new_array(self.fs_api.Options.CreateOpts, 0)
        )
        out.write(data)
        out.close()
        rename = gateway.new_array(self.fs_api.Options.Rename, 1)
        rename[0] = (
            self.fs_api.Options.Rename.OVERWRITE if overwrite else self.fs_api.Options.Rename.NONE
        )
        self.fc.rename(self.path(temp), self.path(target), rename)

    def processes_started(self, work: Callable[[], None], tmp_path: Path) -> list[str]:
        """The commands of the processes the driver's JVM started while ``work`` ran (Java
        Flight Recorder's ``jdk.ProcessStart``)."""
        jfr = self.jvm.jdk.jfr
        recording = jfr.Recording()
        recording.enable("jdk.ProcessStart")
        recording.start()
        try:
            work()
        finally:
            recording.stop()
        dump = tmp_path / "processes.jfr"
        where = self.jvm.java.io.File(str(dump)).toPath()
        recording.dump(where)
        recording.close()
        events = jfr.consumer.RecordingFile.readAllEvents(where)
        return [str(event.getString("command")) for event in events]


@pytest.fixture(scope="module")
def hadoop(spark: SparkSession) -> Hadoop:
    return Hadoop(spark)


def test_a_local_driver_reads_and_writes_files_through_the_service_s_file_system(
    hadoop: Hadoop,
) -> None:
    assert "lakehouse.ingest.fs.NioLocalFileSystem" == hadoop.fs.getClass().getName()
    raw = hadoop.fc.getDefaultFileSystem()
    assert "lakehouse.ingest.fs.NioLocalFs" == raw.getClass().getName()


def test_checkpoint_writes_and_permissions_start_no_process(hadoop: Hadoop, tmp_path: Path) -> None:
    target = tmp_path / "offsets" / "7"
    target.parent.mkdir()
    created = tmp_path / "part-0.parquet"

    def work() -> None:
        for batch in range(5):
            hadoop.write_atomically(target, batch, overwrite=True)
        hadoop.fs.create(hadoop.path(created), False).close()  # 0644, set by Hadoop
        hadoop.fs.setPermission(hadoop.path(created), hadoop.permission(0o604))

    assert [] == hadoop.processes_started(work, tmp_path)
    assert 4 == target.read_bytes()[0]
    assert 0o604 == stat.S_IMODE(created.stat().st_mode)
    assert 0o604 == stat.S_IMODE((tmp_path / ".part-0.parquet.crc").stat().st_mode)
    # Hadoop's own chmod is still there for the sticky bit, and the recording sees it.
    sticky = tmp_path / "shared"
    sticky.mkdir()
    commands = hadoop.processes_started(
        lambda: hadoop.fs.setPermission(hadoop.path(sticky), hadoop.permission(0o1777)),
        tmp_path,
    )
    assert [f"chmod 1777 {sticky}"] == commands
    assert 0o1777 == stat.S_IMODE(sticky.stat().st_mode)


def test_a_rename_keeps_hadoop_s_semantics(hadoop: Hadoop, tmp_path: Path) -> None:
    target = tmp_path / "1.json"
    hadoop.write_atomically(target, 1, overwrite=False)
    with pytest.raises(Py4JJavaError, match="FileAlreadyExistsException"):
        hadoop.write_atomically(target, 2, overwrite=False)
    assert 1 == target.read_bytes()[0]
    hadoop.write_atomically(target, 3, overwrite=True)
    assert 3 == target.read_bytes()[0]


def test_link_status_is_hadoop_s_own(hadoop: Hadoop, tmp_path: Path) -> None:
    """As Hadoop's (which reads a link's target with ``readlink``): a symbolic link named by
    a bare path is one, named by a ``file:`` URI it is its target's file."""
    data = tmp_path / "data"
    data.write_bytes(b"12345")
    link = tmp_path / "link"
    link.symlink_to(data)
    hadoops = hadoop.fs_api.RawLocalFileSystem()
    hadoops.initialize(hadoop.jvm.java.net.URI("file:///"), hadoop.spark._jsc.hadoopConfiguration())
    ours = hadoop.fs.getRawFileSystem()
    assert "lakehouse.ingest.fs.NioRawLocalFileSystem" == ours.getClass().getName()

    def status(fs: Any, path: Any) -> tuple[bool, bool, int, str | None]:
        found = fs.getFileLinkStatus(path)
        target = found.getSymlink().toString() if found.isSymlink() else None
        return found.isSymlink(), found.isDirectory(), found.getLen(), target

    paths = [hadoop.path(data), hadoop.path(link), hadoop.fs_api.Path(str(link))]
    paths.append(hadoop.path(tmp_path))
    seen = [status(ours, path) for path in paths]
    assert [status(hadoops, path) for path in paths] == seen
    assert (True, False) == (seen[2][0], seen[1][0])
    for fs in (ours, hadoops):
        with pytest.raises(Py4JJavaError, match="FileNotFoundException"):
            fs.getFileLinkStatus(hadoop.path(tmp_path / "missing"))
