"""The signing settings (`mgit config`, kept under "settings" in config.json) and what a
version's signatures amount to under them.

    signing.key             PATH: a private key file, or a public key the ssh-agent holds
    signing.always          true: every version committed here is signed (add, merge,
                            cascade, import-hf, a cluster run's outputs on the driver)
    verify.allowed-signers  PATH: whose signatures are trusted (mgit.signing.allowed)
    verify.revoked          PATH: keys no longer trusted, one public key a line
    verify.require          signed | trusted: what fetch, pull, clone and checkout demand
    remote.NAME.verify      signed | trusted | none: the same for one remote, over verify.require

`signed` asks for a signature that verifies over the version id (whoever's key); `trusted`
for one by an allowed signer, in its time window, not revoked.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mgit.errors import InvalidOptionError, SignatureError

if TYPE_CHECKING:  # (every Repo reads the settings; the signing stack is loaded by what judges a signature)
    from mgit.signing.allowed import AllowedSigners
    from mgit.signing.sshsig import SshSignature
    from mgit.signing.store import SignatureStore

SETTINGS_KEY = "settings"
PATHS = ("signing.key", "verify.allowed-signers", "verify.revoked")
LEVELS = ("signed", "trusted")
REMOTE_VERIFY = re.compile(r"^remote\.([A-Za-z0-9][A-Za-z0-9._-]{0,63})\.verify\Z")


def check_setting(key: str, value: str) -> str | bool:
    """A setting's value as stored, or InvalidOptionError naming what is accepted."""
    if key in PATHS:
        return str(Path(value).expanduser().resolve())
    if key == "signing.always":
        if value.lower() not in ("true", "false"):
            raise InvalidOptionError(f"signing.always is true or false, not {value!r}")
        return value.lower() == "true"
    if key == "verify.require" or REMOTE_VERIFY.match(key):
        allowed = (*LEVELS, "none")
        if value not in allowed:
            raise InvalidOptionError(f"{key} is one of {', '.join(allowed)}, not {value!r}")
        return value
    raise InvalidOptionError(
        f"unknown setting {key!r}",
        hint="Settings: signing.key, signing.always, verify.allowed-signers, verify.revoked, "
        "verify.require, remote.NAME.verify",
    )


def settings(config: dict[str, Any]) -> dict[str, Any]:
    found = config.get(SETTINGS_KEY)
    return dict(found) if isinstance(found, dict) else {}


def anchored(config: dict[str, Any], root: Path) -> dict[str, Any]:
    """`config` as every reader of the settings sees it (Repo applies it once, on opening):
    a path setting with `~` expanded and a relative one taken from the work folder `root`
    (docs/format.md), read under "settings" also when config.json has it as a top-level key
    (as hand-written files do). A value that is not a text is left for `path_setting` to refuse."""
    values = settings(config)
    for key in PATHS:
        value = values.get(key, config.get(key))
        if isinstance(value, str) and value:
            values[key] = str(root / Path(value).expanduser())
        elif value is not None:
            values[key] = value
    return {**config, SETTINGS_KEY: values} if values else config


def path_setting(config: dict[str, Any], key: str) -> str | None:
    """The path a setting names, or None when it is not set."""
    value = settings(config).get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise InvalidOptionError(f"the setting {key} in config.json is not a path")
    return value


def required(config: dict[str, Any], remote: str | None = None) -> str | None:
    """What the policy demands of versions (from `remote`, when given): signed, trusted or None."""
    values = settings(config)
    level = values.get(f"remote.{remote}.verify") if remote else None
    level = level or values.get("verify.require")
    return level if level in LEVELS else None


def signs_always(config: dict[str, Any]) -> bool:
    return settings(config).get("signing.always") is True


def allowed_signers(config: dict[str, Any]) -> AllowedSigners:
    from mgit.signing.allowed import AllowedSigners

    return AllowedSigners.load(path_setting(config, "verify.allowed-signers"), path_setting(config, "verify.revoked"))


@dataclass(frozen=True)
class SignatureCheck:
    """One signature of a version as judged here: its key, who the allowed signers say it
    is, and `status`: trusted, or why not (bad signature, unknown key, expired, revoked,
    not yet valid, not allowed for NAMESPACE)."""

    fingerprint: str
    key_type: str
    principals: tuple[str, ...]
    status: str

    @property
    def trusted(self) -> bool:
        return self.status == "trusted"

    @property
    def valid(self) -> bool:
        """The signature itself verifies over the version (whoever's key it is)."""
        return self.status != "bad signature" and not self.status.startswith("signed for")

    @property
    def signer(self) -> str:
        return ",".join(self.principals) or self.fingerprint

    def to_dict(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "key_type": self.key_type,
            "principals": list(self.principals),
            "status": self.status,
            "trusted": self.trusted,
        }


def judge(vid: str, signatures: list[bytes | SshSignature], allowed: AllowedSigners) -> list[SignatureCheck]:
    """Each of a version's signatures: does it sign this version, and whose key is it."""
    from mgit.signing.sshsig import VERSION_NAMESPACE, SshSignature
    from mgit.signing.store import check_signature

    out = []
    for armored in signatures:
        try:
            parsed = armored if isinstance(armored, SshSignature) else SshSignature.parse(armored)
        except SignatureError:
            out.append(SignatureCheck("?", "?", (), "bad signature"))
            continue
        key = parsed.public
        try:
            sig = check_signature(vid, parsed)
        except SignatureError:
            wrong = parsed.namespace != VERSION_NAMESPACE
            status = f"signed for {parsed.namespace!r}, not {VERSION_NAMESPACE}" if wrong else "bad signature"
            out.append(SignatureCheck(key.fingerprint, key.kind, allowed.judge(parsed).principals, status))
            continue
        judged = allowed.judge(sig)
        out.append(SignatureCheck(key.fingerprint, key.kind, judged.principals, judged.status))
    return out


def refusal(checks: list[SignatureCheck], level: str | None) -> str | None:
    """Why the policy `level` refuses a version with these signatures (None: it does not)."""
    if level is None:
        return None
    if not checks:
        return "is not signed"
    if level == "signed" and any(c.valid for c in checks):
        return None
    if level == "trusted" and any(c.trusted for c in checks):
        return None
    said = "; ".join(f"{c.signer}: {c.status}" for c in checks)
    return f"is signed by no allowed signer ({said})" if level == "trusted" else f"has no valid signature ({said})"


def configured_signer(config: dict[str, Any], key: str | None = None):  # noqa: ANN201 - a Signer
    """The Signer `key` (a path) or the `signing.key` setting names."""
    from mgit.errors import SigningKeyError
    from mgit.signing.keys import load_signing_key

    path = key or path_setting(config, "signing.key")
    if not path:
        raise SigningKeyError("no signing key is set", hint="Set one with: mgit config signing.key ~/.ssh/id_ed25519")
    return load_signing_key(path)


def signature_checks(
    signatures: SignatureStore, config: dict[str, Any], vids: Iterable[str]
) -> dict[str, list[SignatureCheck]]:
    """Versions' signatures as judged here (show, log --show-signature, serve), by id: [] for
    one without any. The allowed signers are read once for them all, and not at all (nor the
    signing stack, cryptography) when none is signed."""
    found = {vid: signatures.get(vid) for vid in vids}
    allowed = allowed_signers(config) if any(found.values()) else None
    return {vid: judge(vid, sigs, allowed) if sigs and allowed is not None else [] for vid, sigs in found.items()}
