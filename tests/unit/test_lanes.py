"""`make test`'s lanes (tests/support/lanes.py): only the listed files leave the main lane."""

from tests.support.lanes import LANES, lane_of
from tests.support.repo import REPO


def test_each_lane_holds_its_listed_files_and_every_other_test_is_in_the_main_one() -> None:
    for lane, paths in LANES.items():
        for path in paths:
            assert (REPO / path).is_file(), path  # a renamed file would rejoin the main lane
            assert lane == lane_of(f"{path}::test_x[a::b]")
    outage = "tests/integration/test_storage_outage.py::test_storage_outages_and_revoked"
    assert "faults" == lane_of(outage)
    assert "second" == lane_of("tests/integration/test_gold.py::test_joins")
    assert "main" == lane_of("tests/integration/test_bad_input.py::test_every")
    assert "main" == lane_of("tests/unit/test_lanes.py::test_the_second_lane[x::y]")
    makefile = (REPO / "Makefile").read_text()
    assert f"$(VENV)/bin/pytest -n {len(LANES) + 1} tests --ignore=tests/image" in makefile
