"""Whose signatures are trusted: an allowed-signers file as `ssh-keygen -Y verify -f` and
git's `gpg.ssh.allowedSignersFile` read it, and revoked keys as `ssh-keygen -Y verify -r`
reads a plain list of them.

    # principals     options                                         key
    alice@example.com ssh-ed25519 AAAA...
    bob@example.com,ci namespaces="mgit-version",valid-before="20270101Z" ecdsa-sha2-nistp256 AAAA...
    @revoked ssh-ed25519 AAAA...      (MGit's own marker; ssh-keygen keeps these in -r's file)

Principals are comma-separated patterns (`*`, `?`, `!` to exclude) and name who signed;
`namespaces=` limits what a key may sign for; `valid-after=`/`valid-before=` (YYYYMMDD,
YYYYMMDDHHMM or YYYYMMDDHHMMSS, with a trailing Z for UTC, else local time) bound when, and
are judged at the time of verifying, as ssh-keygen does by default. `cert-authority` lines
are refused by name: MGit verifies plain keys, not SSH certificates."""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from mgit.errors import SignatureError, SigningKeyError
from mgit.signing.keys import KEY_TYPES, PublicKey
from mgit.signing.sshsig import SshSignature

MAX_FILE = 4 << 20


@dataclass(frozen=True)
class AllowedKey:
    principals: tuple[str, ...]
    key: PublicKey
    namespaces: tuple[str, ...] | None
    valid_after: datetime | None
    valid_before: datetime | None


@dataclass(frozen=True)
class Judgement:
    """What the allowed signers say of one signature's key: `trusted`, or why not
    (`unknown key`, `revoked`, `expired`, `not yet valid`, `not allowed for NAMESPACE`),
    and the principals it names (the signer, as people know them)."""

    status: str
    principals: tuple[str, ...] = ()

    @property
    def trusted(self) -> bool:
        return self.status == "trusted"


class LineError(Exception):
    """A line of an allowed-signers file that does not read; `load` names the file and line."""


def _tokens(line: str) -> list[str]:
    """Whitespace-separated fields; double quotes keep spaces in a field."""
    out, cur, quoted = [], [], False
    for ch in line:
        if ch == '"':
            quoted = not quoted
            cur.append(ch)
        elif ch.isspace() and not quoted:
            if cur:
                out.append("".join(cur))
                cur = []
        else:
            cur.append(ch)
    if quoted:
        raise LineError("an unterminated quote")
    if cur:
        out.append("".join(cur))
    return out


def _split_options(text: str) -> list[str]:
    out, cur, quoted = [], [], False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [o for o in out if o]


def _time(value: str) -> datetime:
    utc = value.endswith(("Z", "z"))
    digits = value.rstrip("Zz")
    formats = {8: "%Y%m%d", 12: "%Y%m%d%H%M", 14: "%Y%m%d%H%M%S"}
    if len(digits) not in formats or not digits.isdigit():
        raise LineError(f"a time that is not YYYYMMDD[HHMM[SS]][Z]: {value!r}")
    parsed = datetime.strptime(digits, formats[len(digits)])
    return parsed.replace(tzinfo=UTC) if utc else parsed.astimezone()


def _unquote(value: str) -> str:
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value


def parse_line(line: str) -> AllowedKey | PublicKey | None:
    """One line: an AllowedKey, a PublicKey for an `@revoked` line, None for a blank or a
    comment; raises LineError saying what is wrong."""
    fields = _tokens(line.strip())
    if not fields or fields[0].startswith("#"):
        return None
    if fields[0] == "@revoked":
        return PublicKey.from_line(" ".join(fields[1:3]))
    if len(fields) < 3:
        raise LineError("expected: principals [options] key-type base64-key")
    principals = tuple(p for p in _unquote(fields[0]).split(",") if p)
    options: list[str] = []
    rest = fields[1:]
    if rest[0] not in KEY_TYPES:
        options, rest = _split_options(rest[0]), rest[1:]
    if not rest or rest[0] not in KEY_TYPES:
        kind = rest[0] if rest else ""
        raise LineError(f"key type {kind!r} is not supported (ed25519 or ecdsa)")
    key = PublicKey.from_line(" ".join(rest[:2]))
    namespaces = after = before = None
    for option in options:
        name, _, value = option.partition("=")
        name, value = name.lower(), _unquote(value)
        if name == "cert-authority":
            raise LineError("cert-authority keys (SSH certificates) are not supported; list the signers' own keys")
        if name == "namespaces":
            namespaces = tuple(n for n in value.split(",") if n)
        elif name == "valid-after":
            after = _time(value)
        elif name == "valid-before":
            before = _time(value)
        else:
            raise LineError(f"unknown option {name!r}")
    return AllowedKey(principals, key, namespaces, after, before)


def _matches(patterns: tuple[str, ...], value: str) -> bool:
    """ssh's pattern lists: a match on a negated pattern (`!x`) refuses outright."""
    found = False
    for pattern in patterns:
        if pattern.startswith("!"):
            if fnmatch.fnmatchcase(value, pattern[1:]):
                return False
        elif fnmatch.fnmatchcase(value, pattern):
            found = True
    return found


class AllowedSigners:
    """The keys trusted to sign (with their principals and limits), and the keys revoked."""

    def __init__(self, keys: list[AllowedKey], revoked: set[bytes]) -> None:
        self.keys = keys
        self.revoked = revoked

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None, revoked: str | os.PathLike[str] | None = None) -> AllowedSigners:
        """From the files `verify.allowed-signers` and `verify.revoked` name (either may be
        None: nobody is trusted, nothing is revoked)."""
        keys, gone = [], set()
        for file, is_revoked_list in ((path, False), (revoked, True)):
            if file is None:
                continue
            for number, line in enumerate(_read(Path(file).expanduser()), 1):
                if is_revoked_list and (not line.strip() or line.lstrip().startswith("#")):
                    continue
                try:
                    entry = PublicKey.from_line(line) if is_revoked_list else parse_line(line)
                except (LineError, ValueError, SignatureError) as exc:
                    what = exc.message if isinstance(exc, SignatureError) else str(exc)
                    raise SigningKeyError(f"{file}, line {number}: {what}") from None
                if isinstance(entry, PublicKey):
                    gone.add(entry.blob)
                elif entry is not None:
                    keys.append(entry)
        return cls(keys, gone)

    def judge(self, sig: SshSignature, *, now: datetime | None = None) -> Judgement:
        """What this signature's key is here, for its namespace, now."""
        return self.judge_key(sig.public, sig.namespace, now=now)

    def judge_key(self, key: PublicKey, namespace: str | None, *, now: datetime | None = None) -> Judgement:
        """What `key` is here now, for signing in `namespace` (None: a format with no
        namespace, such as an OpenSSF model signature, where `namespaces=` does not apply)."""
        now = now or datetime.now(UTC)
        if key.blob in self.revoked:
            return Judgement("revoked", self._principals(key))
        mine = [k for k in self.keys if k.key.blob == key.blob]
        if not mine:
            return Judgement("unknown key")
        why = "unknown key"
        for entry in mine:
            if namespace is not None and entry.namespaces is not None and not _matches(entry.namespaces, namespace):
                why = f"not allowed for {namespace}"
            elif entry.valid_after is not None and now < entry.valid_after:
                why = "not yet valid"
            elif entry.valid_before is not None and now >= entry.valid_before:
                why = "expired"
            else:
                return Judgement("trusted", entry.principals)
        return Judgement(why, self._principals(key))

    def _principals(self, key: PublicKey) -> tuple[str, ...]:
        return tuple(p for k in self.keys if k.key.blob == key.blob for p in k.principals)


def _read(path: Path) -> list[str]:
    try:
        if path.stat().st_size > MAX_FILE:
            raise SigningKeyError(f"{path} is too large to be an allowed-signers file")
        return path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise SigningKeyError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SigningKeyError(f"{path} is not UTF-8 text") from None
