"""Hostile objects built with MGit's own object format and codecs, planted in a folder remote.

remote_with_model(dir)             a bare remote (`mgit init --bare`) with a real small model `m` pushed
zero_bomb(kind, meta, size)        an object whose logical content is `size` zero bytes, coded by zstd
                                   into almost nothing: its id is valid (the hash of those zeros)
plant(remote, oid, header, payload)   an object file written under `oid` (replacing any)
version_with(remote, model, files)    a new version of `model`: the head's manifest with some file
                                   entries replaced, its records written, the ref moved
peak_rss(cmd)                      a command run in a child, and that child's peak resident set (bytes)
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import blake3
import zstandard

from mgit import Repo
from mgit.store.local import LocalStore
from mgit.store.objectformat import ObjectHeader
from mgit.store.objects import FileEntry, Manifest, Version, canonical_json

MGIT = [sys.executable, "-m", "mgit.cli.main"]
CHUNK = 64 << 20


def run(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MGIT, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout)


def remote_with_model(root: Path, model: Path) -> Path:
    """A bare remote `root/team.mgit` with the model folder pushed to it as `m`."""
    remote = root / "team.mgit"
    assert run("init", "--bare", str(remote)).returncode == 0
    pusher = root / "pusher"
    assert run("init", str(pusher)).returncode == 0
    done = run("add", str(model), "--name", "m", cwd=pusher)
    assert done.returncode == 0, done.stderr
    assert run("remote", "add", "origin", str(remote), cwd=pusher).returncode == 0
    done = run("push", "origin", cwd=pusher)
    assert done.returncode == 0, done.stderr
    return remote


def zero_bomb(kind: str, meta: dict, size: int, *, level: int = 3) -> tuple[str, ObjectHeader, bytes]:
    """(id, header, payload) of an object of `size` zero bytes coded as one zstd frame that
    declares its size: a few hundred KB on the wire for gigabytes decoded. (Level 3, as the
    header says: zeros shrink as far as at 19, four times faster.)"""
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    hasher.update(kind.encode() + b"\n" + canonical_json(meta) + b"\n")
    zeros = memoryview(bytes(CHUNK))
    left = size
    while left:
        n = min(left, CHUNK)
        hasher.update(zeros[:n])
        left -= n
    header = ObjectHeader(kind, meta, size, [{"name": "zstd", "configuration": {"level": level}}])
    return hasher.hexdigest(), header, _zeros_frame(size, level)


@functools.cache
def _zeros_frame(size: int, level: int) -> bytes:
    """`size` zero bytes as one zstd frame (the same for every bomb of that size: made once)."""
    out = bytearray()

    class Sink:
        def write(self, data: bytes) -> int:
            out.extend(data)
            return len(data)

    zeros = memoryview(bytes(CHUNK))
    with zstandard.ZstdCompressor(level=level, write_content_size=True).stream_writer(
        Sink(), size=size, closefd=False
    ) as writer:
        left = size
        while left:
            n = min(left, CHUNK)
            writer.write(zeros[:n])
            left -= n
    return bytes(out)


def plant(remote: Path, oid: str, header: ObjectHeader, payload: bytes) -> None:
    """Write an object file into the remote under `oid`, replacing whatever is there."""
    store = LocalStore(remote / "objects", fsync=False)
    path = store.path_of(oid)
    if path.exists():
        path.chmod(0o644)
        path.unlink()
    store.write_record(oid, [header.to_bytes(), payload])


def version_with(remote: Path, model: str, files: dict[str, dict], *, base: str = "m") -> str:
    """A version of `model` (new) whose manifest is the head of `base`'s with the named files'
    entries changed (`{"README.md": {"object": ..., "size": 16}}`), written into the remote
    as a push would write it (records, then the ref). Returns its id."""
    repo = Repo(remote)
    head = repo.refs.get(base)
    assert head is not None
    version = repo.store.get_version(head)
    manifest = repo.store.get_manifest(version.manifest)
    entries = [replace(f, **files[f.path]) if f.path in files else f for f in manifest.files]
    mid = repo.store.put_record("manifest", Manifest(tuple(entries)).to_json()).oid
    record = Version(
        model=model,
        manifest=mid,
        message="crafted",
        author="attacker",
        time=version.time,
        summary=dict(version.summary),
    )
    vid = repo.store.put_record("version", record.to_json()).oid
    repo.refs.update(model, vid, expected=None)
    return vid


def file_entry(remote: Path, path: str, *, model: str = "m") -> FileEntry:
    repo = Repo(remote)
    version = repo.store.get_version(repo.refs.get(model) or "")
    return next(f for f in repo.store.get_manifest(version.manifest).files if f.path == path)


PROBE = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "sys.stdout.write(done.stdout); sys.stderr.write(done.stderr)\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, file=sys.stderr)\n"
    "sys.exit(done.returncode)\n"
)


def peak_rss(*args: str, cwd: Path | None = None, timeout: float = 300) -> tuple[int, str, int]:
    """Run `mgit ARGS` in a child of a fresh probe process: (exit code, its stderr less the
    last line, the child's peak resident set in bytes)."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *MGIT, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )
    *lines, peak = done.stderr.rstrip("\n").split("\n")
    return done.returncode, "\n".join(lines), int(peak)


def vm_hwm(pid: int) -> int:
    """A running process's peak resident set (bytes), from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def serve_peak(remote: Path, mirrors: Path, pages: list[str]) -> tuple[list[int], list[int]]:
    """`mgit serve file://REMOTE` on 127.0.0.1 (a lazy mirror under `mirrors`): the status of
    each page asked for in turn, and the server's peak resident set after each."""
    import re
    import urllib.error
    import urllib.request

    env = {**os.environ, "MGIT_MIRROR_CACHE": str(mirrors), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [*MGIT, "serve", f"file://{remote}", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()  # type: ignore[union-attr]
            if not line:
                break
            if m := re.search(r"at (http://127\.0\.0\.1:\d+/)", line):
                url = m[1]
        assert url, proc.stderr.read()  # type: ignore[union-attr]
        statuses, peaks = [], []
        for page in pages:
            try:
                with urllib.request.urlopen(url + page, timeout=120) as r:
                    r.read()
                    statuses.append(r.status)
            except urllib.error.HTTPError as exc:
                statuses.append(exc.code)
            peaks.append(vm_hwm(proc.pid))
        return statuses, peaks
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def manifest_json(remote: Path, model: str) -> dict:
    repo = Repo(remote)
    version = repo.store.get_version(repo.refs.get(model) or "")
    return json.loads(canonical_json(repo.store.get_manifest(version.manifest).to_json()))
