"""`make test`'s two lanes (tests/support/lanes.py): only the listed files leave the main lane."""

from tests.support.lanes import SECOND_LANE, lane_of
from tests.support.repo import REPO


def test_the_second_lane_holds_the_listed_files_and_every_other_test_is_in_the_main_one() -> None:
    for path in SECOND_LANE:
        assert (REPO / path).is_file(), path  # a renamed file would rejoin the main lane
    outage = "tests/integration/test_storage_outage.py::test_storage_outages_and_revoked"
    assert "second" == lane_of(outage)
    assert "main" == lane_of("tests/integration/test_bad_input.py::test_every")
    assert "main" == lane_of("tests/unit/test_lanes.py::test_the_second_lane[x::y]")
    makefile = (REPO / "Makefile").read_text()
    assert "$(VENV)/bin/pytest -n 2 tests --ignore=tests/image" in makefile
