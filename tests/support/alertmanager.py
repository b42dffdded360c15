"""The shipped Alertmanager configuration and the pinned Alertmanager tools (`make tools`)."""

from __future__ import annotations

import re
import subprocess
from typing import Any

import pytest
import yaml

from service.config import default_cache_dir
from tests.support.repo import REPO

ALERTMANAGER_CONFIG = (
    REPO / "helm" / "lakehouse-ingest" / "files" / "alertmanager" / "alertmanager.yml"
)
_MATCHER = re.compile(r'^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"(.*)"\s*$')


def tool(name: str) -> str:
    """A pinned binary of the cache's bin directory (``amtool``, ``alertmanager``)."""
    binary = default_cache_dir() / "bin" / name
    if not binary.exists():
        pytest.fail(f"{binary} missing: run `make tools`")
    return str(binary)


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the pinned amtool."""
    return subprocess.run([tool("amtool"), *args], capture_output=True, text=True, check=False)


def shipped_config() -> dict[str, Any]:
    """The Alertmanager configuration Compose runs and the chart's inhibit rules come from."""
    config: dict[str, Any] = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    return config


def matcher(text: str) -> tuple[str, str, str]:
    """An Alertmanager matcher string as (name, operator, value)."""
    parsed = _MATCHER.match(text)
    assert parsed, f"not a matcher: {text!r}"
    name, operator, value = parsed.groups()
    return name, operator, value
