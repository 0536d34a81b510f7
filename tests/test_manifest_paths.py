"""Manifest paths a checkout cannot write: refused wherever a manifest is read (a fetch, a lazy
clone, a repository's own store) and when `add` builds one, before anything is written.

The attacks: a manifest listing both `a` and `a/b` (checkout wrote `a`, then failed with "File
exists", leaving half a model), a file name longer than a file system allows (a partial
checkout again), a path longer than PATH_MAX, and control characters (terminal escapes) in a
path.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import blake3
import pytest
from conftest import make_model, one_line_error, run_cli

from mgit import Repo, sync
from mgit.errors import MgitError
from mgit.store.objects import FileEntry, Manifest, RecordError, Version

LONG_PATH = "/".join(["d" * 200] * 6)  # 1,205 bytes, every part allowed

BAD = [
    pytest.param({"a": b"file", "a/b": b"inside it"}, "'a/b' is inside 'a'", id="file-and-folder"),
    pytest.param({"x/a": b"file", "x/a/b/c": b"deep"}, "'x/a/b/c' is inside 'x/a'", id="file-and-deep-folder"),
    pytest.param({"ok.txt": b"first", "n" * 300: b"long"}, "longer than 255 bytes", id="300-character-name"),
    pytest.param({"ok.txt": b"first", "\u00e9" * 128: b"long"}, "longer than 255 bytes", id="256-bytes-in-utf8"),
    pytest.param({"ok.txt": b"first", LONG_PATH: b"deep"}, "longer than 1024 bytes", id="path-over-1024"),
    pytest.param({"ok.txt": b"first", "a\x1b[31m.txt": b"red"}, "control character", id="escape"),
    pytest.param({"a\nb.txt": b"x"}, "control character", id="newline"),
    pytest.param({"a\x7f.txt": b"x"}, "control character", id="del"),
    pytest.param({"a\x9b31m.txt": b"x"}, "control character", id="c1-csi"),
]


def forge(repo: Repo, name: str, files: dict[str, bytes]) -> str:
    """Store blobs and a manifest naming `files` verbatim (true digests), and a version of
    `name` over it, in `repo`'s store; point `name` at it. Returns the manifest's id."""
    entries = []
    for path, data in files.items():
        oid = repo.store.put_blob(data).oid
        entries.append(FileEntry(path, "blob", len(data), blake3.blake3(data).hexdigest(), oid))
    manifest = repo.store.put_record("manifest", Manifest(tuple(entries)).to_json()).oid
    version = Version(
        model=name,
        manifest=manifest,
        author="forger",
        time="2024-01-01T00:00:00.000000Z",
        summary={"files": len(entries)},
    )
    vid = repo.store.put_record("version", version.to_json()).oid
    repo.refs.update(name, vid, expected=None)
    return manifest


def forged_remote(tmp_path: Path, files: dict[str, bytes]) -> tuple[str, str]:
    """A folder remote holding a good model `good` and a forged one `evil` (its object files
    copied in byte for byte, its ref written), as a hostile teammate could leave it."""
    remote = tmp_path / "remote"
    sync.init_bare(str(remote))
    author = Repo.init(tmp_path / "author")
    sync.add_remote(author, "origin", str(remote))
    author.add(make_model(tmp_path / "good", seed=1), name="good")
    sync.push(author)
    scratch = Repo.init(tmp_path / "scratch")
    manifest = forge(scratch, "evil", files)
    for f in (scratch.dir / "objects").rglob("*"):
        if f.is_file() and not f.name.startswith("."):
            dest = remote / "objects" / f.relative_to(scratch.dir / "objects")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, dest)
    (remote / "refs" / "models" / "evil").write_text(scratch.refs.get("evil") + "\n")
    return str(remote), manifest


def stored(repo_dir: Path) -> dict[str, list[str]]:
    root = repo_dir / ".mgit"
    return {
        sub: sorted(p.relative_to(root).as_posix() for p in (root / sub).rglob("*") if p.is_file())
        for sub in ("objects", "refs/models")
    }


@pytest.mark.parametrize(("files", "why"), BAD)
def test_a_clone_refuses_the_manifest_and_keeps_nothing(tmp_path: Path, files: dict[str, bytes], why: str) -> None:
    url, manifest = forged_remote(tmp_path, files)
    target = tmp_path / "bob"

    one_line_error(run_cli("clone", url, str(target)), manifest[:16], "not a valid manifest", why)

    assert stored(target) == {"objects": [], "refs/models": []}
    assert not target.exists()  # a refused clone removes what it made
    code, _, err = run_cli("-C", str(target), "checkout", "evil", "-o", str(tmp_path / "out"))
    assert code == 2 and "cannot change to" in err and not (tmp_path / "out").exists(), err


@pytest.mark.parametrize(("files", "why"), BAD[:3])
def test_a_lazy_clone_and_a_fetch_into_it_refuse_the_manifest(
    tmp_path: Path, files: dict[str, bytes], why: str
) -> None:
    url, manifest = forged_remote(tmp_path, files)
    one_line_error(run_cli("clone", "--lazy", url, str(tmp_path / "lazy")), manifest[:16], why)
    assert stored(tmp_path / "lazy")["refs/models"] == []

    # A lazy clone of the good model alone, then a fetch of everything: the forged one is refused.
    lazy = tmp_path / "lazy2"
    assert run_cli("clone", "--lazy", "--models", "good", url, str(lazy))[0] == 0
    before = stored(lazy)
    one_line_error(run_cli("-C", str(lazy), "fetch"), manifest[:16], why)
    assert stored(lazy) == before
    code, _, _ = run_cli("-C", str(lazy), "checkout", "evil", "-o", str(tmp_path / "out"))
    assert code == 1 and not (tmp_path / "out").exists()
    assert run_cli("-C", str(lazy), "checkout", "good", "-o", str(tmp_path / "good-out"))[0] == 0


@pytest.mark.parametrize(("files", "why"), BAD)
def test_checkout_of_a_forged_local_manifest_writes_nothing(
    repo: Repo, tmp_path: Path, files: dict[str, bytes], why: str
) -> None:
    forge(repo, "evil", files)
    out = tmp_path / "out"

    with pytest.raises(MgitError, match="not a valid manifest") as info:
        repo.checkout("evil", out)

    assert why in str(info.value)
    assert not out.exists()


@pytest.mark.parametrize(("files", "why"), BAD)
def test_manifest_from_json_refuses_it(files: dict[str, bytes], why: str) -> None:
    record = Manifest(tuple(FileEntry(p, "blob", len(d), "0" * 64, "1" * 64) for p, d in files.items())).to_json()
    with pytest.raises(RecordError) as info:
        Manifest.from_json(json.loads(json.dumps(record)))
    assert why in str(info.value)


def test_paths_at_the_bounds_are_accepted(repo: Repo, tmp_path: Path) -> None:
    files = {
        "n" * 255: b"a",
        "\u00e9" * 127: b"b",
        "/".join(["d" * 200] * 5) + "/" + "e" * 19: b"c",
        "a/b": b"d",
        "a.b": b"e",
        "ab": b"f",
        "caf\u00e9 \u2603.txt": b"g",
    }
    forge(repo, "edge", files)
    out = tmp_path / "out"
    repo.checkout("edge", out)
    assert {p: (out / p).read_bytes() for p in files} == files


def test_add_refuses_a_file_name_with_a_terminal_escape(repo: Repo, tmp_path: Path) -> None:
    folder = make_model(tmp_path / "m", seed=3)
    (folder / "tokenizer" / "evil\x1b[2J.txt").write_text("x")
    before = run_cli("-C", str(repo.root), "ls", "--json")

    err = one_line_error(
        run_cli("-C", str(repo.root), "add", str(folder), "--name", "m"),
        "'tokenizer/evil\\x1b[2J.txt'",
        "control character",
    )

    assert "\x1b" not in err
    assert run_cli("-C", str(repo.root), "ls", "--json") == before
    assert stored(repo.root)["objects"] == []


def test_a_converted_from_name_with_an_escape_is_refused() -> None:
    entry = FileEntry("model.safetensors", "blob", 1, "0" * 64, "1" * 64, converted_from="ckpt\x1b[31m.bin").to_json()
    with pytest.raises(RecordError, match="converted_from 'ckpt\\\\x1b\\[31m.bin': it has a control character"):
        Manifest.from_json({"format": 1, "files": [entry]})


def test_add_refuses_a_folder_it_cannot_list_instead_of_skipping_it(
    repo: Repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As root every folder can be listed: the refusal a user without the permission meets
    # (EACCES from scandir) is played by os.scandir for that one folder.
    folder = make_model(tmp_path / "m", seed=4)
    (folder / "private").mkdir()
    (folder / "private" / "weights.bin").write_bytes(b"part of the model")
    real = os.scandir

    def scandir(path: object = ".") -> object:
        if Path(str(path)).name == "private":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "scandir", scandir)
    before = stored(repo.root)

    one_line_error(
        run_cli("-C", str(repo.root), "add", str(folder), "--name", "m"),
        "private: cannot read folder (Permission denied)",
    )

    assert stored(repo.root) == before
