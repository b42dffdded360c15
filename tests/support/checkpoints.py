"""Streaming checkpoints without storage: their files held in a dict."""

from __future__ import annotations


class DictFiles:
    """A checkpoint's files as a dict (read_checkpoint parses; the I/O is elsewhere)."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files

    def read_text(self, uri: str) -> str | None:
        return self.files.get(uri)

    def list_names(self, uri: str) -> list[str]:
        return [k.removeprefix(f"{uri}/") for k in self.files if k.startswith(f"{uri}/")]

    def write_text(self, uri: str, text: str) -> None:
        self.files[uri] = text
