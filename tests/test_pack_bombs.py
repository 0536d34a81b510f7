"""Hostile metadata packs: small packs that decompress to a gigabyte, packs full of records,
sketches and object rows of versions that do not exist. A fetch bounds what a pack may
decode to, streams it without holding what it does not need, and keeps the sketches and
rows of the versions it fetched only; fsck reports catalog rows of unknown versions and gc
removes them (the catalog file shrinks)."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from hostile_remote import cli, clone_peak, holdings, pushed_remote, write_pack

from mgit import Repo, sync
from mgit.index.catalog import Catalog, ObjectRow
from mgit.remotes import pack as packs
from mgit.remotes.pack import MetadataPack

MiB = 1 << 20


def _mostly_zeros(size: int) -> bytes:
    """`size` bytes, 64 KiB of each MiB random: in a pack, about 20 times smaller on the wire."""
    out = bytearray(size)
    for at in range(0, size, MiB):
        out[at : at + 65536] = os.urandom(65536)
    return bytes(out)


def _fake(i: int) -> str:
    return f"{i:064x}"


def one_line_error(err: str, *fragments: str) -> None:
    assert err.startswith("Error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for f in fragments:
        assert f in err, (f, err)


def test_bomb_packs_are_refused_and_the_clone_stays_near_a_normal_clones_memory(tmp_path: Path) -> None:
    remote, _ = pushed_remote(tmp_path)
    code, normal, err = clone_peak(str(remote), tmp_path / "normal")
    assert code == 0, err
    for i in range(3):  # a few KiB each on the wire, 96 MiB of records decoded
        write_pack(remote, MetadataPack(records={_fake(i): bytes(96 * MiB)}))
    assert all(p.stat().st_size < 32 * 1024 for p in (remote / "packs").iterdir())
    code, peak, err = clone_peak(str(remote), tmp_path / "bomb")
    assert code == 1
    one_line_error(err, f"from {remote}", "decodes to", "nothing was kept, the local repository is unchanged")
    assert (peak - normal) * 1024 < 300 * MiB, (peak, normal)
    assert not (tmp_path / "bomb").exists()  # the clone made it: nothing of it is left


def test_packs_full_of_records_of_no_version_stream_without_being_held(tmp_path: Path) -> None:
    """Within the ratio, 144 MiB of records that no fetched version needs: read as they
    decompress, and never in memory all at once."""
    remote, alice = pushed_remote(tmp_path)
    code, normal, err = clone_peak(str(remote), tmp_path / "normal")
    assert code == 0, err
    for p in range(3):
        write_pack(remote, MetadataPack(records={_fake(p * 100 + i): _mostly_zeros(MiB) for i in range(48)}))
    wire = sum(p.stat().st_size for p in (remote / "packs").iterdir())
    assert wire < 20 * MiB  # so that the packs keep within the ratio
    code, peak, err = clone_peak(str(remote), tmp_path / "bob")
    assert code == 0, err
    assert (peak - normal) * 1024 < 100 * MiB, (peak, normal)
    bob = Repo(tmp_path / "bob")
    assert bob.refs.all() == Repo(alice).refs.all() and bob.fsck().ok
    assert not any(bob.store.has(_fake(p * 100 + i)) for p in range(3) for i in range(48))


@pytest.mark.parametrize("lazy", [False, True])
def test_sketches_and_rows_of_versions_never_fetched_are_not_kept(tmp_path: Path, lazy: bool) -> None:
    remote, alice = pushed_remote(tmp_path)
    ghost = _fake(7)
    rows = [(_fake(1000 + i), "tensor", 1 << 30, 1 << 30, "zstd", ()) for i in range(5000)]
    write_pack(remote, MetadataPack(objects=rows, sketches={ghost: os.urandom(4 * MiB)}))
    args = ("clone", "--lazy") if lazy else ("clone",)
    code, _, err = cli(*args, str(remote), str(tmp_path / "bob"))
    assert code == 0, err
    bob = Repo(tmp_path / "bob")
    assert bob.catalog.sketch(ghost) is None
    assert bob.catalog.object_rows(r[0] for r in rows) == {}
    assert (tmp_path / "bob" / ".mgit" / "catalog.sqlite").stat().st_size < 2 * MiB
    assert bob.refs.all() == Repo(alice).refs.all()
    # The sketches of the versions fetched arrived with them.
    assert all(bob.catalog.sketch(v) is not None for v in bob.refs.all().values())


def test_fsck_reports_and_gc_removes_catalog_rows_of_unknown_versions(tmp_path: Path) -> None:
    """A catalog as a fetch of an older mgit left it: a 64 MiB sketch of a version that does
    not exist and rows of objects no version uses."""
    remote, _ = pushed_remote(tmp_path)
    assert cli("clone", str(remote), str(tmp_path / "bob"))[0] == 0
    path = tmp_path / "bob" / ".mgit" / "catalog.sqlite"
    catalog = Catalog(path)
    catalog.put_sketch(_fake(7), os.urandom(64 * MiB))
    catalog.add_objects([ObjectRow(_fake(8), "tensor", 1 << 40, 1 << 40, "zstd")])
    catalog.close()
    bloated = path.stat().st_size + Path(f"{path}-wal").stat().st_size
    assert bloated > 64 * MiB
    code, out, err = cli("-C", str(tmp_path / "bob"), "fsck", "--json")
    report = json.loads(out)
    assert code == 1 and not report["ok"], (out, err)
    [problem] = report["problems"]
    assert problem["kind"] == "catalog" and "1 sketch" in problem["message"] and "1 object" in problem["message"]
    code, out, err = cli("-C", str(tmp_path / "bob"), "gc")
    assert code == 0, err
    db = sqlite3.connect(path)
    assert db.execute("SELECT COUNT(*) FROM sketches WHERE version = ?", (_fake(7),)).fetchone() == (0,)
    assert db.execute("SELECT COUNT(*) FROM objects WHERE id = ?", (_fake(8),)).fetchone() == (0,)
    db.close()
    wal = Path(f"{path}-wal")
    assert path.stat().st_size + (wal.stat().st_size if wal.exists() else 0) < 4 * MiB
    code, out, _ = cli("-C", str(tmp_path / "bob"), "fsck", "--json")
    assert code == 0 and json.loads(out)["ok"]


def test_packs_past_the_total_of_one_fetch_are_left_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fetch decodes at most MAX_FETCH_PACKS bytes of packs; the records of the packs it
    leaves are read one by one, as from a remote without packs."""
    remote, alice = pushed_remote(tmp_path)
    write_pack(remote, MetadataPack(records={_fake(1): os.urandom(MiB)}))
    monkeypatch.setattr(packs, "MAX_FETCH_PACKS", 256 * 1024)
    sync.clone(str(remote), tmp_path / "bob")
    bob = Repo(tmp_path / "bob")
    assert bob.refs.all() == Repo(alice).refs.all() and bob.fsck().ok
    read = json.loads((bob.dir / "remotes" / "origin" / "packs.json").read_text())
    assert len(read) == 1 and holdings(tmp_path / "bob")["ls"]


def _pack_file(tmp: Path, body: bytes, *, content_size: bool = True) -> tuple[str, Path]:
    import blake3
    import zstandard

    data = zstandard.ZstdCompressor(write_content_size=content_size).compress(body)
    pid = blake3.blake3(data).hexdigest()
    path = tmp / f"{pid}.mgpack"
    path.write_bytes(data)
    return pid, path


def _entries(pid: str, path: Path) -> list[tuple[str, str, object]]:
    return list(packs.read_entries(pid, path, where="/r", budget=packs.MAX_FETCH_PACKS))


@pytest.mark.parametrize("chunk", [1, 7, 1 << 20])
def test_a_pack_streams_back_to_what_was_written_whatever_its_layout(
    tmp_path: Path, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(packs, "_CHUNK", chunk)
    pack = MetadataPack(
        records={_fake(1): os.urandom(3000), _fake(2): b""},
        objects=[(_fake(3), "tensor", 10, 7, 'zstd\u00e9\\"', (_fake(1),)), (_fake(4), "blob", 0, 0, "raw", ())],
        sketches={_fake(5): b"\x00\x01"},
    )
    pid, data = pack.to_bytes()
    (tmp_path / f"{pid}.mgpack").write_bytes(data)
    got = _entries(pid, tmp_path / f"{pid}.mgpack")
    assert sorted((k, o, v) for k, o, v in got) == sorted(
        [("record", k, v) for k, v in pack.records.items()]
        + [("object", r[0], r) for r in pack.objects]
        + [("sketch", k, v) for k, v in pack.sketches.items()]
    )
    # Another writer's layout: white space, another key order.
    import base64

    body = {"sketches": {}, "records": {_fake(1): base64.b64encode(b"abc").decode()}, "objects": [], "format": 1}
    pid, path = _pack_file(tmp_path, json.dumps(body, indent=3).encode())
    assert _entries(pid, path) == [("record", _fake(1), b"abc")]


@pytest.mark.parametrize(
    "body, why",
    [
        (b'{"format": 1, "objects": [], "records": {}}', "no sketches"),
        (b'{"format": 1, "objects": [], "records": {}, "sketches": {}} x', "trailing bytes"),
        (b'{"format": 1, "format": 1, "objects": [], "records": {}, "sketches": {}}', "unexpected key"),
        (b'{"format": 2, "objects": [], "records": {}, "sketches": {}}', "not a pack of format 1"),
        (b'{"format": 1, "objects": [[1]], "records": {}, "sketches": {}}', "bad object row"),
        (b'{"format": 1, "objects": [], "records": {"ab": "AA=="}, "sketches": {}}', "bad record id"),
        (b'{"format": 1, "objects": [], "records": {}, "sketches": {"' + b"0" * 64 + b'": "A"}}', "Invalid base64"),
        (b'{"format": 1, "objects": [], "records": {"' + b"0" * 64 + b'": "AAAA', "ends inside a string"),
    ],
)
def test_a_damaged_pack_is_refused_naming_it(tmp_path: Path, body: bytes, why: str) -> None:
    from mgit.errors import ReceivedError

    pid, path = _pack_file(tmp_path, body)
    with pytest.raises(ReceivedError, match=why) as caught:
        _entries(pid, path)
    assert f"metadata pack {pid[:16]} from /r is damaged" in str(caught.value)


def test_a_pack_that_hides_its_size_or_lies_about_it_is_refused(tmp_path: Path) -> None:
    import zstandard

    from mgit.errors import ReceivedError

    body = json.dumps({"format": 1, "objects": [], "records": {}, "sketches": {}}).encode()
    pid, path = _pack_file(tmp_path, body, content_size=False)
    with pytest.raises(ReceivedError, match="does not declare its decoded size"):
        _entries(pid, path)
    with pytest.raises(ReceivedError, match="does not hash to its name"):
        packs.read_entries(_fake(9), path, where="/r", budget=1 << 30).__next__()
    # A frame that says it holds less than it does: decoding stops at what it declared.
    frame = bytearray(zstandard.ZstdCompressor(write_content_size=True).compress(body + b" " * 100))
    short = zstandard.ZstdCompressor(write_content_size=True).compress(body)
    import blake3

    lie = bytes(short[:6]) + bytes(frame[6:])  # the short frame's header, the long frame's blocks
    pid = blake3.blake3(lie).hexdigest()
    (tmp_path / f"{pid}.mgpack").write_bytes(lie)
    with pytest.raises(ReceivedError, match="metadata pack"):
        _entries(pid, tmp_path / f"{pid}.mgpack")
