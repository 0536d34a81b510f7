"""Signatures travel with push, fetch, pull and clone (lazy too), and verify.require (or
remote.NAME.verify) makes fetch, pull and clone refuse what is unsigned or untrusted, keeping
nothing. A remote that lies is refused in one line: a good signature served for a forged
record, a signature that is huge, truncated or malformed, signatures dropped (a downgrade)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import make_model, one_line_error, run_cli
from hostile_remote import forge_version, head_of, set_ref
from signers import KEYGEN, allowed_file, configure, keygen

from mgit.store.objects import Version

pytestmark = pytest.mark.skipif(not Path(KEYGEN).exists(), reason="openssh-client's ssh-keygen is not installed")


@pytest.fixture(autouse=True, params=["after the records", "in a worker"])
def checked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test twice: a clone checks the signatures it receives once its records are in,
    or (from ELSEWHERE_FROM of them, here one) in a worker process meanwhile."""
    import mgit.sync.signatures as sync_signatures

    if request.param == "in a worker":
        monkeypatch.setattr(sync_signatures, "ELSEWHERE_FROM", 1)
    return request.param


@pytest.fixture
def shared(tmp_path: Path) -> dict[str, Path]:
    """alice signs every version she adds (base@1, base@2, ft@1) and pushes them to a folder
    remote; the allowed-signers file names her."""
    remote, alice, keys = tmp_path / "remote.mgit", tmp_path / "alice", tmp_path / "keys"
    assert run_cli("init", "--bare", str(remote))[0] == 0
    assert run_cli("init", str(alice))[0] == 0
    key, mallory = keygen(keys, "alice"), keygen(keys, "mallory")
    allowed = allowed_file(keys / "allowed", ("alice@example.com", key))
    configure(alice, signing_key=key, signing_always="true", verify_allowed_signers=allowed)
    run = lambda *a: run_cli("-C", str(alice), *a)  # noqa: E731
    assert run("add", str(make_model(tmp_path / "m1", seed=1)), "--name", "base")[0] == 0
    assert run("add", str(make_model(tmp_path / "m2", seed=2)), "--name", "base")[0] == 0
    assert run("add", str(make_model(tmp_path / "m3", seed=3)), "--name", "ft", "--parent", "base")[0] == 0
    assert run("remote", "add", "origin", str(remote))[0] == 0
    code, _, err = run("push")
    assert code == 0, err
    return {"remote": remote, "alice": alice, "key": key, "mallory": mallory, "allowed": allowed, "tmp": tmp_path}


def clone(shared: dict[str, Path], name: str, *extra: str) -> tuple[tuple[int, str, str], Path]:
    target = shared["tmp"] / name
    args = ("clone", str(shared["remote"]), str(target), "--verify", "trusted", "--allowed-signers")
    return run_cli(*args, str(shared["allowed"]), *extra), target


def remote_sigs(remote: Path, vid: str) -> list[Path]:
    return sorted((remote / "signatures" / vid).glob("*.sig"))


def add_unsigned(shared: dict[str, Path], seed: int = 9) -> str:
    """alice adds and pushes a version without signing it; its id."""
    alice = shared["alice"]
    configure(alice, signing_always="false")
    assert (
        run_cli("-C", str(alice), "add", str(make_model(shared["tmp"] / f"u{seed}", seed=seed)), "--name", "ft")[0] == 0
    )
    assert run_cli("-C", str(alice), "push")[0] == 0
    return head_of(shared["remote"], "ft")


def nothing_kept(target: Path, vid: str) -> None:
    from mgit.signing.store import SignatureStore

    assert not (target / ".mgit" / "objects" / vid[:2] / vid[2:]).exists()
    assert not (target / ".mgit" / "signatures" / vid).exists()
    assert not SignatureStore(target / ".mgit").names(vid)  # nor in a bundle


@pytest.mark.parametrize("lazy", [False, True])
def test_signatures_arrive_with_a_clone_that_requires_them(shared: dict[str, Path], lazy: bool) -> None:
    (code, _, err), target = clone(shared, "bob", *(["--lazy"] if lazy else []))
    assert code == 0, err
    for ref in ("base@1", "base@2", "ft"):
        code, out, _ = run_cli("-C", str(target), "verify", ref, "--json")
        assert code == 0 and json.loads(out)["versions"][0]["signatures"][0]["principals"] == ["alice@example.com"]
    assert run_cli("-C", str(target), "verify", "ft", "--lineage")[0] == 0
    assert run_cli("-C", str(target), "checkout", "ft", "-o", str(shared["tmp"] / "out"))[0] == 0


def test_a_signature_made_after_the_push_travels_with_the_next_push_and_fetch(shared: dict[str, Path]) -> None:
    (code, _, err), target = clone(shared, "bob")
    assert code == 0, err
    reviewer = keygen(shared["tmp"] / "keys", "reviewer")
    alice, vid = shared["alice"], head_of(shared["remote"], "base")
    assert run_cli("-C", str(alice), "sign", "base", "--key", str(reviewer))[0] == 0
    assert run_cli("-C", str(alice), "push")[0] == 0
    assert len(remote_sigs(shared["remote"], vid)) == 2
    read = []  # a push after that reads no signature file: the remote has them all, by name
    with pytest.MonkeyPatch.context() as patch:
        from mgit.signing.store import SignatureStore

        get = SignatureStore.get
        patch.setattr(SignatureStore, "get", lambda self, v: read.append(v) or get(self, v))
        assert run_cli("-C", str(alice), "push")[0] == 0
    assert read == []
    assert run_cli("-C", str(target), "fetch")[0] == 0
    assert len(list((target / ".mgit" / "signatures" / vid).glob("*.sig"))) == 2


def test_fetch_and_pull_refuse_an_unsigned_version_and_keep_nothing(shared: dict[str, Path]) -> None:
    (code, _, err), target = clone(shared, "bob")
    assert code == 0, err
    before = head_of(shared["remote"], "ft")
    vid = add_unsigned(shared)
    one_line_error(
        run_cli("-C", str(target), "fetch"), f"version {vid[:12]} of 'ft' from origin is not signed", "nothing was kept"
    )
    nothing_kept(target, vid)
    assert (target / ".mgit" / "refs" / "remotes" / "origin" / "ft").read_text().strip() == before
    one_line_error(run_cli("-C", str(target), "pull"), f"version {vid[:12]}", "not signed")
    code, _, err = run_cli("-C", str(target), "pull", "--no-verify")
    assert code == 0 and "--no-verify" in err
    assert (target / ".mgit" / "refs" / "models" / "ft").read_text().strip() == vid


def test_the_policy_of_one_remote_holds_over_the_repository_default(shared: dict[str, Path]) -> None:
    (code, _, err), target = clone(shared, "bob")
    assert code == 0, err
    vid = add_unsigned(shared)
    configure(target, verify_require="none", **{"remote.origin.verify": "signed"})
    one_line_error(run_cli("-C", str(target), "fetch"), f"{vid[:12]}", "not signed")
    # and the other way: the remote's "none" holds over a repository default that would refuse
    configure(target, verify_require="signed", **{"remote.origin.verify": "none"})
    assert run_cli("-C", str(target), "fetch")[0] == 0
    assert (target / ".mgit" / "refs" / "remotes" / "origin" / "ft").read_text().strip() == vid


def test_a_clone_keeps_what_arrives_in_one_bundle_and_passes_it_on(
    shared: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Signatures a clone brings are kept in one bundle file (here from two on; thousands in
    practice), read back by verify and sent on by a push to another remote, whose clones
    verify them in turn."""
    from mgit.signing import store

    monkeypatch.setattr(store, "BUNDLE_FROM", 2)
    (code, _, err), target = clone(shared, "bob", "--lazy")
    assert code == 0, err
    folder = target / ".mgit" / "signatures"
    [bundle] = store.SignatureStore(target / ".mgit").bundle_files()
    assert sorted(p.name for p in folder.iterdir()) == ["bundles"] and len(json.loads(bundle.read_bytes())) == 3
    assert run_cli("-C", str(target), "verify", "ft", "--lineage")[0] == 0
    onward = shared["tmp"] / "onward.mgit"
    assert run_cli("init", "--bare", str(onward))[0] == 0
    assert run_cli("-C", str(target), "remote", "add", "onward", str(onward))[0] == 0
    code, _, err = run_cli("-C", str(target), "push", "onward")
    assert code == 0, err
    third = shared["tmp"] / "carol"
    allowed = str(shared["allowed"])
    code, _, err = run_cli("clone", str(onward), str(third), "--verify", "trusted", "--allowed-signers", allowed)
    assert code == 0, err
    for ref in ("base@1", "base@2", "ft"):
        code, out, _ = run_cli("-C", str(third), "verify", ref, "--json")
        assert code == 0 and json.loads(out)["versions"][0]["signatures"][0]["principals"] == ["alice@example.com"]


@pytest.mark.parametrize("lazy", [False, True])
def test_a_clone_that_refuses_a_version_leaves_no_repository(shared: dict[str, Path], lazy: bool) -> None:
    vid = add_unsigned(shared)
    result, target = clone(shared, "bob", *(["--lazy"] if lazy else []))
    one_line_error(result, f"version {vid[:12]} of 'ft'", "not signed")
    assert not target.exists()


def test_a_signature_by_a_stranger_is_refused_naming_the_signer(shared: dict[str, Path]) -> None:
    vid = add_unsigned(shared)
    alice = shared["alice"]
    code, out, _ = run_cli("-C", str(alice), "sign", "ft", "--key", str(shared["mallory"]), "--json")
    fingerprint = json.loads(out)["fingerprint"]
    assert run_cli("-C", str(alice), "push")[0] == 0
    result, target = clone(shared, "bob")
    one_line_error(result, vid[:12], "signed by no allowed signer", f"{fingerprint}: unknown key")
    assert not target.exists()


def test_a_downgrade_that_drops_the_signatures_is_refused(shared: dict[str, Path]) -> None:
    vid = head_of(shared["remote"], "base")
    shutil.rmtree(shared["remote"] / "signatures" / vid)
    shutil.rmtree(shared["remote"] / "signatures" / "bundles")  # the push's bundle held it too
    result, target = clone(shared, "bob")
    one_line_error(result, f"version {vid[:12]} of 'base'", "not signed")
    assert not target.exists()


def test_a_good_signature_served_for_a_forged_record_is_refused(shared: dict[str, Path]) -> None:
    (code, _, err), target = clone(shared, "bob")
    assert code == 0, err
    remote = shared["remote"]
    real = head_of(remote, "ft")
    record = json.loads(_record_json(remote, real))
    record["message"] = "forged: claims to be alice's"
    record["predecessor"] = real
    forged = forge_version(remote, Version.from_json(record))
    (remote / "signatures" / forged).mkdir()
    for sig in remote_sigs(remote, real):
        shutil.copy(sig, remote / "signatures" / forged / sig.name)
    set_ref(remote, "ft", forged)
    one_line_error(
        run_cli("-C", str(target), "fetch"), f"of version {forged[:12]}", "does not sign version", "nothing was kept"
    )
    nothing_kept(target, forged)


def _record_json(remote: Path, vid: str) -> str:
    """A version record on the remote, as JSON (read through a store of the remote's files)."""
    from mgit.store.local import LocalStore

    store = LocalStore(remote / "objects", fsync=False, lock_path=remote / "locks" / "repo.lock")
    return json.dumps(store.get_version(vid).to_json())


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"-----BEGIN SSH SIGNATURE-----\n" + b"A" * (1 << 20) + b"\n-----END SSH SIGNATURE-----\n", "larger"),
        (None, "truncated"),
        (b"not a signature at all\n", "does not hash to its name"),
        (b"", "not an SSH signature"),  # an empty file, named by its (empty) content
    ],
)
def test_huge_truncated_and_malformed_signatures_on_a_remote_are_refused(
    shared: dict[str, Path], content: bytes | None, why: str
) -> None:
    import base64
    import hashlib

    remote = shared["remote"]
    vid = head_of(remote, "base")
    [good] = remote_sigs(remote, vid)
    if content is None:  # the body cut short, renamed to match: it parses no further than its end
        lines = good.read_bytes().splitlines()
        blob = base64.b64decode(b"".join(lines[1:-1]))[:-20]
        content = b"-----BEGIN SSH SIGNATURE-----\n" + base64.b64encode(blob) + b"\n-----END SSH SIGNATURE-----\n"
    name = hashlib.sha256(content).hexdigest() if why != "does not hash to its name" else "3" * 64
    (remote / "signatures" / vid / f"{name}.sig").write_bytes(content)
    result, target = clone(shared, "bob")
    one_line_error(result, f"of version {vid[:12]}", why)
    assert not target.exists()
    # without a policy too: a remote that lies about a signature is refused whatever this side demands
    code, _, err = run_cli("clone", str(remote), str(shared["tmp"] / "carol"))
    assert code == 1 and why in err and not (shared["tmp"] / "carol").exists()


def test_a_push_bundles_its_signatures_and_a_clone_reads_them_in_one_request(shared: dict[str, Path]) -> None:
    remote = shared["remote"]
    [bundle] = (remote / "signatures" / "bundles").glob("*.json")
    held = json.loads(bundle.read_text())
    assert sorted(held) == sorted(p.name for p in (remote / "signatures").iterdir() if p.name != "bundles")
    assert not (remote / "locks" / "signatures").exists()  # content-named: no lock file left per signature
    for folder in (remote / "signatures").iterdir():  # the files gone: the bundle alone carries them
        if folder.name != "bundles":
            shutil.rmtree(folder)
    (code, _, err), target = clone(shared, "bob", "--lazy")
    assert code == 0, err
    assert run_cli("-C", str(target), "verify", "ft", "--lineage")[0] == 0
    assert (target / ".mgit" / "remotes" / "origin" / "signature-bundles.json").is_file()


@pytest.mark.parametrize("forge", ["not json", "moved", "wrong name"])
def test_a_bundle_that_lies_is_refused(shared: dict[str, Path], forge: str) -> None:
    import blake3

    remote = shared["remote"]
    [bundle] = (remote / "signatures" / "bundles").glob("*.json")
    held = json.loads(bundle.read_text())
    base, ft = head_of(remote, "base"), head_of(remote, "ft")
    if forge == "moved":
        held[ft] = held[ft] + held[base]  # base's signature offered as ft's
        body = json.dumps(held).encode()
        why = "does not sign version"
    else:
        body = b"{not json" if forge == "not json" else json.dumps(held).encode() + b" "
        why = "is malformed"
    name = blake3.blake3(body).hexdigest() if forge != "wrong name" else "4" * 64
    (remote / "signatures" / "bundles" / f"{name}.json").write_bytes(body)
    result, target = clone(shared, "bob")
    one_line_error(result, why, "nothing was kept")
    assert not target.exists()


@pytest.mark.parametrize("checked", ["in a worker"], indirect=True)
def test_a_clone_checks_its_signatures_in_a_worker_and_not_again(
    shared: dict[str, Path], checked: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mgit.sync.signatures as sync_signatures

    answers: list[object] = []
    results = sync_signatures.CheckProcess.results
    monkeypatch.setattr(
        sync_signatures.CheckProcess, "results", lambda self: answers.append(results(self)) or answers[-1]
    )
    monkeypatch.setattr(sync_signatures, "check_named", lambda *a: pytest.fail(f"checked in-process: {a[:2]}"))
    (code, _, err), target = clone(shared, "bob", "--lazy")
    assert code == 0, err
    assert answers == [[None, None, None]]  # base@1, base@2 and ft@1, each signed by alice: all passed there
    code, out, _ = run_cli("-C", str(target), "verify", "ft", "--lineage")
    assert code == 0 and "alice@example.com" in out


@pytest.mark.parametrize("checked", ["in a worker"], indirect=True)
def test_a_worker_that_dies_leaves_the_checks_to_the_clone(
    shared: dict[str, Path], checked: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal

    import mgit.sync.signatures as sync_signatures

    started = sync_signatures.CheckProcess.__init__

    def killed(self: object, items: list) -> None:
        started(self, items)
        os.kill(self.pid, signal.SIGKILL)  # type: ignore[attr-defined]

    monkeypatch.setattr(sync_signatures.CheckProcess, "__init__", killed)
    vid = head_of(shared["remote"], "base")
    (shared["remote"] / "signatures" / vid / f"{'3' * 64}.sig").write_bytes(b"not a signature at all\n")
    result, target = clone(shared, "bob")
    one_line_error(result, f"of version {vid[:12]}", "does not hash to its name")  # checked here instead
    assert not target.exists()
