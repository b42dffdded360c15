"""The event ids an events contract's silver table received lately, kept by its writer.

Dedup (`service.ingest.modes.dedup`) searches silver's horizon for a batch's ids: a
Spark job over the horizon's files, about 0.5 s even for ten readings, that nearly
always finds nothing. `RecentIds` keeps the event ids of every silver row that
arrived from a floor on, as 64-bit hashes (a superset: a collision only costs a search).
A batch whose ids are distinct and none of them kept holds no duplicate, since a
duplicate repeats an id earlier in its batch or one silver holds within the
horizon. Such a batch skips the search. Any other batch runs it, and the search
stays the one definition of a duplicate; it reads only the silver files whose arrivals
meet those of the kept batches that share an id with it (`Sighting.windows`): silver's
horizon holds a file per batch until maintenance compacts them (360 an hour at a 10 s
trigger), and reading all of them made every batch slower than the last. The search
narrows to the batch's ids that are kept or that the batch repeats
(`Sighting.candidates`) without finding them itself.

The ids are loaded from silver's files (`LiveFiles`) whenever silver's version is
not the one kept (a start, maintenance, any other writer), and each batch's ids are
added as it writes. Only small batches' ids are collected to the driver (by the batch's
first job, `service.ingest.batch.summarize`, and its exact checks'), and only while
silver holds few ids from the floor on (when it holds more, a load is tried again
every 5 minutes). At high rates batches are large, their fixed cost matters less,
and every batch searches.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pyarrow.compute as pc
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from service.ingest.batch import utc_from_micros
from service.ingest.modes.dedup import id_hash
from service.lake.delta import Commit
from service.lake.live_files import LiveFiles, Window

# Readings a batch may have for its ids to be collected to the driver.
SMALL_BATCH = 10_000
# Ids kept at most: about 70 MB of hashes, the horizon and slack at 230 readings/s.
MOST_IDS = 1_000_000
# Arrivals may go back between batches (partitions, producers' clocks): ids are kept
# this long beyond the horizon of the latest batch.
_SLACK = timedelta(minutes=10)
# Seconds between attempts to load while silver holds too many ids (each one a read).
_RETRY_SECONDS = 300.0
_MICROSECOND = timedelta(microseconds=1)
_NEVER = datetime.max.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Sighting:
    """What the kept ids say of a batch: ``clear`` when it cannot hold a duplicate; else the
    arrival ``windows`` (UTC) of the kept batches sharing an id with it, which hold every
    silver row that does (none: no silver row does), and the ``candidates``: the id hashes
    of the batch that silver holds or the batch repeats (every repeat's is one of them);
    both None when unknown."""

    clear: bool
    windows: tuple[Window, ...] | None = None
    candidates: frozenset[int] | None = None


class RecentIds:
    """The ids silver holds from a floor of ``silver``'s column (its arrival time) on.

    Used by silver's writer, one batch at a time: `sighting` before the batch's
    silver commit, `committed` after it.
    """

    def __init__(
        self,
        silver: LiveFiles,
        horizon_seconds: int,
        id_column: str,
        most: int = MOST_IDS,
        small: int = SMALL_BATCH,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._silver = silver
        self._id = id_column
        self._clock = clock
        # When silver last held too many ids to load, no load is tried before this.
        self._retry_at = -math.inf
        self._horizon = timedelta(seconds=horizon_seconds)
        self._most = most
        self._small = small
        # The silver version whose ids are kept; None when none are.
        self._version: int | None = None
        # Every silver id that arrived at or after the floor is kept (UTC).
        self._floor = _NEVER
        # The ids of each load and batch, with the arrivals among them (first, latest).
        self._kept: deque[tuple[Window, frozenset[int]]] = deque()
        self._size = 0

    def sighting(
        self,
        spark: SparkSession,
        ids: Sequence[int] | None,
        first: datetime | None,
        last: datetime | None,
    ) -> Sighting:
        """What the kept ids say of a batch's readings with ``ids`` (their `id_hash`es,
        None when not collected), arriving within ``[first, last]`` (UTC): clear when few
        enough, distinct and unseen; else where silver's rows sharing them arrived, when
        all are kept.

        Its ids are kept (while any are), so call it once per batch, before its commit.
        """
        if first is None or last is None or ids is None or len(ids) > self._small:
            self._drop()
            return Sighting(clear=False)
        start = first - self._horizon
        if not self._current(spark, start - _SLACK):
            return Sighting(clear=False)
        self._expire(start - _SLACK)
        batch = frozenset(ids)
        shared = [(window, batch & kept) for window, kept in self._kept]
        sharing = tuple(window for window, ids_shared in shared if ids_shared)
        repeated = (h for h, n in Counter(ids).items() if n > 1)
        all_kept = start >= self._floor
        self._keep((first, last), batch)
        if not all_kept:
            return Sighting(clear=False)
        if not sharing and len(batch) == len(ids):
            return Sighting(clear=True)
        candidates = frozenset(repeated).union(*(ids_shared for _, ids_shared in shared))
        return Sighting(clear=False, windows=sharing, candidates=candidates)

    def committed(self, commit: Commit | None) -> None:
        """The writer's silver append returned ``commit``: its ids are kept already."""
        if commit is not None and self._version is not None:
            if commit.version == self._version + 1:
                self._version = commit.version
            else:
                self._drop()

    @property
    def size(self) -> int:
        """How many ids are kept."""
        return self._size

    def _current(self, spark: SparkSession, floor: datetime) -> bool:
        """Whether the ids of silver's latest version are kept, loading them from ``floor``
        on if they are not and there are few enough (else not again for a while)."""
        version = int(self._silver.version(spark))
        if version == self._version:
            return True
        self._drop()
        if self._silver.holds_none(floor, None):
            # No file of silver holds an arrival from the floor on: nothing to load.
            self._version, self._floor = version, floor
            return True
        now = self._clock()
        if now < self._retry_at:
            return False
        arrivals = self._silver.read(spark, floor, None).select(
            id_hash(self._id).alias("id"), F.unix_micros(self._silver.column).alias("micros")
        )
        loaded = arrivals.limit(self._most + 1).toArrow()
        if loaded.num_rows > self._most:
            self._retry_at = now + _RETRY_SECONDS
            return False
        self._version, self._floor = version, floor
        if loaded.num_rows:
            bounds = pc.min_max(loaded["micros"])
            window = (
                utc_from_micros(bounds["min"].as_py()),
                utc_from_micros(bounds["max"].as_py()),
            )
            self._keep(window, frozenset(loaded["id"].to_pylist()))
        return True

    def _keep(self, arrivals: Window, ids: frozenset[int]) -> None:
        if self._version is None:
            return
        self._kept.append((arrivals, ids))
        self._size += len(ids)
        if self._size > self._most:
            self._drop()

    def _expire(self, floor: datetime) -> None:
        """Forget the oldest ids that all arrived before ``floor``."""
        while self._kept and self._kept[0][0][1] < floor:
            (_, latest), ids = self._kept.popleft()
            self._size -= len(ids)
            self._floor = max(self._floor, latest + _MICROSECOND)

    def _drop(self) -> None:
        self._version, self._floor, self._size = None, _NEVER, 0
        self._kept.clear()
