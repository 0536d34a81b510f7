"""The catalog: a SQLite index of models, versions, lineage edges and object sizes
(the storage figures' queries are in `mgit.index.usage`, its base).

Everything in it is derived from objects and refs (test registrations and results live in
checks.sqlite instead), so it can be dropped and rebuilt (`index`, `sync`). It exists for speed: `ls`,
`log`, `du` and graph queries read it instead of decoding records. WAL mode lets readers run
beside a writer; each write is one transaction (`atomic()`), and each schema change is a
named migration recorded in the same transaction that applies it.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mgit.errors import CatalogError, CorruptObjectError, MissingObjectError
from mgit.index.rows import (
    GRAPH_COLUMNS,
    INSERT_VERSION,
    VERSION_COLUMNS,
    ObjectRow,
    VersionRow,
    decoded_rows,
    named_rows,
    version_values,
)
from mgit.index.tags import effective
from mgit.index.usage import IDS, UsageQueries, storage_class
from mgit.reports import ParentInfo
from mgit.store.objects import Parent, Version, ancestors_first

if TYPE_CHECKING:  # the store's types only: indexing reads records through it
    from mgit.index.refs import RefStore
    from mgit.index.tags import TagStore
    from mgit.store.base import ObjectStore

MIGRATIONS: list[tuple[str, list[str]]] = [
    (
        "0001_initial",
        [
            "CREATE TABLE models (name TEXT PRIMARY KEY, head TEXT NOT NULL)",
            """CREATE TABLE versions (
                id TEXT PRIMARY KEY, model TEXT NOT NULL, seq INTEGER NOT NULL,
                manifest TEXT NOT NULL, predecessor TEXT, message TEXT NOT NULL,
                author TEXT NOT NULL, time TEXT NOT NULL, tags TEXT NOT NULL,
                files INTEGER NOT NULL, tensors INTEGER NOT NULL, params INTEGER NOT NULL,
                logical_bytes INTEGER NOT NULL, stored_bytes INTEGER NOT NULL,
                new_bytes INTEGER NOT NULL, lossy TEXT, recipe TEXT)""",
            "CREATE INDEX versions_model ON versions (model, seq)",
            """CREATE TABLE edges (child TEXT NOT NULL, position INTEGER NOT NULL,
                parent TEXT NOT NULL, relation TEXT NOT NULL, PRIMARY KEY (child, position))""",
            "CREATE INDEX edges_parent ON edges (parent)",
            """CREATE TABLE objects (id TEXT PRIMARY KEY, kind TEXT NOT NULL,
                logical_size INTEGER NOT NULL, stored_size INTEGER NOT NULL, codec TEXT NOT NULL)""",
            """CREATE TABLE version_objects (version TEXT NOT NULL, object TEXT NOT NULL,
                PRIMARY KEY (version, object)) WITHOUT ROWID""",
            "CREATE INDEX version_objects_object ON version_objects (object)",
        ],
    ),
    (
        # Per version, the sketch that parent inference compares (mgit.lineage.sketch): derived from
        # the version's tensors, so a rebuilt catalog computes it again when it is needed.
        "0002_sketches",
        ["CREATE TABLE sketches (version TEXT PRIMARY KEY, data BLOB NOT NULL)"],
    ),
    (
        # The delta bases each object is coded against (JSON list; NULL: not recorded yet),
        # so that what an object needs is known without its file: a lazy clone fetches a
        # version's objects with their bases in one go, and gc keeps the bases of objects
        # that live only on the remote.
        "0003_object_bases",
        ["ALTER TABLE objects ADD COLUMN bases TEXT"],
    ),
    (
        # How each object is stored (standalone, delta, derived), as its first codec's class
        # says when the row is written: `show` and `du` then need neither numpy nor the codecs.
        "0004_object_storage",
        ["ALTER TABLE objects ADD COLUMN storage TEXT"],
    ),
    (
        # A version no model's history holds any more (`mgit rm`), kept because a live version
        # was derived from it: displays say so. Derived from the refs by `set_heads`.
        "0005_removed_versions",
        ["ALTER TABLE versions ADD COLUMN removed INTEGER NOT NULL DEFAULT 0"],
    ),
    (
        # Tags set after a version was added (mgit.index.tags): the overlay each version's `tags`
        # column has applied over its record's, so that a sync applies only what changed.
        "0006_tag_overlays",
        ["CREATE TABLE tag_overlays (version TEXT PRIMARY KEY, overlay TEXT NOT NULL)"],
    ),
    (
        # A checkpoint's run, step and metrics (the record's `run` less its optimizer state and
        # arguments), so that `log` and the model page read a run's metrics from rows.
        "0007_runs",
        ["ALTER TABLE versions ADD COLUMN run TEXT"],
    ),
]


def _parent_info(vid: str, relation: str, model: str | None, seq: int | None, removed: int | None) -> ParentInfo:
    return ParentInfo(vid, model or "?", seq or 0, relation, bool(removed))


class Catalog(UsageQueries):
    def __init__(
        self,
        path: Path,
        *,
        removed: Callable[[], set[str]] = set,
        remote: Callable[[], Callable[[str], bool]] = lambda: lambda _name: False,
    ) -> None:
        """`removed` reads the versions removed from inside a history (mgit.index.retired),
        which a history still passes through and displays must say are removed; `remote`
        says which models without a ref here a remote holds (their versions are not removed:
        they are remote-only, as a clone of some models brings its ancestors)."""
        super().__init__(path, MIGRATIONS, synchronous="NORMAL")  # derived data: a lost commit is re-derived
        self._removed = removed
        self._remote = remote

    # --- writing ------------------------------------------------------------------------
    def add_objects(self, rows: Iterable[ObjectRow]) -> None:
        with self.atomic() as tx:
            self._insert_objects(tx, rows)

    @staticmethod
    def _insert_objects(tx: Any, rows: Iterable[ObjectRow]) -> None:
        tx.executemany(
            "INSERT OR REPLACE INTO objects (id, kind, logical_size, stored_size, codec, bases, storage) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    r.id,
                    r.kind,
                    r.logical_size,
                    r.stored_size,
                    r.codec,
                    json.dumps(list(r.bases)),
                    storage_class(r.codec) if r.kind == "tensor" else None,
                )
                for r in rows
            ],
        )

    @staticmethod
    def _index_versions(tx: Any, order: list[tuple[str, Version]], objects: Mapping[str, set[str]]) -> None:
        """Rows for these versions (ancestors first; those indexed already are skipped), a
        statement a table for all of them: a clone indexes thousands at once. A version's
        position is its record's number, else its predecessor's plus one; its new bytes are
        those of its objects that no version before it (indexed, or earlier in `order`) uses."""
        vids = [v for v, _ in order]
        known = {r[0] for r in tx.execute(f"SELECT id FROM versions WHERE id IN {IDS}", (json.dumps(vids),))}
        order = [(v, version) for v, version in order if v not in known]
        if not order:
            return
        every = sorted(set().union(*(objects[v] for v, _ in order)))
        sizes = dict(tx.execute(f"SELECT id, stored_size FROM objects WHERE id IN {IDS}", (json.dumps(every),)))
        used = {
            r[0]
            for r in tx.execute(
                f"SELECT DISTINCT object FROM version_objects WHERE object IN {IDS}", (json.dumps(every),)
            )
        }
        before = [version.predecessor for _, version in order if version.predecessor]
        seqs = dict(tx.execute(f"SELECT id, seq FROM versions WHERE id IN {IDS}", (json.dumps(before),)))
        rows, edges, links = [], [], []
        for vid, version in order:
            seq = 1
            if version.number is not None:  # a re-used name's first version (or one after a removed latest)
                seq = version.number
            elif version.predecessor:
                if version.predecessor not in seqs:  # callers index ancestors first; numbering from 1 would be wrong
                    raise CatalogError(f"predecessor {version.predecessor[:12]} of version {vid[:12]} is not indexed")
                seq = seqs[version.predecessor] + 1
            seqs[vid] = seq
            mine = sorted(objects[vid])
            stored = sum(sizes.get(o, 0) for o in mine)
            new = sum(sizes.get(o, 0) for o in mine if o not in used)
            used.update(mine)
            rows.append(version_values(vid, version, seq, stored, new))
            edges += [(vid, i, p.version, p.relation) for i, p in enumerate(version.parents)]
            links += [(vid, o) for o in mine]
        fresh = [(r[0],) for r in rows]
        tx.executemany("DELETE FROM tag_overlays WHERE version = ?", fresh)  # their tags are the records' again
        tx.executemany(INSERT_VERSION, rows)
        tx.executemany("INSERT INTO edges VALUES (?, ?, ?, ?)", edges)
        tx.executemany("INSERT INTO version_objects VALUES (?, ?)", links)

    def set_heads(self, read_heads: Callable[[], dict[str, str]]) -> None:
        """Make the models table mirror the refs and drop versions no head reaches.

        `read_heads` is called inside the write transaction, so a sync that read the refs
        earlier can never commit an older head over a newer one. A head that is not indexed
        yet (its writer is still indexing) keeps the model's previous row and disables
        pruning; the next sync completes it.
        """
        with self.atomic() as tx:
            heads = read_heads()
            old = dict(tx.execute("SELECT name, head FROM models"))
            pending = {
                n for n, h in heads.items() if not tx.execute("SELECT 1 FROM versions WHERE id = ?", (h,)).fetchone()
            }
            rows = {n: (old[n] if n in pending else h) for n, h in heads.items() if n not in pending or n in old}
            tx.execute("DELETE FROM models")
            tx.executemany("INSERT INTO models VALUES (?, ?)", sorted(rows.items()))
            if pending:
                return
            tx.execute(
                """WITH RECURSIVE live(id) AS (
                       SELECT head FROM models
                       UNION SELECT v.predecessor FROM versions v JOIN live ON v.id = live.id
                             WHERE v.predecessor IS NOT NULL
                       UNION SELECT e.parent FROM edges e JOIN live ON e.child = live.id)
                   DELETE FROM versions WHERE id NOT IN (SELECT id FROM live)"""
            )
            tx.execute("DELETE FROM edges WHERE child NOT IN (SELECT id FROM versions)")
            tx.execute("DELETE FROM version_objects WHERE version NOT IN (SELECT id FROM versions)")
            tx.execute("DELETE FROM tag_overlays WHERE version NOT IN (SELECT id FROM versions)")
            self._mark_histories(tx, self._removed(), self._remote())
            # Sketches stay: a fetched version's (from a remote's pack) is wanted once a pull
            # makes it reachable; gc removes those of versions it deletes.

    @staticmethod
    def _mark_histories(tx: Any, marked: set[str], remote: Callable[[str], bool]) -> None:
        """Each version on a model's history (its head and predecessors) belongs to that model
        (the ref's name: a renamed model's versions recorded the old one). Every other version
        left (kept as a live version's lineage parent) is removed, unless it is of a model
        with no ref here that a remote holds (remote-only); so is every one `marked`."""
        owned = dict(
            tx.execute(
                """WITH RECURSIVE chain(id, name) AS (
                       SELECT head, name FROM models
                       UNION SELECT v.predecessor, chain.name FROM versions v JOIN chain ON v.id = chain.id
                             WHERE v.predecessor IS NOT NULL)
                   SELECT id, name FROM chain"""
            )
        )
        names = set(owned.values())
        changes = []
        for vid, model, removed in tx.execute("SELECT id, model, removed FROM versions").fetchall():
            name = owned.get(vid, model)
            gone = vid in marked or (vid not in owned and (model in names or not remote(model)))
            if name != model or bool(removed) != gone:
                changes.append((name, int(gone), vid))
        tx.executemany("UPDATE versions SET model = ?, removed = ? WHERE id = ?", changes)

    def index(self, store: ObjectStore, *vids: str) -> None:
        """Index these versions and every version they link to that is not indexed yet,
        ancestors first (a version's position in its history is its predecessor's plus one),
        reading their records and object headers from `store`; one transaction for all."""
        loaded: dict[str, Version] = {}

        def linked(v: str) -> list[str]:
            loaded[v] = store.get_version(v)
            return loaded[v].linked_versions()

        order = [(v, loaded[v]) for v in ancestors_first(vids, linked, stop=self.has_version)]
        if not order:
            return
        objects = {
            v: store.get_manifest(version.manifest).object_ids() | version.linked_objects() | {v}
            for v, version in order
        }
        rows = [ObjectRow.read(store, oid) for oid in sorted(self.missing_objects(set().union(*objects.values())))]
        with self.atomic() as tx:
            self._insert_objects(tx, rows)
            self._index_versions(tx, order, objects)

    def sync(self, store: Callable[[], ObjectStore], refs: RefStore) -> None:
        """Index any head the catalog does not know (a writer killed after moving its ref,
        versions that arrived from a remote) and mirror the refs; `store()` only if one must be."""
        heads = refs.all()
        if heads == self.heads():
            return
        self.index(store(), *heads.values())
        self.set_heads(refs.all)

    def sync_tags(self, store: Callable[[], ObjectStore], tags: TagStore) -> None:
        """Give each indexed version the tags set on it later (its record's with `tags`'
        overlay applied), where they changed since the last sync (`store()`: to read them)."""
        wanted = tags.all()
        known = {v: json.loads(o) for v, o in self.db.execute("SELECT version, overlay FROM tag_overlays")}
        changed = [v for v in sorted(set(wanted) | set(known)) if wanted.get(v, {}) != known.get(v, {})]
        changed = [v for v in changed if self.has_version(v)]  # the others when they are indexed
        if not changed:
            return
        records = {v: store().get_version(v).tags for v in changed}
        with self.atomic() as tx:
            for v in changed:
                overlay = wanted.get(v, {})
                tx.execute("UPDATE versions SET tags = ? WHERE id = ?", (json.dumps(effective(records[v], overlay)), v))
                if overlay:
                    tx.execute("INSERT OR REPLACE INTO tag_overlays VALUES (?, ?)", (v, json.dumps(overlay)))
                else:
                    tx.execute("DELETE FROM tag_overlays WHERE version = ?", (v,))

    @contextmanager
    def explained(self) -> Iterator[None]:
        """Name the models that use an object when reading it fails."""
        try:
            yield
        except (CorruptObjectError, MissingObjectError) as exc:
            if not exc.used_by:
                users = self.object_users(exc.oid)
                if users:
                    exc.name_users(users)
            raise

    def parent_infos(self, parents: Iterable[Parent] | Iterable[tuple[str, str]]) -> list[ParentInfo]:
        """Lineage parents with their model names and sequence numbers (`?` and 0: not indexed)."""
        pairs = [(p.version, p.relation) if isinstance(p, Parent) else p for p in parents]
        query = f"SELECT id, model, seq, removed FROM versions WHERE id IN {IDS}"
        found = {r[0]: r[1:] for r in self.db.execute(query, (json.dumps([v for v, _ in pairs]),))} if pairs else {}
        return [_parent_info(vid, rel, *found.get(vid, (None, 0, 0))) for vid, rel in pairs]

    def model_heads(self) -> tuple[list[tuple[Any, ...]], dict[str, list[ParentInfo]]]:
        """What `ls` lists, in two queries: (name, head, seq, logical_bytes, time, lossy, tags) of
        every model by name (JSON columns as stored; None past the head when it is not indexed),
        and the lineage parents of each model's head."""
        heads = self.db.execute("""SELECT m.name, m.head, v.seq, v.logical_bytes, v.time, v.lossy, v.tags
            FROM models m LEFT JOIN versions v ON v.id = m.head ORDER BY m.name""")
        parents: dict[str, list[ParentInfo]] = {}
        for name, *parent in self.db.execute("""SELECT m.name, e.parent, e.relation, p.model, p.seq, p.removed
            FROM models m JOIN edges e ON e.child = m.head LEFT JOIN versions p ON p.id = e.parent
            ORDER BY m.name, e.position"""):
            parents.setdefault(name, []).append(_parent_info(*parent))
        return list(heads), parents

    def put_sketch(self, vid: str, data: bytes, *, keep: bool = False) -> None:
        self.put_sketches({vid: data}, keep=keep)

    def put_sketches(self, sketches: Mapping[str, bytes], *, keep: bool = False) -> None:
        """Store sketches by version, in one transaction; `keep`: leave those already there."""
        with self.atomic() as tx:
            tx.executemany(f"INSERT OR {'IGNORE' if keep else 'REPLACE'} INTO sketches VALUES (?, ?)", sketches.items())

    def set_head(self, name: str, read_head: Callable[[], str | None]) -> None:
        """Mirror one model's ref after its writer moved it. `read_head` is called inside the
        write transaction (as in `set_heads`), so a newer head is never overwritten by an
        older one; a head not indexed yet is left to the next full sync."""
        with self.atomic() as tx:
            head = read_head()
            if head is None:
                return
            if tx.execute("SELECT 1 FROM versions WHERE id = ?", (head,)).fetchone():
                tx.execute("INSERT OR REPLACE INTO models VALUES (?, ?)", (name, head))

    def object_rows(self, oids: Iterable[str]) -> dict[str, ObjectRow]:
        """The rows of these objects that the catalog has (bases () when not recorded)."""
        rows = self.db.execute(
            f"SELECT id, kind, logical_size, stored_size, codec, bases FROM objects WHERE id IN {IDS}",
            (json.dumps(sorted(set(oids))),),
        )
        return {r[0]: ObjectRow(*r[:5], tuple(json.loads(r[5])) if r[5] else ()) for r in rows}

    def sizes_and_bases(self, oids: Iterable[str]) -> dict[str, tuple[int, tuple[str, ...]]]:
        """{id: (logical size, delta bases)} of the objects among `oids` it has a row for (what
        a lazy clone's store fetches, and how much of it: mgit.store.lazy.ObjectIndex)."""
        return {r.id: (r.logical_size, r.bases) for r in self.object_rows(oids).values()}

    def index_objects(self, store: ObjectStore, oids: Iterable[str]) -> None:
        """Rows for these objects from their headers in `store`, replacing any (a lazy clone's
        objects just fetched: the remote's pack described them, now they are here)."""
        self.add_objects([ObjectRow.read(store, oid) for oid in oids])

    def remove_objects(self, oids: Iterable[str]) -> None:
        """Forget objects gc deleted (and the sketches of versions among them)."""
        gone = [(o,) for o in oids]
        with self.atomic() as tx:
            tx.executemany("DELETE FROM objects WHERE id = ?", gone)
            tx.executemany("DELETE FROM sketches WHERE version = ?", gone)

    def strays(self, versions: Iterable[str], objects: Iterable[str]) -> tuple[dict[str, int], list[str]]:
        """Sketches of versions and rows of objects that are not among `versions` and
        `objects` (what the refs reach): ({version: its sketch's bytes}, those objects).
        A repository that an older mgit fetched into can hold sketches, from a remote's packs,
        of versions that do not exist; only gc removes them."""
        sketches = dict(
            self.db.execute(
                f"SELECT version, LENGTH(data) FROM sketches WHERE version NOT IN {IDS}",
                (json.dumps(sorted(set(versions))),),
            )
        )
        oids = [
            r[0]
            for r in self.db.execute(
                f"SELECT id FROM objects WHERE id NOT IN {IDS}", (json.dumps(sorted(set(objects))),)
            )
        ]
        return sketches, oids

    def remove_strays(self, versions: Iterable[str], objects: Iterable[str]) -> None:
        """Forget the sketches and object rows `strays` finds, and give their room back."""
        with self.atomic() as tx:
            tx.execute(f"DELETE FROM sketches WHERE version NOT IN {IDS}", (json.dumps(sorted(set(versions))),))
            tx.execute(f"DELETE FROM objects WHERE id NOT IN {IDS}", (json.dumps(sorted(set(objects))),))
        self.compact()

    def compact(self) -> None:
        """VACUUM when a quarter of the file (and at least 1 MiB) is free pages, so that what
        was deleted leaves the disk too; then empty the write-ahead log. On a full disk neither
        is needed to go on (a later checkpoint empties the log), and gc, which compacts before
        it deletes objects, must go on to free space."""
        free, pages, page = (
            self.db.execute(f"PRAGMA {p}").fetchone()[0] for p in ("freelist_count", "page_count", "page_size")
        )
        try:
            if free * page >= 1 << 20 and free * 4 >= pages:
                self.db.execute("VACUUM")
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.OperationalError as exc:
            if "full" not in str(exc):  # SQLITE_FULL: "database or disk is full"
                raise

    def sketch(self, vid: str) -> bytes | None:
        row = self.db.execute("SELECT data FROM sketches WHERE version = ?", (vid,)).fetchone()
        return None if row is None else bytes(row[0])

    # --- reading ------------------------------------------------------------------------
    def heads(self) -> dict[str, str]:
        return dict(self.db.execute("SELECT name, head FROM models ORDER BY name"))

    def links(self) -> dict[str, list[str]]:
        """{version: what it links to, its predecessor first, then its lineage parents} of every
        indexed version: a walk of many histories reads these rows, not thousands of records."""
        out = {v: [p] if p else [] for v, p in self.db.execute("SELECT id, predecessor FROM versions")}
        for child, parent in self.db.execute("SELECT child, parent FROM edges ORDER BY child, position"):
            out.setdefault(child, []).append(parent)
        return out

    def has_version(self, vid: str) -> bool:
        return self.db.execute("SELECT 1 FROM versions WHERE id = ?", (vid,)).fetchone() is not None

    def version(self, vid: str) -> VersionRow | None:
        rows = self._versions("WHERE v.id = ?", (vid,))
        return rows[0] if rows else None

    def children_of(self, vid: str) -> list[str]:
        """`model@seq` of the versions, not removed, that name `vid` as a lineage parent."""
        rows = self.db.execute(
            """SELECT DISTINCT v.model, v.seq FROM edges e JOIN versions v ON v.id = e.child
               WHERE e.parent = ? AND v.removed = 0 ORDER BY v.model, v.seq""",
            (vid,),
        )
        return [f"{m}@{s}" for m, s in rows]

    def removed_version(self, model: str, seq: int) -> str | None:
        """The id of `model@seq` if that version was removed and is still indexed (kept as a
        live version's lineage parent)."""
        row = self.db.execute(
            "SELECT id FROM versions WHERE model = ? AND seq = ? AND removed = 1", (model, seq)
        ).fetchone()
        return None if row is None else row[0]

    def versions_by_prefix(self, prefix: str) -> list[str]:
        return [
            r[0]
            for r in self.db.execute("SELECT id FROM versions WHERE id >= ? AND id < ? LIMIT 2", (prefix, prefix + "g"))
        ]

    def versions_of(self, vids: list[str]) -> dict[str, VersionRow]:
        return {r.id: r for r in self._versions(f"WHERE v.id IN {IDS}", (json.dumps(vids),))}

    def _versions(self, where: str, args: tuple[Any, ...]) -> list[VersionRow]:
        cur = self.db.execute(
            f"""SELECT {", ".join(f"v.{c} AS {c}" for c in VERSION_COLUMNS)},
                       (SELECT json_group_array(json_array(e.parent, e.relation))
                          FROM (SELECT * FROM edges e WHERE e.child = v.id ORDER BY e.position) e) AS parents
                FROM versions v {where}""",
            args,
        )
        return [VersionRow(**{**r, "parents": tuple(tuple(p) for p in r["parents"])}) for r in named_rows(cur)]

    def sketches(self) -> tuple[list[tuple[str, str, int, bytes]], list[str]]:
        """(version, model, seq, sketch) of every indexed version that has a sketch, and the
        ids of those that have none: the whole input of parent inference in two queries."""
        rows = list(
            self.db.execute(
                "SELECT v.id, v.model, v.seq, s.data FROM versions v "
                "JOIN sketches s ON s.version = v.id ORDER BY v.rowid"
            )
        )
        missing = [
            r[0]
            for r in self.db.execute(
                "SELECT id FROM versions WHERE id NOT IN (SELECT version FROM sketches) ORDER BY rowid"
            )
        ]
        return rows, missing

    def missing_objects(self, oids: set[str]) -> set[str]:
        """The ids among `oids` that the objects table does not list."""
        known = self.db.execute(f"SELECT id FROM objects WHERE id IN {IDS}", (json.dumps(sorted(oids)),))
        return oids - {r[0] for r in known}

    def object_users(self, oid: str) -> list[str]:
        """`model@seq` of every indexed version that uses an object (for error messages)."""
        rows = self.db.execute(
            """SELECT v.model, v.seq FROM version_objects vo JOIN versions v ON v.id = vo.version
               WHERE vo.object = ? ORDER BY v.model, v.seq LIMIT 20""",
            (oid,),
        )
        return [f"{m}@{s}" for m, s in rows]

    def graph_rows(self) -> tuple[list[list[Any]], list[tuple[str, int, str, str]]]:
        """Every indexed version (its GRAPH_COLUMNS, in order) and every lineage edge (child,
        position, parent, relation): the lineage graph in two queries, fast enough for thousands
        of versions."""
        versions = list(decoded_rows(self.db.execute(f"SELECT {', '.join(GRAPH_COLUMNS)} FROM versions")))
        edges = list(self.db.execute("SELECT child, position, parent, relation FROM edges ORDER BY child, position"))
        return versions, edges
