"""A remote's heads index, `refs/heads.json`: every model's head in one object, so that
reading a thousand heads costs one listing page and one GET, not a GET per model.

The refs under `refs/models/` stay the truth (a push moves each by compare-and-swap); the
index is a hint, written after a push's refs moved, by compare-and-swap on its own token:

    {"format": 1, "heads": {"<model>": ["<version id>", "<the ref's token>"]}}

A reader lists `refs/models/` with each ref's token (an S3 ETag, a GCS generation, an Azure
ETag) and, where the listing carries it, the MD5 of the ref's bytes (S3's ETag of a plain
PUT, GCS's md5Hash; a folder's refs are read). An entry is taken only when its token is the
ref's token now and, where the MD5 is known, `<version id>\\n` has that MD5: an index made
stale by a killed push or an older mgit (which never writes one), or one that lies, costs a
GET of each ref it gets wrong, never a wrong head. A ref the index lacks is read. A damaged
index is read as none (it is a hint) and replaced by the next push that moves a ref.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping

from mgit.errors import InvalidNameError, RemoteConflictError, RemoteTooLargeError
from mgit.index.refs import validate_model_name
from mgit.remotes.base import Backend
from mgit.store.objects import OID_RE

HEADS_KEY = "refs/heads.json"
HEADS_FORMAT = 1
MAX_HEADS = 64 << 20  # 64 MiB: some 400,000 models
ATTEMPTS = 4  # writers racing on the index: each tries again on the other's, then leaves it stale

Heads = dict[str, tuple[str, str]]  # {model: (version id, the ref's token)}


def parse(data: bytes | None) -> Heads:
    """The entries of an index, or none at all when it is absent or not one this mgit
    reads (a hint: a reader then reads the refs themselves)."""
    if data is None:
        return {}
    try:
        doc = json.loads(data)
        if doc.get("format") != HEADS_FORMAT or not isinstance(doc.get("heads"), dict):
            return {}
        out: Heads = {}
        for name, entry in doc["heads"].items():
            vid, token = entry
            if not (isinstance(vid, str) and OID_RE.match(vid) and isinstance(token, str) and token):
                return {}
            out[validate_model_name(name)] = (vid, token)
        return out
    except (ValueError, TypeError, AttributeError, InvalidNameError):
        return {}


def to_bytes(heads: Mapping[str, tuple[str, str]]) -> bytes:
    doc = {"format": HEADS_FORMAT, "heads": {n: list(heads[n]) for n in sorted(heads)}}
    return json.dumps(doc, separators=(",", ":")).encode()


def matches(vid: str, token: str, listed: tuple[str, str | None]) -> bool:
    """Whether an entry (vid, token) is what a ref listed with (token, MD5) holds."""
    now, md5 = listed
    return token == now and (md5 is None or hashlib.md5(f"{vid}\n".encode(), usedforsecurity=False).hexdigest() == md5)


def read_index(backend: Backend) -> tuple[Heads, str | None]:
    """The index's entries and its token (({}, None) when there is none, or one past
    MAX_HEADS: a hint that large is not read, and not replaced either)."""
    try:
        data, token = backend.read_versioned(HEADS_KEY, limit=MAX_HEADS)
    except RemoteTooLargeError:
        return {}, None
    return parse(data), token


def resolve(
    listed: Mapping[str, tuple[str, str | None]],
    index: Heads,
    names: Iterable[str],
    read: Callable[[list[str]], list[tuple[str | None, str | None]]],
) -> Heads:
    """{model: (head, token)} of `names` among the `listed` refs ({model: (token, MD5)}):
    from the index where its entry holds, else read (`read(names)`: each ref's (head,
    token), (None, None) for one absent or a tombstone)."""
    chosen = [n for n in dict.fromkeys(names) if n in listed]
    out = {n: index[n] for n in chosen if n in index and matches(*index[n], listed[n])}
    unread = [n for n in chosen if n not in out]
    for name, (vid, token) in zip(unread, read(unread), strict=True):
        if vid is not None and token is not None:
            out[name] = (vid, token)
    return out


def refresh(
    backend: Backend,
    list_refs: Callable[[], dict[str, tuple[str, str | None]]],
    known: Mapping[str, tuple[str, str | None]],
) -> bool:
    """Rewrite the index after refs moved: each listed ref's entry from `known` (heads read
    or written by this process, with their tokens) or the index, where it holds; refs that
    neither gives right are left out (readers read them). Compare-and-swap on the index's
    token; a writer that lost the race tries again on the winner's index, ATTEMPTS times in
    all, then leaves it (a stale index costs readers GETs, never a wrong head). Whether it
    was written (or already right)."""
    for _ in range(ATTEMPTS):
        listed = list_refs()
        index, token = read_index(backend)
        entries: Heads = {}
        for name, now in listed.items():
            mine = known.get(name)
            if mine is not None and mine[1] is not None and matches(mine[0], mine[1], now):
                entries[name] = (mine[0], mine[1])
            elif name in index and matches(*index[name], now):
                entries[name] = index[name]
        if entries == index and token is not None:
            return True
        try:
            backend.write_if(HEADS_KEY, to_bytes(entries), token=token)
            return True
        except RemoteConflictError:
            continue
    return False
