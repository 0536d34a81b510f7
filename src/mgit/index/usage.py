"""How versions are stored, as `show`, `du` and the web pages report it: the catalog's
queries over objects and the versions that use them, for any number of versions in a few
queries. `Catalog` has them as methods (`UsageQueries` is its base)."""

from __future__ import annotations

import json
from collections.abc import Iterable

from mgit.reports import ModelUsage
from mgit.util.database import Database

# A list of ids as one JSON parameter: no hand-built "?, ?, ..." lists, no length limit, and a
# read stays a read (a temporary table would need a write transaction).
IDS = "(SELECT value FROM json_each(?))"


def storage_class(codec_names: str) -> str:
    """`delta`, `derived` or `standalone`, from a chain's names as recorded (`a+b+c`): each
    codec's class says which (imported here, not above, so that commands which never ask
    do not load numpy and the codecs)."""
    from mgit.codecs import storage_of

    return storage_of(codec_names)


class UsageQueries(Database):
    """The storage figures of versions, over the catalog's tables."""

    def storage_by_codec(self, vid: str) -> list[tuple[str, int, int, int]]:
        """(codec chain, objects, logical bytes, stored bytes) of a version's objects."""
        return list(
            self.db.execute(
                """SELECT o.codec, COUNT(*), SUM(o.logical_size), SUM(o.stored_size)
               FROM version_objects vo JOIN objects o ON o.id = vo.object WHERE vo.version = ?
               GROUP BY o.codec ORDER BY o.codec""",
                (vid,),
            )
        )

    def shared_objects(self, vid: str) -> int:
        """How many objects of a version other versions use too (deduplicated)."""
        return self.db.execute(
            """SELECT COUNT(*) FROM version_objects vo WHERE vo.version = ? AND EXISTS
               (SELECT 1 FROM version_objects o2 WHERE o2.object = vo.object AND o2.version != ?)""",
            (vid, vid),
        ).fetchone()[0]

    def tensor_storage(self, vids: list[str]) -> dict[str, int]:
        """How the tensors of these versions are stored, together (see `tensor_counts`)."""
        return _summed(self.tensor_counts(vids).values())

    def tensor_counts(self, vids: list[str]) -> dict[str, dict[str, int]]:
        """Per version, how its tensors are stored: `deduplicated` (an earlier version stored
        the object), else by the first codec of the object's chain. One query for any number
        of versions, so a page over a thousand models does not issue a query per model."""
        out: dict[str, dict[str, int]] = {v: {} for v in vids}
        rows = self.db.execute(
            f"""SELECT v.id, o.codec, o.storage,
                       EXISTS (SELECT 1 FROM version_objects vo2 JOIN versions v2 ON v2.id = vo2.version
                               WHERE vo2.object = vo.object AND v2.rowid < v.rowid), COUNT(*)
                FROM version_objects vo JOIN objects o ON o.id = vo.object JOIN versions v ON v.id = vo.version
                WHERE vo.version IN {IDS} AND o.kind = 'tensor'
                GROUP BY 1, 2, 3, 4""",
            (json.dumps(vids),),
        )
        unknown: set[str] = set()
        for vid, codec, storage, dedup, n in rows:
            if storage is None:  # a row written before 0004: classed now, and remembered
                storage = storage_class(codec)
                unknown.add(codec)
            key = "deduplicated" if dedup else storage
            out[vid][key] = out[vid].get(key, 0) + n
        if unknown:
            with self.atomic() as tx:
                tx.executemany(
                    "UPDATE objects SET storage = ? WHERE codec = ? AND kind = 'tensor' AND storage IS NULL",
                    [(storage_class(c), c) for c in unknown],
                )
        return out

    def storage_by_version(self, vids: list[str]) -> dict[str, tuple[int, dict[str, int]]]:
        """Per version: (stored bytes of the objects it uses, `tensor_counts`)."""
        counts = self.tensor_counts(vids)
        rows = self.db.execute(f"SELECT id, stored_bytes FROM versions WHERE id IN {IDS}", (json.dumps(vids),))
        return {vid: (stored, counts.get(vid, {})) for vid, stored in rows}

    def physical_bytes(self, vids: list[str]) -> tuple[int, int]:
        """(objects, stored bytes) of the distinct objects that these versions use."""
        row = self.db.execute(
            f"""SELECT COUNT(*), COALESCE(SUM(o.stored_size), 0) FROM objects o WHERE o.id IN
                (SELECT object FROM version_objects WHERE version IN {IDS})""",
            (json.dumps(vids),),
        ).fetchone()
        return row[0], row[1]

    def model_usage(self, versions: dict[str, list[str]]) -> list[ModelUsage]:
        """`du`'s figures of each model, given its versions' ids: their logical bytes, the
        distinct objects they use (count, stored bytes), how their tensors are stored; three
        queries for every model together."""
        vids = [vid for chain in versions.values() for vid in chain]
        pairs = json.dumps([[model, vid] for model, chain in versions.items() for vid in chain])
        rows = self.db.execute(
            """WITH g(model, vid) AS (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')
                                        FROM json_each(?)),
                     d AS (SELECT DISTINCT g.model, vo.object FROM g JOIN version_objects vo ON vo.version = g.vid)
                SELECT d.model, COUNT(*), COALESCE(SUM(o.stored_size), 0) FROM d JOIN objects o ON o.id = d.object
                GROUP BY d.model""",
            (pairs,),
        )
        objects = {model: (count, stored) for model, count, stored in rows}
        logical = dict(
            self.db.execute(f"SELECT id, logical_bytes FROM versions WHERE id IN {IDS}", (json.dumps(vids),))
        )
        counts = self.tensor_counts(vids)
        out = []
        for model, chain in versions.items():
            count, stored = objects.get(model, (0, 0))
            out.append(
                ModelUsage(
                    model,
                    len(chain),
                    sum(logical.get(v, 0) for v in chain),
                    stored,
                    count,
                    _summed(counts.get(v, {}) for v in chain),
                )
            )
        return out

    def object_sizes(self, vids: list[str]) -> dict[str, int]:
        """{object: stored bytes} of the distinct objects these versions use (the logical
        size where the stored one is not known yet: a lazy clone's object not fetched)."""
        rows = self.db.execute(
            f"""SELECT o.id, CASE WHEN o.stored_size > 0 THEN o.stored_size ELSE o.logical_size END FROM objects o
                WHERE o.id IN (SELECT object FROM version_objects WHERE version IN {IDS})""",
            (json.dumps(vids),),
        )
        return dict(rows)

    def total_objects(self) -> tuple[int, int, int]:
        """(count, logical bytes, stored bytes) of every object the catalog knows."""
        r = self.db.execute(
            "SELECT COUNT(*), COALESCE(SUM(logical_size), 0), COALESCE(SUM(stored_size), 0) FROM objects"
        ).fetchone()
        return r[0], r[1], r[2]


def _summed(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    """Counts by kind (`tensor_counts`' of several versions) added up."""
    out: dict[str, int] = {}
    for per_version in counts:
        for key, n in per_version.items():
            out[key] = out.get(key, 0) + n
    return out
