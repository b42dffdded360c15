"""Server ports stay out of the kernel's ephemeral range, so a restarted server finds its port."""

import socket
from pathlib import Path

import pytest
from devstack import free_port


def test_ports_fall_below_the_ephemeral_range_and_are_free(tmp_path: Path) -> None:
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("32768\t60999\n")
    ports = {free_port(ranges) for _ in range(50)}
    assert all(15000 <= port < 32768 for port in ports), sorted(ports)
    assert len(ports) > 40  # chosen at random, not one port handed out again
    for port in list(ports)[:5]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


@pytest.mark.parametrize("content", ["15500 60999", "", None])
def test_no_room_below_the_range_or_no_range_file_still_gives_a_free_port(
    tmp_path: Path, content: str | None
) -> None:
    ranges = tmp_path / "ip_local_port_range"
    if content is not None:
        ranges.write_text(content)
    port = free_port(ranges)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))
    if not content:
        assert 15000 <= port < 32768
