"""A contract's ``pattern`` (ECMA-262) runs as a Java regular expression with ECMA's ``$``."""

from __future__ import annotations

import pytest

from service.ingest.rules import java_pattern


@pytest.mark.parametrize(
    ("ecma", "java"),
    [
        ("^[A-Z]{2}$", r"^[A-Z]{2}\z"),
        ("^a$|^b$", r"^a\z|^b\z"),
        (r"^\$[0-9]+$", r"^\$[0-9]+\z"),  # an escaped dollar is a dollar sign
        ("^[$€]$", r"^[$€]\z"),  # so is one in a character class
        (r"^[\]$]x$", r"^[\]$]x\z"),  # an escaped bracket does not end the class
        ("no anchor", "no anchor"),
    ],
)
def test_only_an_unescaped_dollar_outside_a_class_becomes_the_end_of_the_text(
    ecma: str, java: str
) -> None:
    assert java == java_pattern(ecma)
