"""The built image (``make image``), its commands run by buildah as the image's user.

The root filesystem is the image's own, with /opt and /usr mounted read-only (the rest
is root's, not writable by the image's user) and only the two paths that the chart and
compose make writable (/tmp, the scratch directory) on host directories. The network is
the host's, so the commands reach the test Kafka and MinIO on loopback. Run with
``make image-test``.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.image import IMAGE, Container, buildah


@pytest.fixture(scope="session")
def image_config() -> dict[str, Any]:
    """The image's OCI configuration (user, entrypoint, command, environment, ports)."""
    inspected = json.loads(buildah("inspect", "--type", "image", IMAGE))
    config: dict[str, Any] = inspected["OCIv1"]["config"]
    return config


@pytest.fixture(scope="session")
def container(
    tmp_path_factory: pytest.TempPathFactory, image_config: dict[str, Any]
) -> Iterator[Container]:
    """A working container of the image, removed at the end of the session."""
    name = f"lakehouse-image-test-{uuid.uuid4().hex[:8]}"
    buildah("from", "--quiet", "--pull=never", "--name", name, IMAGE)
    try:
        root = Path(buildah("mount", name).strip())
        uid, _, gid = image_config["User"].partition(":")
        scratch, tmp = tmp_path_factory.mktemp("scratch"), tmp_path_factory.mktemp("tmp")
        os.chown(scratch, int(uid), int(gid or uid))
        tmp.chmod(0o1777)
        env = dict(item.split("=", 1) for item in image_config["Env"])
        yield Container(name, root, scratch, tmp, image_config["User"], env["HOME"])
    finally:
        buildah("rm", name)
