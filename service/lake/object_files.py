"""Small file reads and writes without a JVM (checkpoint logs, the lease): pyarrow's S3 or local
filesystem.

URIs are the service's own: ``s3a://bucket/key`` (the S3 settings the driver uses:
endpoint, credentials, region; path-style requests, as for MinIO) or Hadoop's
local ``file:/abs/path``. The same reads as `service.lake.hadoop_fs.HadoopFiles`, for the
verbs that must answer in a second beside a busy driver.
"""

from __future__ import annotations

from typing import Protocol

from pyarrow import fs

from service.config import Location, Settings


class CheckpointTexts(Protocol):
    """Reading and writing a small file (`service.lake.object_files.ObjectFiles`)."""

    def read_text(self, uri: str) -> str | None: ...
    def write_text(self, uri: str, text: str) -> None: ...


class ObjectFiles:
    """Read and list small files under the service's storage and checkpoint roots."""

    def __init__(self, settings: Settings) -> None:
        options = settings.storage.pyarrow_options()
        # The same store as delta-rs spells it (`service.lake.delta.ensure_table`).
        self.delta_rs_options = settings.storage.delta_rs_options()
        self._s3 = fs.S3FileSystem(**options) if settings.uses_s3 else None
        self._local = fs.LocalFileSystem()

    def _locate(self, uri: str) -> tuple[fs.FileSystem, str]:
        location = Location(uri)
        if location.on_s3:
            if self._s3 is None:
                raise ValueError(f"{uri}: no S3 settings for an s3a:// location")
            return self._s3, location.for_pyarrow()
        return self._local, location.for_pyarrow()

    def read_text(self, uri: str) -> str | None:
        """The UTF-8 content of ``uri``, or None if it does not exist."""
        filesystem, path = self._locate(uri)
        try:
            with filesystem.open_input_stream(path) as stream:
                data: bytes = stream.read()
        except FileNotFoundError:
            return None
        return data.decode("utf-8")

    def write_text(self, uri: str, text: str) -> None:
        """Create or replace ``uri`` with ``text`` (UTF-8)."""
        filesystem, path = self._locate(uri)
        if filesystem is self._local:
            filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)
        with filesystem.open_output_stream(path) as stream:
            stream.write(text.encode("utf-8"))

    def list_names(self, uri: str) -> list[str]:
        """Names of the entries directly under ``uri`` (empty if it does not exist)."""
        filesystem, path = self._locate(uri)
        selector = fs.FileSelector(path, allow_not_found=True)
        return [info.base_name for info in filesystem.get_file_info(selector)]

    def modified(self, uri: str) -> float | None:
        """The modification time of ``uri`` (unix seconds), None if it does not exist."""
        filesystem, path = self._locate(uri)
        info = filesystem.get_file_info(path)
        if info.type == fs.FileType.NotFound or info.mtime is None:
            return None
        return float(info.mtime.timestamp())
