"""Signed versions in one repository: add --sign, signing.always, mgit sign by several
keys, mgit verify (and --lineage), mgit config, and checkout under verify.require; the
attacks a repository's own files can carry (a record changed after signing, a signature
moved to another version, keys unknown, expired, revoked, a wrong namespace, malformed
signature files), each refused in one line with exit code 1."""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import make_model, one_line_error, run_cli
from signers import KEYGEN, allowed_file, configure, keygen

pytestmark = pytest.mark.skipif(not Path(KEYGEN).exists(), reason="openssh-client's ssh-keygen is not installed")


@pytest.fixture
def signed(tmp_path: Path) -> dict[str, Path]:
    """A repository with base@1 (signed by alice) and ft@1 derived from it (unsigned); alice
    and bob are allowed signers, mallory is not."""
    root, keys = tmp_path / "work", tmp_path / "keys"
    assert run_cli("init", str(root))[0] == 0
    alice, bob, mallory = keygen(keys, "alice"), keygen(keys, "bob", "ecdsa", ["-b", "384"]), keygen(keys, "mallory")
    allowed = allowed_file(keys / "allowed", ("alice@example.com", alice), ("bob@example.com", bob))
    configure(root, signing_key=alice, verify_allowed_signers=allowed)
    run = lambda *a: run_cli("-C", str(root), *a)  # noqa: E731
    code, out, err = run("add", str(make_model(tmp_path / "m1", seed=1)), "--name", "base", "--sign")
    assert code == 0 and "signed by SHA256:" in out, err
    assert run("add", str(make_model(tmp_path / "m2", seed=2)), "--name", "ft", "--parent", "base")[0] == 0
    return {"root": root, "alice": alice, "bob": bob, "mallory": mallory, "allowed": allowed, "tmp": tmp_path}


def verify_json(root: Path, *args: str) -> tuple[int, dict]:
    code, out, _ = run_cli("-C", str(root), "verify", *args, "--json")
    return code, json.loads(out)


def vid_of(root: Path, ref: str) -> str:
    code, out, _ = run_cli("-C", str(root), "log", ref, "--json")
    return json.loads(out)[0]["id"]


def test_a_signed_version_verifies_and_ssh_keygen_agrees(signed: dict[str, Path]) -> None:
    root = signed["root"]
    code, report = verify_json(root, "base")
    assert code == 0 and report["ok"]
    [sig] = report["versions"][0]["signatures"]
    assert sig["principals"] == ["alice@example.com"] and sig["status"] == "trusted"
    assert report["versions"][0]["content_ok"]
    vid = vid_of(root, "base")
    [stored] = (root / ".mgit" / "signatures" / vid).iterdir()
    done = subprocess.run(
        [KEYGEN, "-Y", "verify", "-f", str(signed["allowed"]), "-I", "alice@example.com", "-n", "mgit-version"]
        + ["-s", str(stored)],
        input=f"{vid}\n".encode(),
        capture_output=True,
    )
    assert done.returncode == 0, done.stderr
    code, out, _ = run_cli("-C", str(root), "verify", "base")
    assert code == 0 and "signed by alice@example.com" in out


def test_several_keys_sign_one_version_and_signing_again_changes_nothing(signed: dict[str, Path]) -> None:
    root, bob = signed["root"], signed["bob"]
    code, out, _ = run_cli("-C", str(root), "sign", "base", "--key", str(bob))
    assert code == 0 and "signed by" in out
    code, out, _ = run_cli("-C", str(root), "sign", "base")
    assert code == 0 and "already signed" in out
    _, report = verify_json(root, "base")
    assert sorted(p for s in report["versions"][0]["signatures"] for p in s["principals"]) == [
        "alice@example.com",
        "bob@example.com",
    ]
    assert len(list((root / ".mgit" / "signatures" / vid_of(root, "base")).iterdir())) == 2


def test_signing_always_signs_every_add(signed: dict[str, Path]) -> None:
    root = signed["root"]
    configure(root, signing_always="true")
    code, out, _ = run_cli("-C", str(root), "add", str(make_model(signed["tmp"] / "m3", seed=3)), "--name", "ft")
    assert code == 0 and "signed by" in out
    assert verify_json(root, "ft")[0] == 0


def test_signing_always_reads_the_key_once_for_many_versions(
    signed: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cascade, a pull's replays and signing.always sign many versions through one Repo:
    the key file is read once, and each version still carries its own signature."""
    from mgit import Repo
    from mgit.signing import keys

    root = signed["root"]
    configure(root, signing_always="true")
    loads, load = [], keys.load_signing_key
    monkeypatch.setattr(keys, "load_signing_key", lambda path: loads.append(path) or load(path))
    repo = Repo(root)
    added = [repo.add(make_model(signed["tmp"] / f"s{i}", seed=10 + i), name="ft").version for i in range(3)]
    assert loads == [str(signed["alice"])]
    assert all(verify_json(root, vid)[0] == 0 for vid in added)


def test_verify_lineage_reports_the_first_link_that_is_not_trusted(signed: dict[str, Path]) -> None:
    root = signed["root"]
    assert run_cli("-C", str(root), "sign", "ft")[0] == 0
    code, report = verify_json(root, "ft", "--lineage")
    assert code == 0 and [v["ref"] for v in report["versions"]] == ["ft@1", "base@1"]
    base = vid_of(root, "base")
    shutil.rmtree(root / ".mgit" / "signatures" / base)
    code, report = verify_json(root, "ft", "--lineage")
    assert code == 1 and report["first_bad"]["ref"] == "base@1" and report["first_bad"]["refused"] == "is not signed"
    code, out, err = run_cli("-C", str(root), "verify", "ft", "--lineage")
    assert code == 1 and err.count("\n") == 1 and "version base@1 is not signed" in err


def test_verify_lineage_names_an_ancestor_whose_record_is_damaged(signed: dict[str, Path]) -> None:
    """The walk follows each record as it is verified: a damaged ancestor is the link that
    breaks the chain (reported, exit 1), not an error before anything is verified."""
    root = signed["root"]
    assert run_cli("-C", str(root), "sign", "ft")[0] == 0
    base = vid_of(root, "base")
    record = root / ".mgit" / "objects" / base[:2] / base[2:]
    data = bytearray(record.read_bytes())
    data[-1] ^= 1
    record.chmod(0o644)
    record.write_bytes(bytes(data))
    code, report = verify_json(root, "ft", "--lineage")
    assert code == 1 and [v["ref"] for v in report["versions"]] == ["ft@1", "base@1"]
    assert report["versions"][0]["content_ok"] and not report["first_bad"]["content_ok"]
    assert report["first_bad"]["refused"].startswith("content does not match its id")


def test_checkout_under_verify_require_refuses_an_untrusted_version(signed: dict[str, Path]) -> None:
    root, out_dir = signed["root"], signed["tmp"] / "out"
    configure(root, verify_require="trusted")
    one_line_error(run_cli("-C", str(root), "checkout", "ft", "-o", str(out_dir)), "version ft@1 is not signed")
    assert not out_dir.exists()
    code, _, err = run_cli("-C", str(root), "checkout", "ft", "-o", str(out_dir), "--no-verify")
    assert code == 0 and "--no-verify" in err and out_dir.is_dir()
    assert run_cli("-C", str(root), "checkout", "base", "-o", str(signed["tmp"] / "b"))[0] == 0
    configure(root, verify_require="signed")
    assert run_cli("-C", str(root), "sign", "ft", "--key", str(signed["mallory"]))[0] == 0
    assert run_cli("-C", str(root), "checkout", "ft", "-o", str(signed["tmp"] / "c"))[0] == 0
    configure(root, verify_require="trusted")
    one_line_error(
        run_cli("-C", str(root), "checkout", "ft", "-o", str(signed["tmp"] / "d")),
        "signed by no allowed signer",
        "unknown key",
    )


def _stamp(days: int) -> str:
    return (datetime.now(UTC) + timedelta(days=days)).strftime("%Y%m%d%H%M%SZ")


@pytest.mark.parametrize(
    ("line", "status"),
    [
        ('alice@example.com valid-before="{past}" {key}', "expired"),
        ('alice@example.com valid-after="{future}" {key}', "not yet valid"),
        ('alice@example.com namespaces="git" {key}', "not allowed for mgit-version"),
        ("someone-else@example.com {other}", "unknown key"),
    ],
)
def test_keys_the_allowed_signers_do_not_trust_now_are_refused(signed: dict[str, Path], line: str, status: str) -> None:
    root = signed["root"]
    text = line.format(
        past=_stamp(-1),
        future=_stamp(3),
        key=signed["alice"].with_suffix(".pub").read_text().strip(),
        other=signed["bob"].with_suffix(".pub").read_text().strip(),
    )
    signed["allowed"].write_text(text + "\n")
    code, report = verify_json(root, "base")
    assert code == 1 and report["versions"][0]["signatures"][0]["status"] == status
    configure(root, verify_require="trusted")
    one_line_error(run_cli("-C", str(root), "checkout", "base", "-o", str(signed["tmp"] / "o")), "base@1", status)


def test_a_revoked_key_is_refused(signed: dict[str, Path]) -> None:
    root = signed["root"]
    revoked = signed["tmp"] / "revoked"
    revoked.write_text(signed["alice"].with_suffix(".pub").read_text())
    configure(root, verify_revoked=revoked)
    code, report = verify_json(root, "base")
    assert code == 1 and report["versions"][0]["signatures"][0]["status"] == "revoked"
    assert report["versions"][0]["signatures"][0]["principals"] == ["alice@example.com"]


def test_a_record_changed_after_signing_does_not_verify(signed: dict[str, Path]) -> None:
    root = signed["root"]
    vid = vid_of(root, "base")
    path = root / ".mgit" / "objects" / vid[:2] / vid[2:]
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    code, out, err = run_cli("-C", str(root), "verify", "base")
    assert code == 1 and "content does not match its id" in err and err.count("\n") == 1


def test_a_signature_moved_onto_another_version_signs_nothing(signed: dict[str, Path]) -> None:
    root = signed["root"]
    base, ft = vid_of(root, "base"), vid_of(root, "ft")
    [sig] = (root / ".mgit" / "signatures" / base).iterdir()
    (root / ".mgit" / "signatures" / ft).mkdir(parents=True)
    shutil.copy(sig, root / ".mgit" / "signatures" / ft / sig.name)
    code, report = verify_json(root, "ft")
    assert code == 1 and report["versions"][0]["signatures"][0]["status"] == "bad signature"
    configure(root, verify_require="signed")
    one_line_error(run_cli("-C", str(root), "checkout", "ft", "-o", str(signed["tmp"] / "o")), "has no valid signature")


def test_a_signature_for_another_namespace_is_refused(signed: dict[str, Path]) -> None:
    root, tmp = signed["root"], signed["tmp"]
    ft = vid_of(root, "ft")
    (tmp / "msg").write_text(f"{ft}\n")
    subprocess.run([KEYGEN, "-q", "-Y", "sign", "-n", "git", "-f", str(signed["alice"]), str(tmp / "msg")], check=True)
    folder = root / ".mgit" / "signatures" / ft
    folder.mkdir(parents=True)
    shutil.copy(tmp / "msg.sig", folder / ("0" * 64 + ".sig"))
    code, report = verify_json(root, "ft")
    assert code == 1 and report["versions"][0]["signatures"][0]["status"] == "signed for 'git', not mgit-version"
    # the same message signed for mgit-version by ssh-keygen is one mgit accepts
    subprocess.run(
        [KEYGEN, "-q", "-Y", "sign", "-n", "mgit-version", "-f", str(signed["alice"]), str(tmp / "msg")],
        check=True,
        input=b"y\n",
    )
    shutil.copy(tmp / "msg.sig", folder / ("1" * 64 + ".sig"))
    assert verify_json(root, "ft")[0] == 0


@pytest.mark.parametrize(
    "content", [b"", b"garbage", b"-----BEGIN SSH SIGNATURE-----\nU1NIU0lH\n-----END SSH SIGNATURE-----\n"]
)
def test_malformed_signature_files_count_as_bad_signatures(signed: dict[str, Path], content: bytes) -> None:
    root = signed["root"]
    ft = vid_of(root, "ft")
    (root / ".mgit" / "signatures" / ft).mkdir(parents=True)
    (root / ".mgit" / "signatures" / ft / ("2" * 64 + ".sig")).write_bytes(content)
    code, report = verify_json(root, "ft")
    assert code == 1 and report["versions"][0]["signatures"] == [
        {"fingerprint": "?", "key_type": "?", "principals": [], "status": "bad signature", "trusted": False}
    ]


def test_signing_without_a_usable_key_is_one_line(signed: dict[str, Path]) -> None:
    root = signed["root"]
    configure(root, signing_key=signed["tmp"] / "absent")
    one_line_error(run_cli("-C", str(root), "sign", "ft"), "cannot read the signing key")
    assert run_cli("-C", str(root), "config", "signing.key", "--unset")[0] == 0
    one_line_error(run_cli("-C", str(root), "sign", "ft"), "no signing key is set")
    one_line_error(run_cli("-C", str(root), "config", "verify.require", "maybe"), "signed, trusted, none")
    one_line_error(run_cli("-C", str(root), "config", "colour", "blue"), "unknown setting")
    assert not (root / ".mgit" / "signatures" / vid_of(root, "ft")).exists()


def test_config_lists_and_reads_settings(signed: dict[str, Path]) -> None:
    root = signed["root"]
    configure(root, verify_require="trusted", **{"remote.origin.verify": "signed"})
    code, out, _ = run_cli("-C", str(root), "config")
    assert code == 0 and "verify.require=trusted" in out and "remote.origin.verify=signed" in out
    code, out, _ = run_cli("-C", str(root), "config", "verify.require")
    assert (code, out) == (0, "trusted\n")
    assert run_cli("-C", str(root), "config", "verify.require", "--unset")[0] == 0
    code, out, err = run_cli("-C", str(root), "config", "verify.require")
    assert code == 0 and out == "" and "not set" in err


def test_log_show_and_serve_say_who_signed_and_flag_what_is_not_trusted(signed: dict[str, Path]) -> None:
    root = signed["root"]
    assert run_cli("-C", str(root), "sign", "ft", "--key", str(signed["mallory"]))[0] == 0
    reads = []
    with pytest.MonkeyPatch.context() as patch:  # the allowed signers are read once for the whole log
        from mgit.signing.allowed import AllowedSigners

        load = AllowedSigners.load
        patch.setattr(AllowedSigners, "load", lambda *a: reads.append(a) or load(*a))
        code, out, _ = run_cli("-C", str(root), "log", "--show-signature", "--json")
    assert code == 0 and len(reads) == 1
    by_ref = {f"{v['model']}@{v['seq']}": v["signatures"] for v in json.loads(out)}
    assert [s["principals"] for s in by_ref["base@1"]] == [["alice@example.com"]]
    assert [(s["status"], s["trusted"]) for s in by_ref["ft@1"]] == [("unknown key", False)]
    code, out, _ = run_cli("-C", str(root), "log", "--oneline", "--show-signature")
    lines = out.splitlines()
    assert "NOT TRUSTED" in lines[0] and "unknown key" in lines[0] and "signed by alice@example.com" in lines[1]
    code, out, _ = run_cli("-C", str(root), "show", "base", "--json")
    assert json.loads(out)["signatures"][0]["status"] == "trusted"
    code, out, _ = run_cli("-C", str(root), "show", "ft")
    assert "signatures: NOT TRUSTED by SHA256:" in out
    code, out, _ = run_cli("-C", str(root), "log", "base", "--json")
    assert "signatures" not in json.loads(out)[0]  # only when asked: log stays a catalog read
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from mgit import Repo
    from mgit.web.app import create_app

    with TestClient(create_app(Repo(root)), base_url="http://127.0.0.1:8808") as client:
        page = client.get("/api/models/ft").json()
        assert [(s["status"], s["trusted"]) for s in page["signatures"]] == [("unknown key", False)]
        html = client.get("/models/ft").text
        assert 'id="signatures"' in html and "not trusted: unknown key" in html
        assert "signed by alice@example.com" in client.get("/models/base").text


def test_signing_always_signs_a_merge(signed: dict[str, Path]) -> None:
    root = signed["root"]
    configure(root, signing_always="true")
    run = lambda *a: run_cli("-C", str(root), *a)  # noqa: E731
    assert run("add", str(make_model(signed["tmp"] / "m4", seed=4)), "--name", "ft2", "--parent", "base")[0] == 0
    code, _, err = run("merge", "ft", "ft2", "--method", "linear", "--name", "merged")
    assert code == 0, err
    code, report = verify_json(root, "merged", "--lineage", "--level", "signed")
    assert code == 1 and report["versions"][0]["signatures"][0]["principals"] == ["alice@example.com"]
    assert report["first_bad"]["ref"] == "ft@1"  # added before signing.always: the first unsigned link


def test_signing_always_signs_what_a_cascade_commits(signed: dict[str, Path]) -> None:
    from conftest import copy_user_code, tensors

    root, tmp = signed["root"], signed["tmp"]
    copy_user_code(root, "tune", "recipes.py")
    run = lambda *a: run_cli("-C", str(root), *a)  # noqa: E731
    ft_dir = make_model(tmp / "t1", state=tensors(5))
    code, _, err = run("add", str(ft_dir), "--name", "tuned", "--parent", "base", "--recipe", "recipes.py:tune")
    assert code == 0, err
    configure(root, signing_always="true")
    assert run("add", str(make_model(tmp / "b2", seed=7)), "--name", "base")[0] == 0
    code, out, err = run("cascade", "base", "--json")
    assert code == 0, err
    code, report = verify_json(root, "tuned")
    assert code == 0 and report["versions"][0]["ref"] == "tuned@2"
    assert report["versions"][0]["signatures"][0]["principals"] == ["alice@example.com"]


def test_a_cascade_whose_key_does_not_load_stops_before_any_recipe_runs(signed: dict[str, Path]) -> None:
    """signing.always with a key that cannot be read: the cascade says so in one line before
    it runs a recipe, instead of committing a version it then cannot sign."""
    from conftest import copy_user_code, tensors

    root, tmp = signed["root"], signed["tmp"]
    copy_user_code(root, "tune", "recipes.py")
    run = lambda *a: run_cli("-C", str(root), *a)  # noqa: E731
    ft_dir = make_model(tmp / "t1", state=tensors(5))
    assert run("add", str(ft_dir), "--name", "tuned", "--parent", "base", "--recipe", "recipes.py:tune")[0] == 0
    assert run("add", str(make_model(tmp / "b2", seed=7)), "--name", "base")[0] == 0
    configure(root, signing_always="true", signing_key=tmp / "no-such-key")
    before = json.loads(run("log", "tuned", "--json")[1])
    one_line_error(run("cascade", "base"), "cannot read the signing key", "no-such-key")
    assert json.loads(run("log", "tuned", "--json")[1]) == before  # nothing committed, signed or not


def test_many_signatures_are_kept_in_one_bundle_checked_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a clone of many signed versions keeps: every signature checked before any is
    written (one that signs another version writes nothing), then all of them in one bundle
    file named by its hash, made durable once; a few are files of their own, as ssh-keygen
    reads them. A store opened afresh reads both alike."""
    import os

    import blake3

    from mgit.errors import SignatureError
    from mgit.signing import keys, sshsig
    from mgit.signing.store import BUNDLE_FROM, SignatureStore, signature_name

    signer = keys.load_signing_key(keygen(tmp_path / "keys", "alice"))
    vids = [f"{i:064x}" for i in range(200)]
    made = [(v, sshsig.sign(signer, sshsig.version_message(v))) for v in vids]
    store = SignatureStore(tmp_path / "repo")
    with pytest.raises(SignatureError, match="does not sign version"):
        store.add_many([*made[:50], (vids[0], made[1][1])])  # a signature moved onto another version
    assert store.versions() == [] and not store.temporary_files() and not store.bundle_files()

    fsyncs: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: fsyncs.append(fd) or real(fd))
    assert store.add_many([*made[:150], made[0]]) == 150  # the same signature twice is kept once
    assert len(fsyncs) < 5  # one file and its folders, not a file and a folder per signature
    [bundle] = store.bundle_files()
    body = bundle.read_bytes()
    assert bundle.name == f"{blake3.blake3(body).hexdigest()}.json"
    assert json.loads(body) == {v: [s.armored.decode()] for v, s in made[:150]}  # docs/format.md's shape
    assert not [p for p in (tmp_path / "repo" / "signatures").iterdir() if p.name != "bundles"]
    few = made[150 : 150 + BUNDLE_FROM - 1]
    assert store.add_many(few) == len(few)  # too few for a bundle: a file each
    assert [p.name for p in (tmp_path / "repo" / "signatures" / few[0][0]).iterdir()] == [
        f"{signature_name(few[0][1].armored)}.sig"
    ]
    for reader in (store, SignatureStore(tmp_path / "repo")):
        assert reader.versions() == sorted(v for v, _ in [*made[:150], *few]) and not reader.temporary_files()
        for vid, sig in [*made[:150], *few]:
            assert reader.get(vid) == [sig.armored] and reader.names(vid) == {signature_name(sig.armored)}
        assert reader.add_many(made[:150]) == 0 and reader.add(*few[0]) is False
    assert len(store.bundle_files()) == 1


def test_a_damaged_bundle_reads_as_no_signature_fsck_names_it_and_gc_merges_bundles(signed: dict[str, Path]) -> None:
    """A bundle (as a clone writes one) serves its signatures to verify; one whose bytes no
    longer hash to its name is read as nothing (the version is unsigned, not trusted on
    damaged bytes) and fsck names it; gc merges bundles into one and loses no signature."""
    import blake3

    from mgit.signing.store import SignatureStore, bundle_body, signature_name

    root, base = signed["root"], vid_of(signed["root"], "base")
    folder = root / ".mgit" / "signatures"
    [alice_sig] = (folder / base).iterdir()
    assert run_cli("-C", str(root), "sign", "base", "--key", str(signed["bob"]))[0] == 0
    [bob_sig] = [p for p in (folder / base).iterdir() if p != alice_sig]
    (folder / "bundles").mkdir()
    bundles, texts = [], [alice_sig.read_text(), bob_sig.read_text()]
    for sig in (alice_sig, bob_sig):  # each in a bundle of its own, as two fetches would leave them
        body = bundle_body({base: [sig.read_bytes()]})
        bundles.append(folder / "bundles" / f"{blake3.blake3(body).hexdigest()}.json")
        bundles[-1].write_bytes(body)
    shutil.rmtree(folder / base)
    code, report = verify_json(root, "base")
    assert code == 0 and sorted(p for s in report["versions"][0]["signatures"] for p in s["principals"]) == [
        "alice@example.com",
        "bob@example.com",
    ]

    good = bundles[1].read_bytes()
    bundles[1].write_bytes(good.replace(b"-----END", b"-----end"))  # the bytes no longer hash to the name
    code, report = verify_json(root, "base")
    assert code == 0 and [s["principals"] for s in report["versions"][0]["signatures"]] == [["alice@example.com"]]
    code, out, _ = run_cli("-C", str(root), "fsck")
    assert code == 1 and f"signature bundle {bundles[1].name} is damaged" in out
    bundles[1].write_bytes(good)

    assert run_cli("-C", str(root), "gc")[0] == 0
    [merged] = SignatureStore(root / ".mgit").bundle_files()
    assert merged not in bundles
    assert json.loads(merged.read_bytes()) == {base: sorted(texts, key=lambda t: signature_name(t.encode()))}
    code, report = verify_json(root, "base")
    assert code == 0 and len(report["versions"][0]["signatures"]) == 2
    assert run_cli("-C", str(root), "fsck")[0] == 0
