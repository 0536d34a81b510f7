"""SSH signatures as `ssh-keygen -Y` makes and checks them (mgit.signing): each side accepts
the other's, allowed-signers files judge keys as ssh-keygen does, the ssh-agent signs, and
malformed signatures are refused saying why."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from signers import KEYGEN, keygen, ssh_agent

from mgit.errors import SignatureError, SigningKeyError
from mgit.signing.agent import agent_signer
from mgit.signing.allowed import AllowedSigners
from mgit.signing.keys import PublicKey, load_signing_key
from mgit.signing.sshsig import VERSION_NAMESPACE, SshSignature, armor, sign, version_message

VID = "ab" * 32
KINDS = [("ed25519", []), ("ecdsa", ["-b", "256"]), ("ecdsa", ["-b", "384"]), ("ecdsa", ["-b", "521"])]

pytestmark = pytest.mark.skipif(not Path(KEYGEN).exists(), reason="openssh-client's ssh-keygen is not installed")


def ssh_verify(folder: Path, sig: bytes, allowed: str, principal: str, namespace: str = VERSION_NAMESPACE, **kw):
    (folder / "sig").write_bytes(sig)
    (folder / "allowed").write_text(allowed)
    args = [KEYGEN, "-Y", "verify", "-f", str(folder / "allowed"), "-I", principal, "-n", namespace]
    args += ["-s", str(folder / "sig")] + (["-r", kw["revoked"]] if "revoked" in kw else [])
    return subprocess.run(args, input=version_message(VID), capture_output=True)


@pytest.mark.parametrize(("kind", "extra"), KINDS)
def test_a_signature_made_here_is_one_ssh_keygen_accepts(tmp_path: Path, kind: str, extra: list[str]) -> None:
    key = keygen(tmp_path, "alice", kind, extra)
    sig = sign(load_signing_key(key), version_message(VID))
    line = (key.with_suffix(".pub")).read_text()
    ok = ssh_verify(tmp_path, sig.armored, f"alice@example.com {line}", "alice@example.com")
    assert ok.returncode == 0, ok.stderr
    assert b"Good" in ok.stdout
    # another principal, another namespace, another message: ssh-keygen refuses each
    assert ssh_verify(tmp_path, sig.armored, f"alice@example.com {line}", "bob@example.com").returncode != 0
    assert ssh_verify(tmp_path, sig.armored, f"alice@example.com {line}", "alice@example.com", "git").returncode != 0
    novalidate = subprocess.run(
        [KEYGEN, "-Y", "check-novalidate", "-n", VERSION_NAMESPACE, "-s", str(tmp_path / "sig")],
        input=version_message("cd" * 32),
        capture_output=True,
    )
    assert novalidate.returncode != 0


@pytest.mark.parametrize(("kind", "extra"), KINDS)
def test_a_signature_ssh_keygen_made_is_one_accepted_here(tmp_path: Path, kind: str, extra: list[str]) -> None:
    key = keygen(tmp_path, "bob", kind, extra)
    (tmp_path / "msg").write_bytes(version_message(VID))
    subprocess.run(
        [KEYGEN, "-q", "-Y", "sign", "-n", VERSION_NAMESPACE, "-f", str(key), str(tmp_path / "msg")], check=True
    )
    sig = SshSignature.parse((tmp_path / "msg.sig").read_bytes())
    assert sig.public == PublicKey.from_line(key.with_suffix(".pub").read_text())
    assert sig.verifies(version_message(VID), VERSION_NAMESPACE)
    assert not sig.verifies(version_message("cd" * 32), VERSION_NAMESPACE)
    assert not sig.verifies(version_message(VID), "git")
    fingerprint = subprocess.run([KEYGEN, "-l", "-f", str(key.with_suffix(".pub"))], capture_output=True, text=True)
    assert sig.public.fingerprint == fingerprint.stdout.split()[1]


def _stamp(delta_days: int) -> str:
    return (datetime.now(UTC) + timedelta(days=delta_days)).strftime("%Y%m%d%H%M%SZ")


@pytest.mark.parametrize(
    ("options", "status"),
    [
        ("", "trusted"),
        (f'valid-before="{_stamp(-1)}"', "expired"),
        (f'valid-after="{_stamp(2)}"', "not yet valid"),
        (f'valid-after="{_stamp(-2)}",valid-before="{_stamp(2)}"', "trusted"),
        ('namespaces="git,file"', "not allowed for mgit-version"),
        ('namespaces="mgit-*"', "trusted"),
    ],
    # ids without the stamps: xdist's workers must collect the same names a second apart
    ids=["plain", "expired", "not-yet-valid", "in-window", "other-namespaces", "namespace-pattern"],
)
def test_allowed_signers_judge_a_key_as_ssh_keygen_does(tmp_path: Path, options: str, status: str) -> None:
    key = keygen(tmp_path, "carol")
    sig = sign(load_signing_key(key), version_message(VID))
    allowed = f"carol@example.com,ci {options} {key.with_suffix('.pub').read_text()}".replace("  ", " ")
    (tmp_path / "signers").write_text("# team\n\n" + allowed)
    judged = AllowedSigners.load(tmp_path / "signers").judge(sig)
    assert judged.status == status
    assert judged.principals == ("carol@example.com", "ci")
    theirs = ssh_verify(tmp_path, sig.armored, allowed, "carol@example.com")
    assert (theirs.returncode == 0) == (status == "trusted"), theirs.stderr


def test_revoked_keys_are_refused_here_and_by_ssh_keygen(tmp_path: Path) -> None:
    key, other = keygen(tmp_path, "dave"), keygen(tmp_path, "erin")
    sig = sign(load_signing_key(key), version_message(VID))
    line = key.with_suffix(".pub").read_text()
    (tmp_path / "signers").write_text(f"dave {line}erin {other.with_suffix('.pub').read_text()}")
    (tmp_path / "revoked").write_text(f"# dave's old laptop\n\n{line}")  # comments and blanks, as ssh-keygen reads it
    assert AllowedSigners.load(tmp_path / "signers").judge(sig).trusted
    assert AllowedSigners.load(tmp_path / "signers", tmp_path / "revoked").judge(sig).status == "revoked"
    assert ssh_verify(tmp_path, sig.armored, f"dave {line}", "dave", revoked=str(tmp_path / "revoked")).returncode != 0
    (tmp_path / "marked").write_text(f"dave {line}@revoked {line}")
    assert AllowedSigners.load(tmp_path / "marked").judge(sig).status == "revoked"
    stranger = sign(load_signing_key(keygen(tmp_path, "frank")), version_message(VID))
    assert AllowedSigners.load(tmp_path / "signers").judge(stranger).status == "unknown key"


def test_allowed_signers_lines_that_cannot_be_honoured_are_refused_by_line(tmp_path: Path) -> None:
    line = keygen(tmp_path, "gina").with_suffix(".pub").read_text()
    for text, why in [
        (f"gina cert-authority {line}", "cert-authority"),
        (f"gina frobnicate {line}", "unknown option"),
        (f'gina valid-before="yesterday" {line}', "YYYYMMDD"),
        ("gina ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQ", "not supported"),
        ("gina ssh-ed25519 !!!!", "base64"),
    ]:
        (tmp_path / "signers").write_text(f"# header\n{text}\n")
        with pytest.raises(SigningKeyError) as caught:
            AllowedSigners.load(tmp_path / "signers")
        assert "line 2" in str(caught.value) and why in str(caught.value)
        assert "\n" not in str(caught.value)


def test_malformed_signatures_are_refused_saying_why(tmp_path: Path) -> None:
    good = sign(load_signing_key(keygen(tmp_path, "hal")), version_message(VID)).armored
    body = b"".join(good.splitlines()[1:-1])
    import base64

    blob = base64.b64decode(body)
    cases = {
        b"x" * (1 << 20): "larger than any SSH signature",
        good[: len(good) // 2]: "no BEGIN/END",
        armor(blob[:-10]): "truncated",
        armor(blob + b"\0"): "after its end",
        armor(b"SSHSIG\0\0\0\x02" + blob[10:]): "version 2",
        armor(b"NOTSIG" + blob[6:]): "magic",
        good.replace(body[40:44], b"!!!!"): "base64",
        armor(blob[:10] + b"\xff\xff\xff\xff" + blob[14:]): "truncated",
        "\u00e9".encode() * 10: "not ASCII",
    }
    for data, why in cases.items():
        with pytest.raises(SignatureError) as caught:
            SshSignature.parse(data)
        assert why in caught.value.message, (data[:40], caught.value.message)


def test_signing_keys_that_cannot_sign_are_refused(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    subprocess.run([KEYGEN, "-q", "-t", "ed25519", "-N", "secret", "-f", str(locked)], check=True)
    with pytest.raises(SigningKeyError, match="encrypted"):
        load_signing_key(locked)
    rsa = keygen(tmp_path, "rsa", "rsa", ["-b", "2048"])
    with pytest.raises(SigningKeyError, match="ed25519 and ecdsa"):
        load_signing_key(rsa)
    with pytest.raises(SigningKeyError, match="cannot read"):
        load_signing_key(tmp_path / "absent")


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Path]:
    with ssh_agent(tmp_path / "agent.sock") as sock:
        yield sock


def test_the_ssh_agent_signs_for_a_public_key(tmp_path: Path, agent: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = keygen(tmp_path, "ivy")
    monkeypatch.setenv("SSH_AUTH_SOCK", str(agent))
    pub = key.with_suffix(".pub")
    with pytest.raises(SigningKeyError, match="refused to sign"):
        sign(load_signing_key(pub), version_message(VID))
    env = {**os.environ, "SSH_AUTH_SOCK": str(agent)}
    subprocess.run(["ssh-add", "-q", str(key)], check=True, env=env, capture_output=True)
    signer = load_signing_key(pub)
    assert signer.private is None and load_signing_key(key).private is not None  # the agent keeps its key
    sig = sign(signer, version_message(VID))
    assert sig.public == PublicKey.from_line(pub.read_text())
    ok = ssh_verify(tmp_path, sig.armored, f"ivy {pub.read_text()}", "ivy")
    assert ok.returncode == 0, ok.stderr
    monkeypatch.delenv("SSH_AUTH_SOCK")
    with pytest.raises(SigningKeyError, match="SSH_AUTH_SOCK"):
        agent_signer(PublicKey.from_line(pub.read_text()), where=str(pub))


def test_a_public_key_seen_again_is_not_parsed_again_and_a_bad_one_is_not_remembered(tmp_path: Path) -> None:
    from mgit.signing import keys

    good = keys.PublicKey.from_line(keygen(tmp_path, "a").with_suffix(".pub").read_text())
    again = keys.PublicKey.from_blob(bytes(good.blob))  # an equal blob, another bytes object
    assert again is good and again.crypto() is good.crypto()
    for blob in (good.blob[:-1], b"\x00\x00\x00\x07ssh-dss"):  # a key cut short; an unsupported type
        for _ in range(2):  # refused each time: a refusal is not remembered as a key
            with pytest.raises(SignatureError):
                keys.PublicKey.from_blob(blob)
        assert blob not in keys._PARSED
