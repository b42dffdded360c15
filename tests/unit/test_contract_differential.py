"""A differential test of the contract engine: each record's verdict (silver or quarantine)
equals a reference JSON Schema validator's, except where docs/contracts.md says otherwise.

**The corpus**, per shipped contract, from a fixed seed: documents generated from the
contract (every sensor type, null unions, epoch-millisecond and RFC 3339 timestamps in
every offset, nested geolocation, unknown fields for ``_rescued``), about half of them
then mutated (a required field dropped or null, wrong JSON types, numbers at and beyond
their bounds, enumeration and pattern misses, strings at and over their length limit, bad
dates and date-times, conditional ``then`` rules broken, duplicate keys, bare ``NaN``,
huge integers, ...). Each document is written in several spellings (key order,
whitespace, ``\\u`` escapes, float forms, a byte-order mark) and some records are then
mangled byte by byte (truncated, not an object, invalid UTF-8, trailing content, comments,
empty or whitespace-only, deep nesting, over the size limit): over 100,000 records each.

**The reference**: the bytes parsed strictly in Python (UTF-8 once one leading byte-order
mark is stripped, no duplicate keys, no ``NaN``/``Infinity``, one document, an object),
then ``jsonschema.Draft202012Validator`` on the contract's document, its ``date`` and
``date-time`` formats checked by the RFC 3339 definitions written out below (plus epoch
milliseconds within years 1-9999 where the type allows an integer). A users tombstone (a
key and a null value) has no document: its key, a decimal integer, must be valid against
the key's property schema. A record Python cannot parse strictly is rejected.

**The product**: all records of a contract in one bronze batch through `parse_records`:
silver where it finds no error, quarantine (with the error_code and detail) elsewhere.

**Expected**: the product's verdict is the reference's, with the differences
docs/contracts.md states (`STRICTER`: rejected with the category's error code; the
`LENIENT` timestamp forms read as their RFC 3339 equivalent) and the one where the
reference departs from JSON Schema (`PYTHON_DOLLAR`), each applied by an explicit rule on
one field's value. Every category must decide at least `MIN_CASES` records of the corpus,
so that each is tested.
"""

from __future__ import annotations

import codecs
import datetime
import functools
import json
import math
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal
from json.encoder import encode_basestring, encode_basestring_ascii
from typing import Any

import pytest
from jsonschema import Draft202012Validator, FormatChecker
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from service.contracts.model import Contract
from service.ingest.bronze import to_records
from service.ingest.fast_path import FAST, FastPath
from service.ingest.modes import parse_records
from service.ingest.validation import ERROR_CODES
from service.lake.schemas import KAFKA_HEADERS
from service.lake.tables import SHIPPED

SEED = 20240501
RECORDS = 100_000  # per contract, before the tombstones and size cases
MIN_CASES = 5
MAX_PAYLOAD_BYTES = 4096
MAX_FUTURE_SECONDS = 300
TODAY = datetime.date(2024, 5, 1)
ARRIVAL = datetime.datetime(2024, 5, 1, 12, tzinfo=datetime.UTC)
ARRIVAL_MICROS = 1_714_564_800_000_000
MICROS_PER_DAY = 86_400_000_000
# Epoch milliseconds of 0001-01-01T00:00:00Z and 9999-12-31T23:59:59.999Z (docs: years 1-9999).
MIN_EPOCH_MILLIS = -62_135_596_800_000
MAX_EPOCH_MILLIS = 253_402_300_799_999
LONG_LIMIT = 2**63
CONTRACTS = ("users", "sensors")

# ---------------------------------------------------------------------------------------------
# The differences, by category. docs/contracts.md ("Differences from JSON Schema") states
# these: the product rejects what the contract's JSON Schema accepts, with this error_code.
# (Invalid UTF-8, duplicate keys, bare NaN/Infinity and deep nesting, also there, are
# rejected by the reference's strict parse.)
INTEGER_WRITTEN_AS_FRACTION = "integer_with_fraction_or_exponent"
INTEGER_BEYOND_64_BITS = "integer_beyond_64_bits"
NUMBER_BEYOND_DOUBLE = "number_beyond_double_range"
PAYLOAD_TOO_LARGE = "payload_over_size_limit"
LOWERCASE_T_OR_Z = "timestamp_lowercase_t_or_z"
FRACTION_OVER_9_DIGITS = "timestamp_fraction_over_9_digits"
OFFSET_BEYOND_18_HOURS = "timestamp_offset_beyond_18_hours"
LEAP_SECOND = "timestamp_leap_second"
OUTSIDE_YEARS_1_9999 = "day_or_instant_outside_years_1_9999"
DATE_OUTSIDE_BOUNDS = "date_outside_extension_bounds"
EVENT_TIME_AHEAD = "event_time_too_far_after_arrival"
UNPAIRED_SURROGATE = "string_escapes_an_unpaired_surrogate"
STRICTER = {
    # "A string that escapes an unpaired UTF-16 surrogate (\ud800 alone) is malformed_json":
    # it names no Unicode character, so no UTF-8 column could hold it.
    UNPAIRED_SURROGATE: "malformed_json",
    # "Integers: an integer is written without a fraction or exponent: 1.0 and 1e2 are
    # type_mismatch"; "Timestamps: integer epoch milliseconds ... are written as integers
    # (1.7e12 is type_mismatch)". JSON Schema counts any number with a zero fraction as an
    # integer.
    INTEGER_WRITTEN_AS_FRACTION: "type_mismatch",
    # "An integral value beyond 64 bits is out_of_range" (and a tombstone's key).
    INTEGER_BEYOND_64_BITS: "out_of_range",
    # "Numbers beyond double range (1e400) read as infinity: a number field is out_of_range
    # (not a finite number) whatever its bounds".
    NUMBER_BEYOND_DOUBLE: "out_of_range",
    # "The size limit": here MAX_PAYLOAD_BYTES.
    PAYLOAD_TOO_LARGE: "payload_too_large",
    # "T and Z are upper case (RFC 3339 also allows t and z: type_mismatch here)".
    LOWERCASE_T_OR_Z: "type_mismatch",
    # "an ISO-8601 string has ... at most 9 fraction digits, and an offset within ±18:00
    # (RFC 3339 sets no such limits): else type_mismatch".
    FRACTION_OVER_9_DIGITS: "type_mismatch",
    OFFSET_BEYOND_18_HOURS: "type_mismatch",
    # "so is a leap second (23:59:60), which RFC 3339 allows".
    LEAP_SECOND: "type_mismatch",
    # "Timestamps and dates name an instant or a day of the years 1-9999 (UTC) ...: an ISO
    # string of year 0000 or one its offset moves out of it ... are out_of_range".
    OUTSIDE_YEARS_1_9999: "out_of_range",
    # "The extension's rules: the event time's skew ... and a date's x-lakehouse bounds".
    DATE_OUTSIDE_BOUNDS: "out_of_range",
    EVENT_TIME_AHEAD: "event_time_in_future",
}
# Also there ("date-time accepts ISO-8601 forms beyond RFC 3339"): the product accepts
# date-times RFC 3339 does not, a space for "T", no zone (UTC), an offset written ±hh or
# ±hhmm. Such a record is judged as if the date-time were written in RFC 3339.
SPACE_SEPARATOR = "timestamp_space_separator"
NO_ZONE = "timestamp_without_zone"
SHORT_OFFSET = "timestamp_offset_hh_or_hhmm"
LENIENT = (SPACE_SEPARATOR, NO_ZONE, SHORT_OFFSET)
# Where the reference, not the product, departs from JSON Schema: jsonschema runs `pattern`
# with Python's `re.search`, whose `$` also matches before a final "\n" ("GB\n" passes
# ^[A-Z]{2}$). In ECMA-262, which JSON Schema specifies, and in the product ("`$` is the
# end of the string, as in ECMA-262"), it is the end of the text: the product rejects such
# a value (invalid_value).
PYTHON_DOLLAR = "pattern_dollar_before_final_newline"
CODES = {**STRICTER, PYTHON_DOLLAR: "invalid_value"}
# Date-times of the corpus outside years 1-9999 (UTC), by year 0000 or by their offset.
OUTSIDE_YEARS = (
    "0000-01-01T00:00:00Z", "0000-02-29T12:00:00Z", "0001-01-01T00:00:00+01:00",
    "0001-01-01T00:30:00+01:00", "9999-12-31T23:59:59-01:00", "0000-12-31 23:00:00",
    "9999-12-31T23:30:00-0100",
)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# RFC 3339 (the reference's formats) and the timestamp forms docs/contracts.md documents.

_RFC3339_DATE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
_RFC3339_DATE_TIME = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})"
)
# docs/contracts.md: "date and time separated by `T` or a space; no zone, meaning UTC;
# offsets `±hh` and `±hhmm` besides `±hh:mm` and `Z`" (docs/promises.md: "an optional fraction").
_DOCUMENTED_DATE_TIME = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})([T ])([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?"
    r"(Z|[+-][0-9]{2}(?::?[0-9]{2})?)?"
)


def _leap_year(year: int) -> bool:
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def _real_day(year: int, month: int, day: int) -> bool:
    """Whether year-month-day is a day of the proleptic Gregorian calendar (RFC 3339 5.7)."""
    if not 1 <= month <= 12 or day < 1:
        return False
    if month == 2:
        return day <= (29 if _leap_year(year) else 28)
    return day <= (30 if month in (4, 6, 9, 11) else 31)


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days from 1970-01-01 (any year, 0 included: Python's date stops at year 1)."""
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146_097 + day_of_era - 719_468


@dataclass(frozen=True)
class Stamp:
    """A date-time read by a grammar: the instant it names and how it is written."""

    micros: int  # since the epoch, the fraction truncated to microseconds
    rfc3339: str  # the same instant written in RFC 3339
    fraction_digits: int
    second: int
    utc_minute: int  # of the day: a leap second is 23:59:60 UTC
    offset_minutes: int
    lowercase: bool
    leniencies: frozenset[str]  # how it departs from RFC 3339 (documented forms only)


def _stamp(groups: Sequence[str | None], separator: str, zone: str | None) -> Stamp | None:
    year, month, day, hour, minute, second = (int(g or 0) for g in groups[:6])
    fraction = groups[6] or ""
    if not _real_day(year, month, day) or hour > 23 or minute > 59 or second > 60:
        return None
    leniencies = set()
    if separator == " ":
        leniencies.add(SPACE_SEPARATOR)
    if zone is None:
        leniencies.add(NO_ZONE)
        offset, rfc_zone = 0, "Z"
    elif zone in "Zz":
        offset, rfc_zone = 0, zone
    else:
        digits = zone[1:].replace(":", "")
        if ":" not in zone:
            leniencies.add(SHORT_OFFSET)
        hours, minutes = int(digits[:2]), int(digits[2:] or 0)
        if hours > 23 or minutes > 59:
            return None
        offset = (hours * 60 + minutes) * (-1 if zone[0] == "-" else 1)
        rfc_zone = f"{zone[0]}{hours:02}:{minutes:02}"
    seconds = ((hour * 60 + minute - offset) * 60) + second
    micros = _days_from_civil(year, month, day) * MICROS_PER_DAY + seconds * 1_000_000
    micros += int(fraction[:6].ljust(6, "0"))
    date_text = f"{groups[0]}-{groups[1]}-{groups[2]}"
    time_text = f"{groups[3]}:{groups[4]}:{groups[5]}" + (f".{fraction}" if fraction else "")
    separator_text = "T" if separator == " " else separator
    return Stamp(
        micros,
        f"{date_text}{separator_text}{time_text}{rfc_zone}",
        len(fraction),
        second,
        (hour * 60 + minute - offset) % 1440,
        offset,
        separator == "t" or zone == "z",
        frozenset(leniencies),
    )


@functools.cache
def rfc3339_date_time(text: str) -> Stamp | None:
    """``text`` read as an RFC 3339 date-time (section 5.6, with 5.7's leap second: 23:59:60
    UTC), or None."""
    match = _RFC3339_DATE_TIME.fullmatch(text)
    if match is None:
        return None
    groups = match.groups()
    stamp = _stamp(groups[:7], text[10], groups[7])
    if stamp is None or (stamp.second == 60 and stamp.utc_minute != 23 * 60 + 59):
        return None
    return stamp


@functools.cache
def documented_date_time(text: str) -> Stamp | None:
    """``text`` read as the timestamp strings docs/contracts.md documents, or None."""
    match = _DOCUMENTED_DATE_TIME.fullmatch(text)
    if match is None:
        return None
    groups = match.groups()
    return _stamp((*groups[:3], *groups[4:8]), groups[3], groups[8])


def rfc3339_date(text: str) -> tuple[int, int, int] | None:
    """``text`` read as an RFC 3339 full-date (year, month, day), or None."""
    match = _RFC3339_DATE.fullmatch(text)
    if match is None:
        return None
    year, month, day = (int(g) for g in match.groups())
    return (year, month, day) if _real_day(year, month, day) else None


def _epoch_millis(value: object) -> bool:
    """Whether ``value`` is an integer (JSON Schema's sense) of epoch milliseconds in 1-9999."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if isinstance(value, float) and not value.is_integer():
        return False
    return MIN_EPOCH_MILLIS <= value <= MAX_EPOCH_MILLIS


def _date_format(instance: object) -> bool:
    return not isinstance(instance, str) or rfc3339_date(instance) is not None


def _date_time_format(instance: object) -> bool:
    if isinstance(instance, str):
        return rfc3339_date_time(instance) is not None
    if isinstance(instance, bool) or not isinstance(instance, int | float):
        return True  # another type: the type keyword decides
    if isinstance(instance, float) and not instance.is_integer():
        return True  # not an integer: the type keyword rejects it
    return _epoch_millis(instance)


def format_checker() -> FormatChecker:
    """The reference's formats: exactly ``date`` and ``date-time``, as defined above."""
    checker = FormatChecker(formats=())
    checker.checks("date")(_date_format)
    checker.checks("date-time")(_date_time_format)
    return checker


# ---------------------------------------------------------------------------------------------
# The reference.


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) != len(pairs):
        raise ValueError("duplicate key")
    return document


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def strict_document(value: bytes) -> dict[str, Any] | None:
    """The JSON object ``value`` holds, parsed strictly; None if it holds anything else."""
    if value.startswith(codecs.BOM_UTF8):
        value = value[len(codecs.BOM_UTF8) :]
    try:
        document = json.loads(
            value.decode("utf-8"), object_pairs_hook=_object, parse_constant=_not_json
        )
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    return document if isinstance(document, dict) else None


class Reference:
    """jsonschema's verdict on a contract's documents: a pure function of the document, so
    computed once per distinct document (the corpus writes each in several spellings)."""

    def __init__(self, contract: Contract) -> None:
        Draft202012Validator.check_schema(contract.document)
        self.validator = Draft202012Validator(contract.document, format_checker=format_checker())
        key_schema = contract.document["properties"][contract.key] if contract.key else {}
        self.key_validator = Draft202012Validator(key_schema)
        self._verdicts: dict[str, bool] = {}

    @property
    def documents(self) -> int:
        """How many distinct documents it judged."""
        return len(self._verdicts)

    def accepts(self, document: dict[str, Any]) -> bool:
        """Whether ``document`` is valid against the contract."""
        identity = repr(sorted(document.items()))  # the same for the same document
        verdict = self._verdicts.get(identity)
        if verdict is None:
            verdict = self._verdicts[identity] = self.validator.is_valid(document)
        return verdict

    def accepts_key(self, text: str) -> bool:
        """Whether a tombstone's key names an entity: a decimal integer (leading zeros
        allowed, docs/contracts.md) valid against the key's property schema."""
        return re.fullmatch(r"-?[0-9]+", text) is not None and self.key_validator.is_valid(
            int(text)
        )


# ---------------------------------------------------------------------------------------------
# Records, and what the product is expected to do with each.


@dataclass(frozen=True)
class Record:
    """A Kafka record of the corpus and how it was made (for failure messages)."""

    key: bytes | None
    value: bytes | None
    timestamp: int  # the Kafka timestamp, epoch microseconds
    made: str


@dataclass(frozen=True)
class Expected:
    """The reference's verdict on a record and the product's that docs/contracts.md implies."""

    reference: bool  # the reference's verdict on the record as written
    valid: bool  # the product's expected verdict
    code: str | None  # its error_code, where a difference decides the record
    field: str | None  # the field its error_detail names then
    differences: frozenset[str]  # the categories that decide the record


_REJECTED = Expected(False, False, None, None, frozenset())
_ABSENT = object()


@dataclass(frozen=True)
class _Pattern:
    """A ``pattern`` as ECMA-262 reads it: ``$`` (outside a character class) is the end of the
    text, Python's ``\\Z`` (jsonschema runs it with Python's ``$``). Written apart from the
    product's `java_pattern` on purpose: the reference must not share the code it judges."""

    ecma: re.Pattern[str]

    @staticmethod
    def of(pattern: str) -> _Pattern:
        out, in_class, escaped = [], False, False
        for ch in pattern:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == "[":
                in_class = True
            elif ch == "]":
                in_class = False
            elif ch == "$" and not in_class:
                out.append("\\Z")
                continue
            out.append(ch)
        return _Pattern(re.compile("".join(out)))


@dataclass(frozen=True)
class _Field:
    """What the judge needs of a contract's field."""

    path: str
    parts: tuple[str, ...]
    kinds: frozenset[str]  # its JSON types but null
    format: str | None
    pattern: _Pattern | None
    bounds: tuple[tuple[int, int, int], tuple[int, int, int]] | None  # x-lakehouse dates


def _value_at(document: dict[str, Any], parts: tuple[str, ...]) -> Any:
    value: Any = document
    for part in parts:
        if not isinstance(value, dict):
            return _ABSENT
        value = value.get(part, _ABSENT)
    return value


def _beyond_double(value: object) -> bool:
    if isinstance(value, float):
        return math.isinf(value)
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            float(value)
        except OverflowError:
            return True
    return False


def _instant(value: object) -> int | None:
    """The instant (epoch microseconds) of a valid date-time value, or None."""
    if isinstance(value, str):
        stamp = rfc3339_date_time(value)
        return stamp.micros if stamp is not None else None
    if isinstance(value, int) and not isinstance(value, bool) and _epoch_millis(value):
        return value * 1000
    return None


class Judge:
    """What the product must do with each record of a contract's corpus."""

    def __init__(self, contract: Contract) -> None:
        self.contract = contract
        self.reference = Reference(contract)
        self.entities = contract.mode == "entities"
        fields = [
            _Field(
                f.path,
                tuple(f.path.split(".")),
                frozenset(f.types) - {"null"},
                f.format,
                _Pattern.of(f.schema["pattern"]) if "pattern" in f.schema else None,
                (
                    (
                        _day(f.extension.get("minimum"), (0, 1, 1)),
                        _day(f.extension.get("maximum"), (9999, 12, 31)),
                    )
                    if f.format == "date" and {"minimum", "maximum"} & set(f.extension)
                    else None
                ),
            )
            for f in contract.fields
        ]
        # The fields the product reads differently (`as_read`), and those with stricter rules.
        self.read = [f for f in fields if f.format == "date-time"]
        self.checked = [
            f
            for f in fields
            if f.kinds == {"integer"} or "number" in f.kinds or f.format or f.pattern
        ]
        self.order = {f.path: i for i, f in enumerate(fields)}

    def expect(self, record: Record) -> Expected:
        """The reference's verdict on ``record`` and the product's expected verdict."""
        if record.value is None:
            if self.entities and record.key is not None:
                return self._tombstone(record.key)
            return _REJECTED
        document = strict_document(record.value)
        if document is None:
            return _REJECTED
        reference = self.reference.accepts(document)
        if _holds_surrogate(document):
            stricter = [(UNPAIRED_SURROGATE, "value")]
            if len(record.value) > MAX_PAYLOAD_BYTES:
                stricter.append((PAYLOAD_TOO_LARGE, "value"))
            return self._decided(reference, stricter, frozenset())
        read, lenient = self.as_read(document)
        valid = self.reference.accepts(read) if read is not document else reference
        if not valid:
            return Expected(reference, False, None, None, frozenset())
        stricter = self.stricter(read, record.timestamp)
        if len(record.value) > MAX_PAYLOAD_BYTES:
            stricter.append((PAYLOAD_TOO_LARGE, "value"))
        return self._decided(reference, stricter, frozenset() if reference else lenient)

    def _decided(
        self, reference: bool, stricter: list[tuple[str, str]], leniencies: frozenset[str]
    ) -> Expected:
        if not stricter:
            return Expected(reference, True, None, None, leniencies)
        # The product reports the first error code in precedence order, then the first
        # field in the contract's order.
        category, field = min(
            stricter, key=lambda c: (ERROR_CODES.index(CODES[c[0]]), self.order.get(c[1], -1))
        )
        decided = leniencies | {c for c, _ in stricter}
        return Expected(reference, False, CODES[category], field, decided)

    def _tombstone(self, key: bytes) -> Expected:
        try:
            text = key.decode("utf-8")
        except UnicodeDecodeError:
            return _REJECTED
        if not self.reference.accepts_key(text):
            return _REJECTED
        stricter = [(INTEGER_BEYOND_64_BITS, "key")] if int(text) >= LONG_LIMIT else []
        return self._decided(True, stricter, frozenset())

    def as_read(self, document: dict[str, Any]) -> tuple[dict[str, Any], frozenset[str]]:
        """``document`` with its date-times in the documented forms beyond RFC 3339 written
        in RFC 3339, and which of those forms it had."""
        changed: dict[str, str] = {}
        applied: set[str] = set()
        for f in self.read:
            value = _value_at(document, f.parts)
            if not isinstance(value, str):
                continue
            if rfc3339_date_time(value) is None:
                stamp = documented_date_time(value)
                if stamp is not None:
                    changed[f.path] = stamp.rfc3339
                    applied |= stamp.leniencies
        if not changed:
            return document, frozenset()
        read = dict(document)  # the date-times are top-level properties
        read.update(changed)
        return read, frozenset(applied)

    def stricter(self, document: dict[str, Any], arrival: int) -> list[tuple[str, str]]:
        """The documented stricter cases (category, field) of a document the reference
        accepts, read as the product reads it."""
        found: list[tuple[str, str]] = []
        for f in self.checked:
            value = _value_at(document, f.parts)
            if value is _ABSENT or value is None or isinstance(value, bool):
                continue
            integral = isinstance(value, float) and value.is_integer()
            if f.kinds == {"integer"}:
                if integral and abs(value) < LONG_LIMIT:
                    found.append((INTEGER_WRITTEN_AS_FRACTION, f.path))
                elif integral or not -LONG_LIMIT <= value < LONG_LIMIT:
                    found.append((INTEGER_BEYOND_64_BITS, f.path))
            if "number" in f.kinds and _beyond_double(value):
                found.append((NUMBER_BEYOND_DOUBLE, f.path))
            if f.format == "date-time":
                if integral and "integer" in f.kinds:
                    found.append((INTEGER_WRITTEN_AS_FRACTION, f.path))
                stamp = rfc3339_date_time(value) if isinstance(value, str) else None
                if stamp is not None:
                    found += [(c, f.path) for c in _stricter_stamp(stamp)]
            # A value the reference accepts (Python's `$`) that ECMA-262's `$` refuses.
            pattern, text = f.pattern, value if isinstance(value, str) else None
            if pattern and text is not None and not pattern.ecma.search(text):
                found.append((PYTHON_DOLLAR, f.path))
            day = rfc3339_date(value) if f.format == "date" and isinstance(value, str) else None
            if day is not None and day[0] == 0:
                found.append((OUTSIDE_YEARS_1_9999, f.path))
            if day is not None and f.bounds is not None and not f.bounds[0] <= day <= f.bounds[1]:
                found.append((DATE_OUTSIDE_BOUNDS, f.path))
        if self.contract.event_time is not None:
            instant = _instant(document.get(self.contract.event_time))
            if instant is not None and instant - arrival > MAX_FUTURE_SECONDS * 1_000_000:
                found.append((EVENT_TIME_AHEAD, self.contract.event_time))
        return found


def _stricter_stamp(stamp: Stamp) -> list[str]:
    found = []
    if not MIN_EPOCH_MILLIS * 1000 <= stamp.micros <= MAX_EPOCH_MILLIS * 1000 + 999:
        found.append(OUTSIDE_YEARS_1_9999)
    if stamp.lowercase:
        found.append(LOWERCASE_T_OR_Z)
    if stamp.fraction_digits > 9:
        found.append(FRACTION_OVER_9_DIGITS)
    if abs(stamp.offset_minutes) > 18 * 60:
        found.append(OFFSET_BEYOND_18_HOURS)
    if stamp.second == 60:
        found.append(LEAP_SECOND)
    return found


def _day(text: object, default: tuple[int, int, int]) -> tuple[int, int, int]:
    """An x-lakehouse date bound ("today" or a date) as (year, month, day)."""
    if text is None:
        return default
    day = TODAY if text == "today" else datetime.date.fromisoformat(str(text))
    return (day.year, day.month, day.day)


def categories(contract: Contract) -> set[str]:
    """The differences that can arise on ``contract``'s fields."""
    found = {PAYLOAD_TOO_LARGE, UNPAIRED_SURROGATE}
    for f in contract.fields:
        kinds = set(f.types) - {"null"}
        if kinds == {"integer"}:
            found |= {INTEGER_WRITTEN_AS_FRACTION, INTEGER_BEYOND_64_BITS}
        if "number" in kinds:
            found.add(NUMBER_BEYOND_DOUBLE)
        if f.format == "date-time":
            found |= {LOWERCASE_T_OR_Z, FRACTION_OVER_9_DIGITS, OFFSET_BEYOND_18_HOURS}
            found |= {LEAP_SECOND, OUTSIDE_YEARS_1_9999, *LENIENT}
            if "integer" in kinds:
                found.add(INTEGER_WRITTEN_AS_FRACTION)
        if f.format == "date" and {"minimum", "maximum"} & set(f.extension):
            found.add(DATE_OUTSIDE_BOUNDS)
        if f.format == "date":
            found.add(OUTSIDE_YEARS_1_9999)
        if "pattern" in f.schema and f.schema["pattern"].endswith("$"):
            found.add(PYTHON_DOLLAR)
    if contract.event_time is not None:
        found.add(EVENT_TIME_AHEAD)
    return found


# ---------------------------------------------------------------------------------------------
# Writing documents: every spelling of the same document parses to the same value.


@dataclass(frozen=True)
class Raw:
    """JSON text written as is: a token Python would not write (NaN, 1e400, 007, ...)."""

    text: str


@dataclass(frozen=True)
class Pairs:
    """An object written member by member: keys may repeat."""

    members: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Style:
    """How a document is spelled."""

    item: str  # between members and elements
    colon: str
    ascii: bool  # non-ASCII as \\u escapes
    floats: int  # which of the float spellings (`spell_float`)
    shuffle: bool  # members in a random order
    escape: bool  # some letters as \\u escapes


_SEPARATORS = ((",", ":"), (", ", ": "), (" , ", " : "), (",\n  ", ": "), ("\t,\r\n", ":\t"))
_PLAIN = Style(", ", ": ", False, 0, False, False)


def _style(rng: random.Random) -> Style:
    item, colon = rng.choice(_SEPARATORS)
    return Style(
        item, colon, rng.random() < 0.4, rng.randrange(4), rng.random() < 0.3, rng.random() < 0.1
    )


def spell_float(value: float, how: int) -> str:
    """``value`` in one of four spellings of the same decimal (so the same nearest double)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "1e400" if value > 0 else "-1E+999"
    text = repr(value)
    if how == 0:
        return text
    if how == 3:
        significand, e, power = text.partition("e")
        return significand + ("00" if "." in significand else ".00") + e + power
    sign, digits, exponent = Decimal(text).as_tuple()
    assert isinstance(exponent, int)
    minus, mantissa = "-" if sign else "", "".join(map(str, digits))
    if how == 1:
        return f"{minus}{mantissa}e{exponent}"
    return f"{minus}0.{mantissa}E{exponent + len(mantissa):+d}"


def _spell_string(text: str, style: Style, rng: random.Random) -> str:
    quote = encode_basestring_ascii if style.ascii else encode_basestring
    if style.escape and text and rng.random() < 0.5:
        i = rng.randrange(len(text))
        if text[i].isascii() and text[i].isalnum():
            return f"{quote(text[:i])[:-1]}\\u{ord(text[i]):04x}{quote(text[i + 1 :])[1:]}"
    return quote(text)


def write(value: Any, style: Style, rng: random.Random) -> str:
    """``value`` as JSON text in ``style``."""
    if isinstance(value, str):
        return _spell_string(value, style, rng)
    if isinstance(value, dict):
        keys = list(value)
        if style.shuffle:
            rng.shuffle(keys)
        members = [
            f"{_spell_string(k, style, rng)}{style.colon}{write(value[k], style, rng)}"
            for k in keys
        ]
        return "{" + style.item.join(members) + "}"
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return spell_float(value, style.floats)
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, list):
        return "[" + style.item.join(write(v, style, rng) for v in value) + "]"
    if isinstance(value, Pairs):
        return (
            "{"
            + style.item.join(
                f"{_spell_string(k, style, rng)}{style.colon}{write(v, style, rng)}"
                for k, v in value.members
            )
            + "}"
        )
    raise TypeError(value)


# ---------------------------------------------------------------------------------------------
# Generating the corpus: valid documents of each contract, mutations, spellings, mangling.

_EPOCH = datetime.datetime(1970, 1, 1)
_YEAR_2 = _days_from_civil(2, 1, 1) * MICROS_PER_DAY
_YEAR_9998 = _days_from_civil(9998, 12, 31) * MICROS_PER_DAY
_DIGITS = "0123456789"
# Replaced by invalid UTF-8 once a document is written (a str cannot hold it).
_INVALID_MARK = "\ue000"
_INVALID_UTF8 = (
    b"\xff", b"\xc3\x28", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\x80",
    b"\xf8\x88\x80\x80\x80", b"\xef\xbf",
)  # fmt: skip
_BOM = codecs.BOM_UTF8

EDGE_TIMESTAMPS: tuple[str | int, ...] = (
    "0001-01-01T00:00:00Z", "9999-12-31T23:59:59.999999Z", "9999-12-31T23:59:59.9999999999Z",
    "0001-01-01T01:00:00+01:00", "9999-12-31T22:59:59-01:00", "1970-01-01T00:00:00Z",
    "2024-02-29T23:59:59.999999999Z", "2024-05-01T11:00:00-00:00", "2024-05-01T11:00:00+18:00",
    "2024-05-01T11:00:00-18:00", "2024-05-01T11:59:59.000001+00:00", "2016-12-31T23:59:59Z",
    MIN_EPOCH_MILLIS, MAX_EPOCH_MILLIS, 0, -1, 1_714_564_800_000,
)  # fmt: skip
BAD_TIMESTAMPS: tuple[Any, ...] = (
    "yesterday", "", "2024-05-01", "2024-05-01T10:15Z", "2024-05-01T10:15:30.Z",
    "2024-02-30T00:00:00Z", "2023-02-29T00:00:00Z", "1900-02-29T12:00:00Z", "2024-13-01T00:00:00Z",
    "2024-00-01T00:00:00Z", "2024-05-00T00:00:00Z", "2024-05-01T24:00:00Z", "2024-05-01T23:60:00Z",
    "2024-05-01T10:15:61Z", "2024-05-01T10:15:60Z", "2024-05-01T10:15:30+24:00",
    "2024-05-01T10:15:30+02:60", "2024-05-01T10:15:30,5Z", "2024-05-01T10:15:30+2:00",
    "2024-05-01T10:15:30+02:00:00", "+2024-05-01T10:15:30Z", "24-05-01T10:15:30Z",
    "2024-5-1T10:15:30Z", " 2024-05-01T10:15:30Z", "2024-05-01T10:15:30Z ", "2024-05-01T10:15:30 ",
    "2024-05-01T10:15:30\t", "2024-05-01T10:15:30Z\n\n", "2024-05-01T10:15:30\u2028",
    "2024-05-01T10:15:30\n", "2024-04-30T08:00:00Z\r", "2024-05-01T11:59:00+02:00\r\n",
    "2024-05-01 10:15:30.5\n",
    "2024-05-01T10:15:30Z\u0085", "\u0662\u0660\u0662\u0664-05-01T10:15:30Z",
    "2024-05-01T10:15:30UTC",
    "2024-05-01T10:15:30 Z", "2024-05-01T10:15:30+0", "2024-05-01T10:15:30+123", "2024-05-01Z",
    "10:15:30", "2024-05-01T10:15:30.1234567891", "2024-05-01t10:15:30", "20240501T101530Z",
    "2016-12-31T23:58:60Z", "2024-05-01T10:15:30-24:00",
    MIN_EPOCH_MILLIS - 1, MAX_EPOCH_MILLIS + 1, LONG_LIMIT, -(2**64), 1_714_558_530_123.5,
    math.inf, True, [], {}, Raw("1e400"), Raw("NaN"),
)  # fmt: skip

LEAP_SECONDS = (
    "1998-12-31T23:59:60Z", "2016-12-31T23:59:60.5Z", "2017-01-01T00:59:60+01:00",
    "2016-12-31T18:59:60-05:00", "2016-12-31 23:59:60",
)  # fmt: skip
FAR_OFFSETS = ("+18:30", "-19:00", "+23:59", "-23:00", "+20", "-1801")
VALID_DOBS = ("1900-01-01", "2024-05-01", "2000-02-29", "1904-02-29", "1999-12-31")
BAD_DOBS: tuple[Any, ...] = (
    # Real days outside the contract's x-lakehouse bounds (the product's rule alone).
    "1899-12-31", "2024-05-02", "0000-01-01", "0001-01-01", "1000-06-15", "9999-12-31",
    "0000-02-29", "2100-02-28",
    # Not RFC 3339 full-dates.
    "1900-02-29", "2023-02-29", "2024-04-31", "2024-13-01", "2024-00-10", "2024-01-00",
    "2024-5-01", "24-05-01", "2024/05/01", "2024-05-01T00:00:00", "2024-05-01T00:00:00Z",
    "2024-05-01 ", " 2024-05-01", "", "\u0661\u0669\u0669\u0660-01-01", "2024-05-01\u2028",
    "2024-05-01\t", "2024-05-01\n\n", "20240501", "+2024-05-01", "2024-W18-3", "2024-122",
    19900101, True,
    "1990-05-01\n", "1990-05-01\r", "1990-05-01\r\n", "2024-05-02\n", "1990-02-30\r",
    "0000-01-01", "0000-02-29", "0000-12-31",
)  # fmt: skip
BAD_COUNTRIES: tuple[Any, ...] = (
    "gb", "Gb", "GBR", "G", "", "G1", "\uff27B", " GB", "GB ", "\u00c0B", "GB\t", "GB\n\n", 44,
    "GB\n", "GB\r", "FR\r\n", "DE\u2028", "US\u2029", "IT\u0085", "gb\r",
)  # fmt: skip
TOMBSTONE_KEYS: tuple[bytes | None, ...] = (
    b"42", b"007", b"0000000000000000000000001", str(LONG_LIMIT - 1).encode(), b"1", b"123456",
    str(LONG_LIMIT).encode(), str(2**64).encode(), b"99999999999999999999",
    b"0", b"-5", b"-0", b"abc", b"", b" 5", b"+5", b"5 ", "\u0665".encode(), b"1e3", b"1.0",
    "5\u2028".encode(), "5\u0085".encode(), b"5\n\n", b"\xff\xfe", None,
    b"5\n", b"42\r", b"7\r\n", b"0\n", str(LONG_LIMIT).encode() + b"\n",
)  # fmt: skip
WRONG_TYPES: tuple[Any, ...] = (
    "72", "NaN", "Infinity", "", "true", "null", True, False, [], [1, 2], {}, {"value": 1}, 0, -1,
    1.5, "2024-05-01T00:00:00Z", "1990-01-01",
)  # fmt: skip
USER_ID_EDGES: tuple[Any, ...] = (
    0, -1, 1, LONG_LIMIT - 1, LONG_LIMIT, 2**64, -LONG_LIMIT, -LONG_LIMIT - 1, 10**30, 1.0, 7.0,
    1e19, 9.2233720368547748e18, 9.223372036854775807e18, 1.5, -2.0, Raw("1E0"), Raw("10e-1"),
    Raw("1" + "0" * 400), Raw("-0"), Raw("007"), Raw("1e400"), Raw("NaN"), Raw("2e0"),
)  # fmt: skip
AXIS_EDGES: tuple[Any, ...] = (
    None, 0, -0.0, 1e308, -1e308, 5e-324, math.inf, -math.inf, Raw("1" + "0" * 400),
    Raw("-" + "9" * 400), 10**30, Raw("1e-400"), Raw("NaN"), Raw("-Infinity"), "1", True,
)  # fmt: skip
VALUE_EDGES: dict[str, tuple[Any, ...]] = {
    "heart_rate": (
        20, 250, 20.0, 250.0, math.nextafter(20, -math.inf), math.nextafter(250, math.inf), 19,
        251, 19.999, 250.001, 0, -72, 1e308, 5e-324, 10**20, math.inf, -math.inf, Raw("2.5e2"),
        Raw("250.00000000000001"), Raw("19.999999999999999"), Raw("250.0000000000001"),
        Raw("2.50000000000000000001e2"), Raw("1" + "0" * 400),
        Raw("200000000000000000000000000000000000000000e-39"),
    ),
    "temperature": (
        -50, 150, -50.0, 150.0, math.nextafter(-50, -math.inf), math.nextafter(150, math.inf),
        -51, 151, -50.5, 150.5, -273.15, -0.0, 0, math.inf, -math.inf, Raw("-5e1"), Raw("1.5e2"),
        Raw("-50.000000000000001"), Raw("150.0000000000001"),
    ),
    "accelerometer": AXIS_EDGES,
}  # fmt: skip
SENSOR_TYPE_MISSES = (
    "humidity", "HEART_RATE", "Heart_rate", "heart_rate ", " heart_rate", "heart-rate", "",
    "heart_rate\n", "temperature\u0000", "accelerometer\r", 1, None,
)  # fmt: skip
DANGER_MISSES = ("EXTREME", "low", "", "LOW ", "MEDIUM\n", "high\r", 3)
GENDER_MISSES = ("f", "", "Q", "FM", " F", "F\n", "x", "male", 0)
RAW_TOKENS = (
    "NaN", "Infinity", "-Infinity", "1e400", "-1e400", "007", "-01", "1.e5", ".5", "+1", "0x10",
    "1e", "--1", '"\\ud800"', '"\\udc00\\ud800"', '"\\x41"', '"\\u12"', '"a\tb"', '"a\x01b"',
    '"nul\\u0000"', "1" + "0" * 40, "1" * 25, "undefined", "None", "True", '"\\ud83d\\ude00"',
    f'"bad {_INVALID_MARK} utf8"', "'single'", "[1,]", "{}", '{"a":1,}', '"\\/"',
)  # fmt: skip
_NAME_CHARS = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ'- " * 3 + "\u00e9\u00df\u00f8\u0416\u4e2d"
    '\U0001f600\u0301"\\\n\t'
)
_EXTRA_NAMES = (
    "firmware", "battery", "tags", "_rescued", "", "\u202e", "Event_id", "User_id", "event_id ",
    "geo_city", "magnitude", "event_date", "kafka_offset", "is_tombstone", "a.b", "$ref", "\u0000",
    "\u00fcn\u00efcode", "\U0001f600", "deleted_at",
)  # fmt: skip
_EXTRA_VALUES: tuple[Any, ...] = (
    "1.2", 87, 0.5, True, False, None, ["a", 1, None], {"pct": 80, "ok": [True]}, "",
    "\u00e9\U0001f600",
    -3, 2**53, 1e-7, 10**30, {"nested": {"deep": [1, 2, {"x": None}]}}, "\t\n", -0.0, 12.5e300,
    Raw("[" * 50 + "]" * 50), Raw('{"a":' * 600 + "1" + "}" * 600),
    # Kept by the product's _rescued with a loss (see _rescue_keeps), or malformed_json.
    math.inf, Raw('"\\ud800"'), Raw("1" * 45),
)  # fmt: skip
GEOLOCATIONS: tuple[Any, ...] = (
    "Paris", [], [{"city": "Paris"}], 1, True, {"city": 75}, {"country": []},
    {"city": None, "country": None}, {}, {"zip": "75001", "city": "Paris"},
    {"city": "Paris", "deep": Raw("[" * 300 + "]" * 300)}, {"city": math.inf},
    Pairs((("city", "a"), ("city", "b"))), {"city": "", "country": "\U0001f600"},
)  # fmt: skip


def _rfc3339_parts(micros: int, offset: int, digits: int, rng: random.Random) -> list[str]:
    """[date, "T", time, zone] of the instant ``micros`` at UTC ``offset`` minutes."""
    local = _EPOCH + datetime.timedelta(microseconds=micros + offset * 60_000_000)
    clock = f"{local.hour:02}:{local.minute:02}:{local.second:02}"
    if digits:
        fraction = f"{local.microsecond:06}"[:digits]
        fraction += "".join(rng.choices(_DIGITS, k=max(0, digits - 6)))
        clock += "." + fraction
    if offset == 0:
        zone = rng.choice(("Z", "Z", "Z", "+00:00", "-00:00"))
    else:
        sign = "-" if offset < 0 else "+"
        zone = f"{sign}{abs(offset) // 60:02}:{abs(offset) % 60:02}"
    return [f"{local.year:04}-{local.month:02}-{local.day:02}", "T", clock, zone]


def _short_offset(zone: str, rng: random.Random) -> str:
    if zone == "Z":
        return rng.choice(("+00", "+0000", "-00"))
    hours, minutes = zone[:3], zone[4:]
    return hours if minutes == "00" and rng.random() < 0.5 else hours + minutes


def _timestamp(rng: random.Random) -> str | int:
    """A timestamp: mostly valid (RFC 3339 or epoch milliseconds), some in the documented
    lenient forms, and a few in each of the forms the product treats apart."""
    r = rng.random()
    if r < 0.02:
        return rng.choice(EDGE_TIMESTAMPS)
    if rng.random() < 0.85:
        micros = ARRIVAL_MICROS - rng.randrange(30 * MICROS_PER_DAY)
    else:
        micros = rng.randrange(_YEAR_2, _YEAR_9998)
    if r < 0.27:
        return micros // 1000
    offset = 0 if rng.random() < 0.5 else rng.randrange(-72, 73) * 15
    parts = _rfc3339_parts(micros, offset, rng.choice((0, 0, 0, 1, 3, 3, 6, 6, 9)), rng)
    s = rng.random()
    if s < 0.02:
        parts[1] = " "
    elif s < 0.04:
        parts[3] = ""
    elif s < 0.06:
        parts[3] = _short_offset(parts[3], rng)
    elif s < 0.07:
        parts[1] = "t" if rng.random() < 0.5 or parts[3] != "Z" else parts[1]
        parts[3] = "z" if parts[3] == "Z" else parts[3]
    elif s < 0.075:
        parts[2] = parts[2][:8] + "." + "".join(rng.choices(_DIGITS, k=rng.randint(10, 12)))
    elif s < 0.08:
        return rng.choice(LEAP_SECONDS)
    elif s < 0.085:
        parts[3] = rng.choice(FAR_OFFSETS)
    elif s < 0.09:
        return rng.choice(OUTSIDE_YEARS)
    return "".join(parts)


def _id(rng: random.Random, prefix: str) -> str:
    if rng.random() < 0.05:
        return rng.choice((" ", "\n", "\u0000", "0", "\U0001f600", "x" * 300, "\u00e9\u0301"))
    return f"{prefix}-{rng.randrange(10**6)}"


def _user_id(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.02:
        return 1
    if r < 0.04:
        return LONG_LIMIT - 1
    return rng.randrange(1, LONG_LIMIT) if r < 0.1 else rng.randrange(1, 100_000)


def _number(rng: random.Random) -> int | float:
    r = rng.random()
    if r < 0.3:
        return rng.randrange(-1000, 1000)
    if r < 0.9:
        return round(rng.uniform(-50, 50), rng.randrange(1, 8))
    return rng.choice((0, -0.0, 0.0, 1e308, -1e308, 5e-324, 1e-7, 10**30, 2**53 + 1, 0.1 + 0.2))


def _number_in(rng: random.Random, low: int, high: int) -> int | float:
    r = rng.random()
    if r < 0.1:
        return rng.choice((low, high, float(low), float(high)))
    if r < 0.4:
        return rng.randint(low, high)
    return round(rng.uniform(low, high), rng.randrange(0, 6))


def _text(rng: random.Random, length: int) -> str:
    return "".join(rng.choices(_NAME_CHARS, k=length))


def _optional(rng: random.Random, doc: dict[str, Any], name: str, make: Callable[[], Any]) -> None:
    """Absent, null or ``make()``."""
    r = rng.random()
    if r < 0.1:
        doc[name] = None
    elif r < 0.6:
        doc[name] = make()


def _extras(rng: random.Random, doc: dict[str, Any], known: Iterable[str]) -> None:
    names = [n for n in _EXTRA_NAMES if n not in known]
    for _ in range(rng.randint(1, 3)):
        doc[rng.choice(names)] = rng.choice(_EXTRA_VALUES)


def _sensor(rng: random.Random) -> dict[str, Any]:
    """A valid reading of a random sensor type."""
    kind = rng.choice(("heart_rate", "temperature", "accelerometer"))
    doc: dict[str, Any] = {"event_id": _id(rng, "e"), "device_id": _id(rng, "d")}
    r = rng.random()
    if r < 0.1:
        doc["user_id"] = None
    elif r < 0.75:
        doc["user_id"] = _user_id(rng)
    doc["sensor_type"] = kind
    doc["event_time"] = _timestamp(rng)
    if kind == "heart_rate":
        doc["value"] = _number_in(rng, 20, 250)
        doc["unit"] = "bpm"
    elif kind == "temperature":
        doc["value"] = _number_in(rng, -50, 150)
        _optional(rng, doc, "unit", lambda: rng.choice(("C", "\u00b0C", "")))
    else:
        _optional(rng, doc, "value", lambda: _number(rng))
        doc.update({axis: _number(rng) for axis in "xyz"})
        _optional(rng, doc, "activity", lambda: rng.choice(("stand", "sit", "walk", "bike")))
    if kind != "accelerometer" and rng.random() < 0.2:
        for axis in "xyz":
            _optional(rng, doc, axis, lambda: _number(rng))
    _optional(rng, doc, "danger_level", lambda: rng.choice(("LOW", "MEDIUM", "HIGH")))
    _optional(rng, doc, "model", lambda: _text(rng, rng.randrange(12)))
    if rng.random() < 0.6:
        geo: dict[str, Any] = {}
        _optional(rng, geo, "city", lambda: _text(rng, rng.randrange(1, 12)))
        _optional(rng, geo, "country", lambda: rng.choice(("FR", "Deutschland", "")))
        if rng.random() < 0.1:
            geo["zip"] = rng.choice(("75001", 75001, None, [1], {"a": 1}))
        doc["geolocation"] = None if rng.random() < 0.15 else geo
    if rng.random() < 0.15:
        _extras(rng, doc, SENSOR_FIELDS)
    return doc


def _user(rng: random.Random) -> dict[str, Any]:
    """A valid user profile."""
    doc: dict[str, Any] = {"user_id": _user_id(rng)}
    for name in ("first_name", "last_name"):
        _optional(
            rng, doc, name, lambda: _text(rng, 200 if rng.random() < 0.05 else rng.randrange(25))
        )
    _optional(rng, doc, "dob", lambda: _dob(rng))
    _optional(rng, doc, "gender", lambda: rng.choice(("F", "M", "X")))
    _optional(rng, doc, "country", lambda: "".join(rng.choices("ABCDEFGHIJKLMNOPQRSTUVWXYZ", k=2)))
    doc["updated_at"] = _timestamp(rng)
    if rng.random() < 0.15:
        _extras(rng, doc, USER_FIELDS)
    return doc


def _dob(rng: random.Random) -> str:
    if rng.random() < 0.1:
        return rng.choice(VALID_DOBS)
    day = datetime.date(1900, 1, 1) + datetime.timedelta(days=rng.randrange(45_412))
    return day.isoformat()


SENSOR_FIELDS = tuple(SHIPPED.contracts["sensors"].document["properties"])
USER_FIELDS = tuple(SHIPPED.contracts["users"].document["properties"])
Mutation = Callable[[random.Random, dict[str, Any]], tuple[Any, str]]


def _drop(required: Callable[[dict[str, Any]], Sequence[str]]) -> Mutation:
    def mutate(rng: random.Random, doc: dict[str, Any]) -> tuple[Any, str]:
        name = rng.choice(required(doc))
        doc.pop(name, None)
        return doc, f"drop {name}"

    return mutate


def _set(names: Sequence[str], values: Callable[[dict[str, Any], str], Sequence[Any]]) -> Mutation:
    def mutate(rng: random.Random, doc: dict[str, Any]) -> tuple[Any, str]:
        name = rng.choice(names)
        doc[name] = rng.choice(values(doc, name))
        return doc, f"{name}={doc[name]!r:.40}"

    return mutate


def _duplicate(rng: random.Random, doc: dict[str, Any]) -> tuple[Any, str]:
    members = list(doc.items())
    name, value = rng.choice(members)
    members.insert(rng.randrange(len(members) + 1), (name, rng.choice((value, "dup", 1))))
    return Pairs(tuple(members)), f"duplicate {name}"


def _add_extras(known: Sequence[str]) -> Mutation:
    def mutate(rng: random.Random, doc: dict[str, Any]) -> tuple[Any, str]:
        _extras(rng, doc, known)
        if rng.random() < 0.1:
            depth = rng.choice((999, 1001, 1100, 1500))
            doc["deep"] = Raw("[" * depth + "]" * depth)
        return doc, "extras"

    return mutate


def _sensor_required(doc: dict[str, Any]) -> Sequence[str]:
    branch = {"heart_rate": ("value",), "temperature": ("value",), "accelerometer": tuple("xyz")}
    kind = doc.get("sensor_type")
    return (
        "event_id",
        "device_id",
        "sensor_type",
        "event_time",
        *(branch.get(kind, ()) if isinstance(kind, str) else ()),
    )


def _value_edges(doc: dict[str, Any], name: str) -> Sequence[Any]:
    if name == "user_id":
        return USER_ID_EDGES
    edges: Sequence[Any] = AXIS_EDGES
    if name == "value":
        edges = VALUE_EDGES.get(str(doc.get("sensor_type")), AXIS_EDGES)
    return edges


def _switch_type(rng: random.Random, doc: dict[str, Any]) -> tuple[Any, str]:
    doc["sensor_type"] = rng.choice(("heart_rate", "temperature", "accelerometer"))
    return doc, f"now {doc['sensor_type']}"


def _values(values: Sequence[Any]) -> Callable[[dict[str, Any], str], Sequence[Any]]:
    return lambda _doc, _name: values


_RAW = tuple(Raw(t) for t in RAW_TOKENS)
SENSOR_MUTATIONS: tuple[Mutation, ...] = (
    _drop(_sensor_required),
    _set(SENSOR_FIELDS, _values((None,))),
    _set(SENSOR_FIELDS, _values(WRONG_TYPES)),
    _set(("value", "value", "x", "y", "z", "user_id"), _value_edges),
    _set(("value", "value", "x", "y", "z", "user_id"), _value_edges),
    _set(("sensor_type",), _values(SENSOR_TYPE_MISSES)),
    _set(("danger_level",), _values(DANGER_MISSES)),
    _set(("event_id", "device_id"), _values(("", " ", "\t", "0"))),
    _set(("event_time",), _values(BAD_TIMESTAMPS)),
    _set(("event_time",), _values(BAD_TIMESTAMPS)),
    _switch_type,
    _set(("geolocation",), _values(GEOLOCATIONS)),
    _add_extras(SENSOR_FIELDS),
    _set(SENSOR_FIELDS, _values(_RAW)),
)
USER_MUTATIONS: tuple[Mutation, ...] = (
    _drop(lambda _doc: ("user_id", "updated_at")),
    _set(USER_FIELDS, _values((None,))),
    _set(USER_FIELDS, _values(WRONG_TYPES)),
    _set(("user_id",), _values(USER_ID_EDGES)),
    _set(("user_id",), _values(USER_ID_EDGES)),
    _set(("gender",), _values(GENDER_MISSES)),
    _set(
        ("first_name", "last_name"),
        lambda _d, _n: [_text(random.Random(len(_d)), n) for n in (199, 200, 201, 300)],
    ),
    _set(
        ("first_name", "last_name"),
        _values(
            (
                "\U0001f600" * 200,
                "\U0001f600" * 201,
                "e\u0301" * 100,
                "e\u0301" * 101,
                Raw('"' + "\\ud83d\\ude00" * 200 + '"'),
            )
        ),
    ),
    _set(("country",), _values(BAD_COUNTRIES)),
    _set(("dob",), _values(BAD_DOBS)),
    _set(("dob",), _values(BAD_DOBS)),
    _set(("updated_at",), _values(BAD_TIMESTAMPS)),
    _add_extras(USER_FIELDS),
    _set(USER_FIELDS, _values(_RAW)),
)


def _mangle(value: bytes, rng: random.Random) -> tuple[bytes, str]:
    """``value`` mangled byte by byte (a few ways leave it valid)."""
    how = rng.randrange(14)
    if how == 0:
        return value[: rng.randrange(1, len(value))], "truncated"
    if how == 1:
        tail = rng.choice((b" {}", b"x", b",", b"}", b"]", b" null", b"\x00", b"{", b'""', b"\n}"))
        return value + tail, "trailing content"
    if how == 2:
        spaces = (b" ", b"\n", b"\r\n", b"\t", b"")
        return rng.choice(spaces) + value + rng.choice(spaces), "surrounding whitespace"
    if how == 3:
        quoted = b'"' + value.replace(b"\\", b"\\\\").replace(b'"', b'\\"') + b'"'
        shapes = (b"[]", b"[1, 2]", b'"hello"', b"42", b"-0.5e3", b"true", b"null", b'""', quoted)
        return rng.choice((*shapes, b"[" + value + b"]")), "not an object"
    if how == 4:
        marks = (_BOM + _BOM + value, b" " + _BOM + value, _BOM, _BOM + b" ", b"\xff\xfe" + value)
        return rng.choice(marks), "byte-order marks"
    if how == 5:
        i = rng.randrange(len(value) + 1)
        return value[:i] + rng.choice(_INVALID_UTF8) + value[i:], "invalid utf-8"
    if how == 6:
        encoding = rng.choice(("utf-16", "utf-16-le", "utf-32"))
        return value.decode("utf-8", "replace").encode(encoding), encoding
    if how == 7:
        blank = (b"", b" ", b"\n", b" \t\r\n ", b"\x0c", b"\xc2\xa0", b"\t" * 5000)
        return rng.choice(blank), "blank"
    if how == 8:
        return value.replace(b'"', b"'"), "single quotes"
    if how == 9:
        return rng.choice((b"/* c */" + value, value + b" // c")), "comment"
    if how == 10:
        end = value.rfind(b"}")
        return value[:end] + b"," + value[end:], "trailing comma"
    if how == 11:
        depth = rng.choice((1, 5, 1200))
        return b"[" * depth + value + b"]" * depth, f"nested {depth}"
    if how == 12:
        return value.replace(b"null", b"None").replace(b"true", b"True"), "python literals"
    return rng.choice((value + b"\x00", b"\x00" + value)), "nul byte"


def _arrival(rng: random.Random, contract: Contract, doc: Any) -> int:
    """A Kafka timestamp: just after the event time, but for a few records on purpose
    exactly at, within or beyond the allowed skew before it."""
    if contract.event_time is None or not isinstance(doc, dict):
        return ARRIVAL_MICROS
    value = doc.get(contract.event_time)
    instant = None
    if isinstance(value, str):
        stamp = documented_date_time(value) or rfc3339_date_time(value)
        instant = stamp.micros if stamp is not None else None
    elif isinstance(value, int) and _epoch_millis(value):
        instant = value * 1000
    if instant is None:
        return ARRIVAL_MICROS
    limit = MAX_FUTURE_SECONDS * 1_000_000
    r = rng.random()
    if r < 0.04:
        beyond = rng.choice((1, 1_000, 1_000_000, 3_600_000_000, 3650 * MICROS_PER_DAY))
        return instant - limit - beyond
    if r < 0.06:
        return instant - limit
    if r < 0.1:
        return instant - rng.randrange(limit)
    return instant + rng.randrange(7_200_000_000)


def _written(doc: Any, style: Style, rng: random.Random) -> bytes:
    text = write(doc, style, rng).encode()
    if _INVALID_MARK.encode() in text:
        text = text.replace(_INVALID_MARK.encode(), rng.choice(_INVALID_UTF8))
    return text


def _key(rng: random.Random, contract: Contract, doc: Any) -> bytes | None:
    if contract.mode != "entities":
        return b"device"
    r = rng.random()
    if r < 0.03:
        return None
    if r < 0.04:
        return b"\xff"
    user_id = doc.get("user_id") if isinstance(doc, dict) else None
    return str(user_id).encode() if isinstance(user_id, int) else b"1"


def corpus(contract: Contract) -> list[Record]:
    """The contract's corpus (deterministic): documents, each in 1-5 spellings, some
    mangled; then sizes around the limit, and null values (users: tombstones)."""
    rng = random.Random(f"{SEED}:{contract.name}")
    make, mutations = (
        (_user, USER_MUTATIONS) if contract.mode == "entities" else (_sensor, SENSOR_MUTATIONS)
    )
    records: list[Record] = []
    while len(records) < RECORDS:
        doc: Any = make(rng)
        made = []
        for _ in range(rng.choices((0, 1, 2), weights=(45, 40, 15))[0]):
            doc, what = rng.choice((*mutations, _duplicate) if rng.random() < 0.05 else mutations)(
                rng, doc
            )
            made.append(what)
            if isinstance(doc, Pairs):
                break
        for _ in range(rng.randrange(1, 6)):
            value = _written(doc, _style(rng), rng)
            how = ", ".join(made) or "valid"
            r = rng.random()
            if r < 0.03:
                value, how = _BOM + value, how + ", byte-order mark"
            elif r < 0.1:
                value, mangled = _mangle(value, rng)
                how = f"{how}, {mangled}"
            records.append(
                Record(_key(rng, contract, doc), value, _arrival(rng, contract, doc), how)
            )
    for _ in range(600):
        doc = make(rng)
        target = rng.choice(
            (MAX_PAYLOAD_BYTES - 1, MAX_PAYLOAD_BYTES, MAX_PAYLOAD_BYTES + 1, 5000, 9000)
        )
        doc["pad"] = ""
        wide = rng.random() < 0.3
        room = target - len(_written(doc, _PLAIN, rng))
        doc["pad"] = "\u00e9" * (room // 2) if wide else "x" * room
        value = _written(doc, _PLAIN, rng)
        records.append(
            Record(
                _key(rng, contract, doc), value, _arrival(rng, contract, doc), f"{len(value)} bytes"
            )
        )
    for _ in range(1500 if contract.mode == "entities" else 100):
        key = rng.choice(TOMBSTONE_KEYS) if contract.mode == "entities" else b"device"
        records.append(Record(key, None, ARRIVAL_MICROS, "null value"))
    return records


def _rescue_keeps(value: Any) -> bool:
    """Whether the product's ``_rescued`` keeps ``value`` as is. It does not keep infinity
    (written `Infinity`, not JSON) and integers beyond 38 digits (doubles); the corpus has
    a few, to check their verdicts."""
    return not any(
        (isinstance(item, float) and not math.isfinite(item))
        or (isinstance(item, int) and abs(item) >= 10**38)
        for item in _walked(value)
    )


def _holds_surrogate(document: dict[str, Any]) -> bool:
    """Whether a key or a string anywhere in ``document`` holds an unpaired surrogate (a
    strict parse decodes a pair to one character, so what is left was escaped alone)."""
    return any(
        isinstance(item, str) and _SURROGATE.search(item) is not None for item in _walked(document)
    )


def _walked(value: Any) -> Iterator[Any]:
    """``value`` and everything in it: list items, object keys and values."""
    pending = [value]
    while pending:
        item = pending.pop()
        yield item
        if isinstance(item, list):
            pending += item
        elif isinstance(item, dict):
            pending += [*item, *item.values()]


_SURROGATE = re.compile("[\ud800-\udfff]")


# ---------------------------------------------------------------------------------------------
# The product: one batch per contract.

SOURCE = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("offset", LongType()),
        StructField("timestamp", LongType()),
    ]
)


@dataclass(frozen=True)
class Outcome:
    """Where the product put a record: silver (no code) or quarantine."""

    code: str | None
    detail: str | None
    rescued: str | None


def bronze_of(spark: SparkSession, contract: Contract, records: Sequence[Record]) -> DataFrame:
    """``records`` as bronze rows of the contract's topic, at consecutive offsets."""
    rows = [(r.key, r.value, offset, r.timestamp) for offset, r in enumerate(records)]
    kafka = spark.createDataFrame(rows, SOURCE).select(
        "key",
        "value",
        F.lit(contract.topic).alias("topic"),
        F.lit(0).alias("partition"),
        "offset",
        F.timestamp_micros("timestamp").alias("timestamp"),
        F.lit(None).cast(KAFKA_HEADERS).alias("headers"),
    )
    return to_records(kafka).withColumn("ingested_at", F.lit(ARRIVAL))


def parsed_records(spark: SparkSession, contract: Contract, records: Sequence[Record]) -> DataFrame:
    """``records`` validated by the product as the driver validates a batch, with the
    test's payload limit, future skew and a fixed today."""
    return parse_records(
        contract,
        bronze_of(spark, contract, records),
        MAX_PAYLOAD_BYTES,
        MAX_FUTURE_SECONDS,
        F.lit(TODAY),
    )


def product_outcomes(
    spark: SparkSession, contract: Contract, records: Sequence[Record]
) -> list[Outcome]:
    """Each record's outcome, by offset, from one batch: silver when it has no error_code
    (the driver's `split_valid_invalid` splits on it), else quarantine with its code and
    detail. (One pass: routing the rows on through the silver and quarantine projections
    cost a third more of the JVM's time and checks nothing about the verdict.)"""
    parsed = parsed_records(spark, contract, records)
    table = parsed.select(
        "kafka_offset", "error_code", "error_detail", F.col("record._rescued").alias("rescued")
    ).toArrow()
    columns = [table.column(c).to_pylist() for c in table.column_names]
    outcomes: dict[int, Outcome] = {}
    for offset, code, detail, rescued in zip(*columns, strict=True):
        assert offset not in outcomes, f"offset {offset} came out twice"
        outcomes[offset] = Outcome(code, detail, rescued if code is None else None)
    assert len(records) == len(outcomes)
    return [outcomes[i] for i in range(len(records))]


# ---------------------------------------------------------------------------------------------
# The tests.


@dataclass(frozen=True)
class Judged:
    """A contract's corpus, the expected verdicts and the product's outcomes."""

    contract: Contract
    records: list[Record]
    expected: list[Expected]
    outcomes: list[Outcome]
    documents: int  # distinct documents the reference judged


@pytest.fixture(scope="module")
def judged(spark: SparkSession) -> dict[str, Judged]:
    """Both contracts judged: the product's batches run while Python judges the records."""
    contracts = [SHIPPED.contracts[name] for name in CONTRACTS]
    with ThreadPoolExecutor(max_workers=1) as product:
        corpora, running = {}, {}
        for contract in contracts:
            corpora[contract.name] = corpus(contract)
            running[contract.name] = product.submit(
                product_outcomes, spark, contract, corpora[contract.name]
            )
        result = {}
        for contract in contracts:
            judge = Judge(contract)
            expected = [judge.expect(r) for r in corpora[contract.name]]
            result[contract.name] = Judged(
                contract,
                corpora[contract.name],
                expected,
                running[contract.name].result(),
                judge.reference.documents,
            )
    return result


def _shown(record: Record, expected: Expected, outcome: Outcome) -> str:
    value = record.value if record.value is None else record.value[:200]
    verdict = "silver" if outcome.code is None else "quarantine"
    return (
        f"- made: {record.made}\n  key={record.key!r} value={value!r}"
        f" kafka_timestamp_micros={record.timestamp}\n"
        f"  reference: {'valid' if expected.reference else 'invalid'};"
        f" expected product: {'valid' if expected.valid else 'invalid'}"
        f" {expected.code or ''} {expected.field or ''} {sorted(expected.differences)};"
        f" product: {verdict} {outcome.code} {outcome.detail!r}"
    )


def _agrees(expected: Expected, outcome: Outcome) -> bool:
    if (outcome.code is None) != expected.valid:
        return False
    if expected.code is None:
        return True
    return outcome.code == expected.code and (outcome.detail or "").startswith(f"{expected.field}:")


@pytest.mark.parametrize("name", CONTRACTS)
def test_the_product_accepts_what_the_reference_accepts_but_for_the_listed_differences(
    judged: dict[str, Judged], name: str
) -> None:
    j = judged[name]
    wrong = [
        i for i, (e, o) in enumerate(zip(j.expected, j.outcomes, strict=True)) if not _agrees(e, o)
    ]
    shown = "\n".join(_shown(j.records[i], j.expected[i], j.outcomes[i]) for i in wrong[:8])
    assert [] == wrong, f"{len(wrong)} of {len(j.records)} records disagree, e.g.:\n{shown}"


@pytest.mark.parametrize("name", CONTRACTS)
def test_the_corpus_is_large_and_mixes_verdicts(judged: dict[str, Judged], name: str) -> None:
    j = judged[name]
    size = len(j.records)
    reference_valid = sum(e.reference for e in j.expected) / size
    product_valid = sum(o.code is None for o in j.outcomes) / size
    codes = {o.code for o in j.outcomes} - {None}
    expected_codes = set(ERROR_CODES) - (
        {"event_time_in_future"} if j.contract.event_time is None else set()
    )
    assert (True, True, True, True, expected_codes) == (
        size >= RECORDS,
        j.documents >= 20_000,
        0.3 <= reference_valid <= 0.7,
        0.3 <= product_valid <= 0.7,
        codes,
    ), (size, j.documents, reference_valid, product_valid)


@pytest.mark.parametrize("name", CONTRACTS)
def test_every_difference_decides_records_of_the_corpus(
    judged: dict[str, Judged], name: str
) -> None:
    """Each category the contract's fields allow decides at least MIN_CASES records (the
    product's verdict differs from the reference's there, its error_code checked), so the
    first test fails if the product stops making that difference."""
    j = judged[name]
    decided = Counter(c for e in j.expected for c in e.differences)
    rare = {c: decided[c] for c in sorted(categories(j.contract)) if decided[c] < MIN_CASES}
    assert {} == rare, dict(decided)
    assert set(decided) <= categories(j.contract)


@pytest.mark.parametrize("name", CONTRACTS)
def test_silver_keeps_the_unknown_fields_in_rescued(judged: dict[str, Judged], name: str) -> None:
    j = judged[name]
    known = set(j.contract.top_level)
    wrong, checked = [], 0
    for record, expected, outcome in zip(j.records, j.expected, j.outcomes, strict=True):
        if outcome.code is not None or record.value is None:
            continue
        document = strict_document(record.value)
        assert document is not None
        unknown = {k: v for k, v in document.items() if k not in known}
        if not _rescue_keeps(unknown):
            continue
        checked += bool(unknown)
        rescued = json.loads(outcome.rescued) if outcome.rescued is not None else {}
        if rescued != unknown:
            wrong.append(
                _shown(record, expected, outcome) + f"\n  rescued: {outcome.rescued!r:.300}"
            )
    assert (True, []) == (checked >= 1000, wrong[:5])


LENIENT_TIMESTAMPS = {
    "a space for T": ("2024-05-01 10:15:30Z", "2024-05-01T10:15:30Z"),
    "no zone": ("2024-05-01T10:15:30.25", "2024-05-01T10:15:30.25Z"),
    "offset ±hh": ("2024-05-01T12:15:30+02", "2024-05-01T12:15:30+02:00"),
    "offset ±hhmm": ("2024-05-01T04:45:30-0530", "2024-05-01T04:45:30-05:30"),
    "a space, no zone": ("2024-05-01 10:15:30", "2024-05-01T10:15:30Z"),
}


@pytest.mark.parametrize("name", CONTRACTS)
def test_documented_timestamp_forms_outside_rfc_3339_are_accepted_by_the_product_alone(
    spark: SparkSession, name: str
) -> None:
    """docs/contracts.md's timestamps: the product accepts forms that RFC 3339 (the JSON
    Schema ``date-time`` format) rejects, and reads each as its RFC 3339 equivalent."""
    contract = SHIPPED.contracts[name]
    field = contract.event_time or contract.order_by
    assert field is not None
    base: dict[str, Any] = (
        {"event_id": "e", "device_id": "d", "sensor_type": "heart_rate", "value": 72}
        if contract.event_time
        else {"user_id": 7}
    )
    reference = Reference(contract)
    written = [(lenient, rfc) for lenient, rfc in LENIENT_TIMESTAMPS.values()]
    records = [
        Record(b"7", json.dumps({**base, field: text}).encode(), ARRIVAL_MICROS, text)
        for pair in written
        for text in pair
    ]
    parsed = parsed_records(spark, contract, records).select(
        "value_text", "error_code", F.unix_micros(f"record.{field}").alias("micros")
    )
    product = {
        json.loads(r["value_text"])[field]: (r["error_code"], r["micros"]) for r in parsed.collect()
    }

    def instant(text: str) -> int | None:
        stamp = rfc3339_date_time(text)
        return stamp.micros if stamp is not None else None

    actual = {
        n: (
            reference.accepts({**base, field: lenient}),
            reference.accepts({**base, field: rfc}),
            product[lenient],
            product[rfc],
        )
        for n, (lenient, rfc) in LENIENT_TIMESTAMPS.items()
    }
    assert {
        n: (False, True, (None, instant(rfc)), (None, instant(rfc)))
        for n, (_, rfc) in LENIENT_TIMESTAMPS.items()
    } == actual


def test_the_typed_fast_path_leaves_every_outcome_and_value_as_the_exact_checks(
    spark: SparkSession, judged: dict[str, Judged]
) -> None:
    """Each corpus validated with the typed fast path and with the exact checks alone: the
    same rows (verdict, code, detail and every typed value), and the fast path decides most
    of the valid records (users' dates bounded by today included)."""
    for name in ("sensors", "users"):
        corpus = judged[name]
        bronze = bronze_of(spark, corpus.contract, corpus.records).cache()
        today = F.lit(TODAY)
        runs = [
            parse_records(
                corpus.contract, bronze, MAX_PAYLOAD_BYTES, MAX_FUTURE_SECONDS, today, fast
            ).cache()
            for fast in (True, False)
        ]
        differ = (runs[0].exceptAll(runs[1]).count(), runs[1].exceptAll(runs[0]).count())
        assert (0, 0) == differ, name
        path = FastPath.of(corpus.contract)
        assert path is not None, name
        marked = path.mark(bronze, MAX_PAYLOAD_BYTES, MAX_FUTURE_SECONDS, today)
        fast = marked.where(FAST).count()
        valid = sum(outcome.code is None for outcome in corpus.outcomes)
        assert valid / 2 < fast < valid, (name, fast, valid)
        for frame in (*runs, bronze):
            frame.unpersist()
