"""A folder remote with a real small model pushed to it, and the means to forge what such a
remote can hold: metadata packs written with MetadataPack (named by the blake3 of their
bytes), version records, refs. Shared by the tests of hostile remotes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import MGIT, make_model, run_cli

from mgit.remotes.pack import MetadataPack
from mgit.store.memory import MemoryStore
from mgit.store.objectformat import parse_record
from mgit.store.objects import Version

# A helper process that runs `mgit ARGS` as its child and prints the child's peak RSS (KiB).
_PEAK = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "sys.stdout.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) + '\\n')\n"
    "sys.stderr.write(done.stderr)\n"
    "sys.exit(done.returncode)\n"
)


def cli(*args: str) -> tuple[int, str, str]:
    return run_cli(*args)


def pushed_remote(tmp: Path) -> tuple[Path, Path]:
    """(remote folder, work folder of its author): `mgit init --bare`, a model `base` with
    two versions and a fine-tune `ft` added and pushed, all through the CLI."""
    remote, alice = tmp / "remote.mgit", tmp / "alice"
    for args in (("init", "--bare", str(remote)), ("init", str(alice))):
        assert cli(*args)[0] == 0
    run = lambda *a: cli("-C", str(alice), *a)  # noqa: E731
    assert run("add", str(make_model(tmp / "m1", seed=1)), "--name", "base", "-m", "one")[0] == 0
    assert run("add", str(make_model(tmp / "m2", seed=2)), "--name", "base", "-m", "two")[0] == 0
    assert run("add", str(make_model(tmp / "m3", seed=3)), "--name", "ft", "--parent", "base")[0] == 0
    assert run("remote", "add", "origin", str(remote))[0] == 0
    code, out, err = run("push")
    assert code == 0, err
    return remote, alice


def write_pack(remote: Path, pack: MetadataPack) -> str:
    pid, data = pack.to_bytes()
    (remote / "packs" / f"{pid}.mgpack").write_bytes(data)
    return pid


def write_object(remote: Path, store: MemoryStore, oid: str) -> None:
    path = remote / "objects" / oid[:2] / oid[2:]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(store.read_record(oid))


def forge_version(remote: Path, version: Version) -> str:
    """A version record written on the remote as an object file; its id."""
    store = MemoryStore()
    vid = store.put_record("version", version.to_json()).oid
    write_object(remote, store, vid)
    return vid


def set_ref(remote: Path, name: str, vid: str) -> None:
    path = remote / "refs" / "models" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(vid + "\n")


def head_of(remote: Path, name: str) -> str:
    return (remote / "refs" / "models" / name).read_text().strip()


def clone_peak(url: str, target: Path, *extra: str) -> tuple[int, int, str]:
    """`mgit clone URL TARGET` in a child process: (exit code, the child's peak RSS in
    KiB, its stderr)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, *MGIT, "clone", *extra, url, str(target)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    return done.returncode, int(done.stdout.strip().splitlines()[-1]), done.stderr


def holdings(root: Path) -> dict[str, Any]:
    """What a repository holds (objects, refs, remote-tracking refs, packs read, catalog
    heads), to show that a refused fetch kept nothing; {} when there is no repository."""
    dot = root / ".mgit"
    if not dot.is_dir():
        return {}
    files = sorted(
        p.relative_to(dot).as_posix()
        for sub in ("objects", "refs", "remotes")
        for p in (dot / sub).rglob("*")
        if p.is_file()
    )
    code, out, _ = cli("-C", str(root), "ls", "--json")
    return {"files": files, "ls": json.loads(out) if code == 0 else None}


def packed_remote(tmp: Path, seed: int = 0) -> tuple[Path, Path]:
    """As `pushed_remote`, to a folder remote laid out with `--packs`: every object of these
    small models travels in one data pack with its index. `seed` makes a pack of other bytes
    (a pack is named by its bytes, and a process may hold a verified copy of one it read)."""
    remote, alice = tmp / "remote.mgit", tmp / "alice"
    for args in (("init", "--bare", "--packs", str(remote)), ("init", str(alice))):
        assert cli(*args)[0] == 0
    run = lambda *a: cli("-C", str(alice), *a)  # noqa: E731
    assert run("add", str(make_model(tmp / "m1", seed=1 + seed)), "--name", "base", "-m", "one")[0] == 0
    assert run("add", str(make_model(tmp / "m2", seed=2 + seed)), "--name", "base", "-m", "two")[0] == 0
    assert run("add", str(make_model(tmp / "m3", seed=3 + seed)), "--name", "ft", "--parent", "base")[0] == 0
    assert run("remote", "add", "origin", str(remote))[0] == 0
    code, out, err = run("push")
    assert code == 0, err
    return remote, alice


def rewrite_index(remote: Path, how: str) -> None:
    """Make the remote's (single) data pack or its index lie, `how`: "shift" (every offset one
    byte on: each entry's bytes are another's), "overlap" (the second entry starts inside the
    first), "huge" (an entry far past the pack's end), "past-limit" (a pack and index that
    give an object more bytes than it may take, consistently), "other-pack" (the index names
    another pack), "not-json", or "pack-bytes" (the pack's bytes changed, its name kept)."""
    (idx,) = (remote / "packs").glob("*.objidx")
    pid = idx.name.removesuffix(".objidx")
    pack = remote / "packs" / f"{pid}.objpack"
    body = json.loads(idx.read_bytes())
    rows = body["objects"]
    if how == "shift":
        body["size"] += 1
        pack.chmod(0o644)
        pack.write_bytes(b"\0" + pack.read_bytes())
        rows[:] = [[o, off, n] for o, off, n in rows]  # offsets kept: each now one byte early
    elif how == "overlap":
        rows[1][1] = rows[0][1] + 1
    elif how == "huge":
        rows[-1][2] = 1 << 40
    elif how == "past-limit":
        # A tensor (at most its manifest's size) given 200 MB, the entries after it moved on:
        # the index is consistent, only that length lies.
        data = pack.read_bytes()
        tensor = next(
            i for i, (o, off, n) in enumerate(rows) if parse_record(o, data[off : off + n])[0].kind == "tensor"
        )
        rows[tensor][2] = 200 << 20
        ends = 0
        for row in rows:
            row[1] = max(row[1], ends)
            ends = row[1] + row[2]
        body["size"] = ends
    elif how == "other-pack":
        body["pack"] = "0" * 64
    elif how == "pack-bytes":
        pack.chmod(0o644)
        data = bytearray(pack.read_bytes())
        data[len(data) // 2] ^= 0xFF
        pack.write_bytes(bytes(data))
        return
    idx.chmod(0o644)
    idx.write_bytes(b"{not json" if how == "not-json" else json.dumps(body).encode())
