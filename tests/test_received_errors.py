"""What a fetch, clone, pull or lazy read refuses of what a remote sent is one line that
names the remote and says that nothing was kept: the local repository is unchanged, and
the hint says whom to tell (not "restore from a copy of the repository", which is for an
object of the repository's own)."""

from __future__ import annotations

import shutil
from pathlib import Path

from conftest import make_model
from hostile_remote import cli, holdings, pushed_remote

from mgit import Repo
from mgit.remotes.pack import MetadataPack

UNCHANGED = "nothing was kept, the local repository is unchanged"


def refused(result: tuple[int, str, str], remote: Path, *fragments: str) -> str:
    code, out, err = result
    assert code == 1 and out == "", (code, out, err)
    assert err.startswith("Error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for f in (*fragments, UNCHANGED, f"Tell the remote's owner; run: mgit fsck {remote}"):
        assert f in err, (f, err)
    assert "restore the object from a copy" not in err and "missing from the repository" not in err, err
    return err


def _object(remote: Path, oid: str) -> Path:
    path = remote / "objects" / oid[:2] / oid[2:]
    path.chmod(0o644)
    return path


def _flip(remote: Path, oid: str) -> None:
    path = _object(remote, oid)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def _new_version(tmp: Path, alice: Path) -> str:
    """A third version of base pushed by alice; the id of a tensor only it has."""
    before = {t.object for t in Repo(alice).manifest("base").tensors()}
    assert cli("-C", str(alice), "add", str(make_model(tmp / "m4", seed=4)), "--name", "base")[0] == 0
    assert cli("-C", str(alice), "push")[0] == 0
    return next(t.object for t in Repo(alice).manifest("base").tensors() if t.object not in before)


def test_clone_of_a_corrupt_object(tmp_path: Path) -> None:
    remote, alice = pushed_remote(tmp_path)
    victim = Repo(alice).manifest("ft").tensors()[0].object
    _flip(remote, victim)
    refused(
        cli("clone", str(remote), str(tmp_path / "bob")), remote, f"object {victim[:16]} from {remote} is corrupt ("
    )
    assert not (tmp_path / "bob").exists()


def test_clone_into_an_empty_folder_leaves_it_empty(tmp_path: Path) -> None:
    remote, alice = pushed_remote(tmp_path)
    victim = Repo(alice).manifest("ft").tensors()[0].object
    _object(remote, victim).unlink()
    (tmp_path / "bob").mkdir()
    refused(cli("clone", str(remote), str(tmp_path / "bob")), remote, f"object {victim[:16]} is missing from {remote}")
    assert list((tmp_path / "bob").iterdir()) == []


def test_fetch_and_pull_of_a_corrupt_or_missing_object(tmp_path: Path) -> None:
    remote, alice = pushed_remote(tmp_path)
    assert cli("clone", str(remote), str(tmp_path / "bob"))[0] == 0
    victim = _new_version(tmp_path, alice)
    before = holdings(tmp_path / "bob")
    _flip(remote, victim)
    for verb in ("fetch", "pull"):
        refused(cli("-C", str(tmp_path / "bob"), verb), remote, f"object {victim[:16]} from {remote} is corrupt (")
        assert holdings(tmp_path / "bob") == before
    _object(remote, victim).unlink()
    for verb in ("fetch", "pull"):
        refused(cli("-C", str(tmp_path / "bob"), verb), remote, f"object {victim[:16]} is missing from {remote}")
        assert holdings(tmp_path / "bob") == before


def test_lazy_checkout_of_a_corrupt_or_missing_object(tmp_path: Path) -> None:
    remote, alice = pushed_remote(tmp_path)
    assert cli("clone", "--lazy", str(remote), str(tmp_path / "bob"))[0] == 0
    victim = Repo(alice).manifest("ft").tensors()[0].object
    before = holdings(tmp_path / "bob")
    _flip(remote, victim)
    err = refused(
        cli("-C", str(tmp_path / "bob"), "checkout", "ft", "-o", str(tmp_path / "out")),
        remote,
        f"object {victim[:16]} from {remote} is corrupt (",
    )
    assert holdings(tmp_path / "bob") == before, err
    _object(remote, victim).unlink()
    shutil.rmtree(tmp_path / "out", ignore_errors=True)
    refused(
        cli("-C", str(tmp_path / "bob"), "checkout", "ft", "-o", str(tmp_path / "out")),
        remote,
        f"object {victim[:16]} is missing from {remote}",
    )
    assert holdings(tmp_path / "bob") == before


def test_a_forged_manifest_a_damaged_pack_and_an_oversized_record(tmp_path: Path) -> None:
    remote, alice = pushed_remote(tmp_path)
    assert cli("init", str(tmp_path / "bob"))[0] == 0
    assert cli("-C", str(tmp_path / "bob"), "remote", "add", "origin", str(remote))[0] == 0
    before = holdings(tmp_path / "bob")
    [pack] = list((remote / "packs").iterdir())
    data = bytearray(pack.read_bytes())
    data[-1] ^= 1
    pack.write_bytes(bytes(data))
    refused(
        cli("-C", str(tmp_path / "bob"), "fetch"),
        remote,
        f"metadata pack {pack.name[:16]} from {remote}",
        "does not hash to its name",
    )
    assert holdings(tmp_path / "bob") == before
    pack.unlink()  # records are read one by one
    vid = Repo(alice).resolve("ft")
    with open(_object(remote, vid), "r+b") as fh:
        fh.truncate(2 << 30)  # sparse: 2 GiB on paper
    refused(
        cli("-C", str(tmp_path / "bob"), "fetch"),
        remote,
        f"objects/{vid[:2]}/{vid[2:]} on {remote}",
        "2147483648 bytes",
    )
    assert holdings(tmp_path / "bob") == before
    # A pack with a record whose bytes are not its id's.
    base = Repo(alice).resolve("base")
    raw = bytearray((Path(alice) / ".mgit" / "objects" / base[:2] / base[2:]).read_bytes())
    raw[-1] ^= 1
    pid, data = MetadataPack(records={base: bytes(raw)}).to_bytes()
    (remote / "packs" / f"{pid}.mgpack").write_bytes(data)
    refused(
        cli("-C", str(tmp_path / "bob"), "fetch", "--models", "base"),
        remote,
        f"object {base[:16]} from {remote} is corrupt (",
    )
    assert holdings(tmp_path / "bob") == before


def test_a_damaged_ref_and_a_remote_show_of_a_corrupt_record(tmp_path: Path) -> None:
    remote, alice = pushed_remote(tmp_path)
    assert cli("clone", str(remote), str(tmp_path / "bob"))[0] == 0
    before = holdings(tmp_path / "bob")
    ref = remote / "refs" / "models" / "ft"
    good = ref.read_text()
    ref.write_text("not a version id\n")
    refused(cli("-C", str(tmp_path / "bob"), "fetch"), remote, f"the head of 'ft' on {remote} is damaged")
    assert holdings(tmp_path / "bob") == before
    ref.write_text(good)
    _new_version(tmp_path, alice)
    vid = Repo(alice).resolve("base")
    shutil.rmtree(remote / "packs")
    _flip(remote, vid)
    refused(
        cli("-C", str(tmp_path / "bob"), "remote", "show", "origin"),
        remote,
        f"object {vid[:16]} from {remote} is corrupt (",
    )
    assert holdings(tmp_path / "bob") == before
