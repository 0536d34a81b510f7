"""MGit's exceptions: one root, specific subclasses that carry what is at fault and a hint.

The CLI turns any `MgitError` into one line (`Error: <message>. <hint>`) and exit code 1, so
every message here is written for a user: it names the object, model or file at fault and,
where there is one, the next step to take.

Over 500 lines, not split: this is the one place a user looks for what MGit can raise
(`mgit.errors`, re-exported by `mgit`), and the classes share nothing but the root; split by
subsystem, they would be found only by grepping. Each class is a few lines, roughly in the
order a user meets them: the repository and names, objects, user code and tests, checkout and
disk, the catalog and refs, remotes and what a fetch received, then mgit serve.
"""

from __future__ import annotations


class MgitError(Exception):
    """Root of every error MGit raises on purpose."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}. {self.hint}"


class RepoNotFoundError(MgitError):
    """No `.mgit/` folder in the given folder or any of its parents."""

    def __init__(self, start: str) -> None:
        super().__init__(
            f"not an mgit repository (or any parent up to /): {start}",
            hint="Create one with: mgit init",
        )
        self.start = start


class RepoExistsError(MgitError):
    def __init__(self, path: str) -> None:
        super().__init__(
            f"a repository already exists at {path}", hint="Use it as it is (see: mgit ls), or init another folder"
        )
        self.path = path


class FormatVersionError(MgitError):
    """The repository or an object was written by a newer MGit."""


class InvalidNameError(MgitError):
    def __init__(self, name: str, why: str) -> None:
        super().__init__(
            f"invalid model name {name!r}: {why}",
            hint="Use letters, digits, '.', '_', '-' and at most one '/' (like org/model)",
        )
        self.name = name


class ModelNameConflictError(MgitError):
    """A model name under another model's name, or above one: names are lists of path
    segments, and a name cannot be a model and a folder of models at once (`x` and `x/y`)."""

    def __init__(self, name: str, other: str, *, where: str | None = None) -> None:
        on = f" on {where}" if where else ""
        if other.startswith(f"{name}/"):
            message = f"model name {name!r} has models under it ({other!r}{on})"
        else:
            message = f"model name {name!r} is under the model {other!r}{on}"
        super().__init__(message, hint="A name cannot be both a model and a folder of models; choose another")
        self.name = name
        self.other = other


class UnknownRefError(MgitError):
    """A model name, version number or id prefix that matches nothing (or several things)."""

    def __init__(self, ref: str, why: str = "no model or version", *, hint: str | None = None) -> None:
        super().__init__(f"{why} named {ref!r}", hint=hint or "See: mgit ls")
        self.ref = ref


class RemovedVersionError(UnknownRefError):
    """`NAME@N` of a version `mgit rm` removed: its number is never given to another version."""

    def __init__(self, ref: str, name: str, vid: str | None = None) -> None:
        MgitError.__init__(
            self,
            f"{ref} was removed" + (f" (version {vid[:12]}, kept while other versions build on it)" if vid else ""),
            hint=f"See: mgit log {name}",
        )
        self.ref = ref
        self.version = vid


class RenamedModelError(UnknownRefError):
    """A model name that `mgit rename` moved to another (and that nothing re-used since)."""

    def __init__(self, ref: str, old: str, new: str) -> None:
        MgitError.__init__(
            self,
            f"no model named {old!r}; it was renamed to {new!r}",
            hint=f"Use {new}{ref[len(old) :]}, or add a model named {old} to use the name again",
        )
        self.ref = ref
        self.new = new


class AmbiguousTensorError(MgitError):
    def __init__(self, name: str) -> None:
        super().__init__(
            f"tensor {name!r} appears in two files of this version", hint="Read it per file with repo.manifest(ref)"
        )
        self.name = name


class InputError(MgitError):
    """A file or folder given to MGit cannot be read as a model (malformed, unsafe, unreadable)."""

    def __init__(self, path: str, why: str, *, hint: str | None = None) -> None:
        super().__init__(f"{path}: {why}", hint=hint)
        self.path = path


class GgufFormatError(InputError):
    """A file is not a valid GGUF file (as opposed to one that cannot be read at all): given on
    its own it is refused; inside a folder it is kept as an opaque file."""


class MissingDependencyError(MgitError):
    def __init__(self, package: str, purpose: str, extra: str) -> None:
        super().__init__(
            f"{purpose} needs the '{package}' package, which is not installed",
            hint=f"Install it with: pip install 'mgit-models[{extra}]'",
        )
        self.package = package


class CorruptObjectError(MgitError):
    """A stored object does not decode to the content its id names, or cannot be parsed."""

    def __init__(self, oid: str, why: str, *, used_by: list[str] | None = None) -> None:
        users = f" (used by {', '.join(used_by)})" if used_by else ""
        super().__init__(
            f"object {oid[:16]} is corrupt: {why}{users}",
            hint="Run: mgit fsck, then restore the object from a copy of the repository",
        )
        self.oid = oid
        self.why = why
        self.used_by = used_by or []

    def name_users(self, users: list[str]) -> None:
        """Say which versions use the object at fault."""
        self.used_by = users
        self.message += f" (used by {', '.join(users)})"


class MissingObjectError(MgitError):
    def __init__(self, oid: str, *, used_by: list[str] | None = None) -> None:
        users = f" (used by {', '.join(used_by)})" if used_by else ""
        super().__init__(
            f"object {oid[:16]} is missing from the repository{users}",
            hint="Run: mgit fsck, then restore the object from a copy of the repository",
        )
        self.oid = oid
        self.used_by = used_by or []

    def name_users(self, users: list[str]) -> None:
        """Say which versions use the object at fault."""
        self.used_by = users
        self.message += f" (used by {', '.join(users)})"


class RemoveRefusedError(MgitError):
    """A model that other models were built on, removed without --force."""

    def __init__(self, name: str, children: list[str]) -> None:
        shown = ", ".join(children[:8]) + (f" and {len(children) - 8} more" if len(children) > 8 else "")
        super().__init__(
            f"{name} has {len(children)} model{'s' if len(children) != 1 else ''} built on it: {shown}",
            hint=f"Their lineage keeps the versions they were built on either way; to remove {name}'s "
            f"ref anyway: mgit rm {name} --force",
        )
        self.name = name
        self.children = children


class VersionRemoveRefusedError(RemoveRefusedError):
    """One version (`mgit rm NAME@N`) that other versions derive from, removed without --force."""

    def __init__(self, ref: str, users: list[str]) -> None:
        shown = ", ".join(users[:8]) + (f" and {len(users) - 8} more" if len(users) > 8 else "")
        MgitError.__init__(
            self,
            f"{ref} has {len(users)} version{'s' if len(users) != 1 else ''} built on it: {shown}",
            hint=f"They keep it (and its objects) either way; to remove {ref} from its model anyway: "
            f"mgit rm {ref} --force",
        )
        self.name = ref
        self.children = users


class CodecError(MgitError):
    """A codec chain that cannot be parsed or whose data does not decode."""


class DequantizeError(MgitError):
    """Packed quantized tensors that cannot be turned back into floats: their shapes, dtypes
    or config do not fit the layout they claim (a forged or damaged quantized model)."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"cannot dequantize {name}: {why}")
        self.name = name
        self.why = why


class LockTimeoutError(MgitError):
    """Another process holds a lock for longer than we wait. Retrying later is safe."""

    def __init__(self, what: str, waited: float) -> None:
        super().__init__(
            f"another mgit process is still writing {what} (waited {waited:.0f}s)",
            hint="Nothing was changed; try again when it has finished",
        )
        self.what = what


class RefConflictError(MgitError):
    """A compare-and-swap on a ref found another value than expected."""

    def __init__(self, name: str, expected: str | None, found: str | None) -> None:
        super().__init__(
            f"model {name!r} moved while updating it (expected {str(expected)[:12]}, found {str(found)[:12]})",
            hint="Nothing was changed; try again",
        )
        self.name = name


class TagConflictError(MgitError):
    """Tags of a version changed by another writer (here or on a remote) while changing them."""

    def __init__(self, ref: str, where: str = "") -> None:
        super().__init__(
            f"the tags of {ref} changed{' on ' + where if where else ''} while updating them",
            hint=f"Nothing was changed; see them with: mgit tag {ref}, then try again"
            if not where
            else f"Nothing was changed there; run: mgit pull {where}, then push again",
        )
        self.ref = ref


class UnsafePathError(MgitError):
    """A stored or given path would escape the folder it belongs to."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"refusing path {path!r}: {why}")
        self.path = path


class UntrustedCodeError(MgitError):
    """A command would run user code that came from a remote (a pulled test registration,
    the recipe of a fetched version) and was not told to trust it."""

    def __init__(self, what: list[str], *, flag: str = "--trust-remote-code") -> None:
        super().__init__(
            f"this would run code that came from a remote: {', '.join(what)}; nothing was run",
            hint=f"Read it, then run again with {flag} (in Python: trust_remote_code=True), or set "
            '"trust-remote-code": true in .mgit/config.json to trust every remote',
        )
        self.what = what


class UserCodeError(MgitError):
    """A function reference that does not name a function MGit can find."""

    def __init__(self, spec: str, why: str) -> None:
        super().__init__(
            f"cannot use {spec!r}: {why}", hint="Give MODULE:FUNCTION (importable from this folder) or FILE.py:FUNCTION"
        )
        self.spec = spec


class UnsafeRegistrationError(MgitError):
    """A test registration in checks.sqlite whose function reference MGit will not use (one
    written by hand, or by an older MGit that did not check references)."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"test {name!r} in checks.sqlite: {why}", hint=f"Remove it: mgit test rm {name}")
        self.name = name


class CheckNotFoundError(MgitError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no test named {name!r}", hint="See: mgit test ls")
        self.name = name


class CheckExistsError(MgitError):
    def __init__(self, name: str) -> None:
        super().__init__(f"a test named {name!r} exists", hint=f"Choose another --name or: mgit test rm {name}")
        self.name = name


class NothingToBisectError(MgitError):
    def __init__(self, test: str, ref: str, start_ref: str) -> None:
        super().__init__(
            f"{test} passes on {ref}: there is no failure to trace",
            hint=f"Bisect from a version that fails. See: mgit test show {start_ref}",
        )
        self.test = test


class InvalidJobError(MgitError):
    """A recipe or test job that a cluster node was handed does not hold to the job contract
    (mgit.execution): a forged or damaged spec, refused before anything is done with it."""

    def __init__(self, kind: str, why: str) -> None:
        super().__init__(
            f"refusing a forged {kind} job: {why}", hint="Nothing was run; check who can submit to the cluster"
        )
        self.why = why


class ClusterError(MgitError):
    """Ray is missing, or the cluster cannot be reached."""


class OutputNotEmptyError(MgitError):
    def __init__(self, path: str) -> None:
        super().__init__(f"output folder {path} is not empty", hint="Use --force to write into it")
        self.path = path


class StrayFilesError(MgitError):
    """A forced checkout into a folder holding files the version does not: the folder would not
    be the version."""

    def __init__(self, path: str, ref: str, strays: list[str]) -> None:
        shown = ", ".join(strays[:5]) + (f" and {len(strays) - 5} more" if len(strays) > 5 else "")
        super().__init__(
            f"{path} holds {len(strays)} file{'s' if len(strays) != 1 else ''} that {ref} does not: {shown}",
            hint=f"Add --clean to remove them (the folder then holds exactly {ref}), or check out into an empty folder",
        )
        self.path = path
        self.strays = strays


class ModelSignatureError(MgitError):
    """An OpenSSF model signature (`model.sig`, the `model-signing` package's format) that cannot
    be made or does not hold: a folder whose files it does not match, a key not allowed, a file
    that is not a signature. Nothing is written."""

    def __init__(self, path: str, why: str, *, hint: str | None = None) -> None:
        super().__init__(f"{path}: {why}", hint=hint)
        self.path = path


class StorageFullError(MgitError):
    def __init__(self, path: str) -> None:
        super().__init__(
            f"no space left on the device while writing {path}; nothing was committed",
            hint="Free some space and run the command again (mgit gc removes the partial objects)",
        )
        self.path = path


class InvalidOptionError(MgitError):
    """Options or arguments of a verb that cannot go together or are out of range (the CLI
    checks what it can before calling; this is what the library checks)."""


class RepoConfigError(MgitError):
    def __init__(self, path: str, why: str) -> None:
        super().__init__(
            f"unreadable repository config {path} ({why})", hint="Restore config.json from a copy of the repository"
        )
        self.path = path


class DamagedRefError(MgitError):
    """A ref file that does not hold a version id."""

    def __init__(self, name: str, value: str) -> None:
        super().__init__(f"the head of model {name!r} is damaged ({value[:20]!r})", hint="Run: mgit fsck")
        self.name = name


class CatalogError(MgitError):
    """The catalog disagrees with the objects it indexes (it is derived: rebuild it)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, hint="Run: mgit fsck --rebuild-catalog")


class ChecksumMismatchError(MgitError):
    """A file rebuilt from objects that does not match the digest recorded when it was added."""

    def __init__(self, path: str, version: str | None = None) -> None:
        of = f" of version {version[:12]}" if version else ""
        super().__init__(
            f"rebuilt {path}{of} does not match the digest recorded at add time",
            hint="Nothing was written; run: mgit fsck",
        )
        self.path = path


class GcRefusedError(MgitError):
    """gc will not run on a repository where something reachable is damaged: what it would
    delete could be what a repair needs."""

    def __init__(self, oid: str, kind: str) -> None:
        super().__init__(
            f"cannot collect garbage: object {oid[:16]} is {kind}",
            hint="Run: mgit fsck, and repair the repository first",
        )
        self.oid = oid


class NoMatchError(MgitError):
    """A selection of models (a glob, a tag, a relation) that matches none."""

    def __init__(self, asked: str | None) -> None:
        if asked is None:
            super().__init__("no models yet", hint="Add one with: mgit add PATH --name NAME")
        else:
            super().__init__(f"no model matches {asked}", hint="See: mgit ls")
        self.asked = asked


class NoPathError(MgitError):
    def __init__(self, a: str, b: str) -> None:
        super().__init__(f"{a!r} and {b!r} are not related by lineage", hint=f"See: mgit lineage {a}")
        self.a = a
        self.b = b


class RemoteError(MgitError):
    """Something about a remote: unreachable, refused, missing, or not what it claims."""


class RemoteNotFoundError(RemoteError):
    """The remote (a folder, a bucket, a prefix laid out by `mgit init --bare`) is not there."""


class RemoteAuthError(RemoteError):
    """Credentials missing or refused; the hint names the chain they come from (AWS's unless
    the backend says which)."""

    def __init__(self, url: str, why: str, *, hint: str | None = None) -> None:
        super().__init__(
            f"{url}: {why}",
            hint=hint
            or "Credentials come from the standard AWS chain: AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, ~/.aws/credentials, or --profile",
        )
        self.url = url


class RemoteUnavailableError(RemoteError):
    """The remote kept failing (dropped connections, 5xx, SlowDown) after every retry."""

    def __init__(self, url: str, why: str) -> None:
        super().__init__(
            f"{url} did not answer: {why}",
            hint="Nothing was changed on either side that a re-run does not finish; try again",
        )
        self.url = url


class RemoteConflictError(RemoteError):
    """A conditional write on a remote found another value than expected (compare-and-swap)."""

    def __init__(self, url: str, key: str) -> None:
        super().__init__(f"{key} on {url} changed while it was being updated", hint="Nothing was changed; try again")
        self.url = url
        self.key = key


class DeleteRefusedError(RemoteError):
    """`push --delete`/`--prune`: the remote's model is not where this repository last saw it
    (a push landed meanwhile, and wins), or is not there at all."""

    def __init__(self, model: str, remote: str, why: str) -> None:
        super().__init__(
            f"not deleting {model} on {remote}: {why}",
            hint=f"Nothing was deleted; see what is there: mgit remote show {remote}",
        )
        self.model = model
        self.remote = remote


class RemoteTooLargeError(RemoteError):
    """A remote key holds more bytes than what it should hold can be."""

    def __init__(self, url: str, key: str, size: int, limit: int) -> None:
        super().__init__(
            f"{key} on {url} holds {size} bytes, more than the {limit} it can legitimately hold",
            hint="The remote is damaged or hostile; nothing of it was kept",
        )
        self.url = url
        self.key = key


class PushRefusedError(RemoteError):
    """The remote's head is not an ancestor of what would be pushed (without --force)."""

    def __init__(self, model: str, remote: str, theirs: str, others: int) -> None:
        more = f" (and {others} more model{'s' if others > 1 else ''})" if others else ""
        super().__init__(
            f"{model} on {remote} has {theirs} that you do not have{more}",
            hint=f"Run: mgit pull {remote} (or push --force to drop it)",
        )
        self.model = model


class DivergedError(RemoteError):
    def __init__(self, model: str, remote: str, others: int) -> None:
        more = f" (and {others} more model{'s' if others > 1 else ''})" if others else ""
        super().__init__(
            f"{model} has versions here and on {remote} that the other side lacks{more}",
            hint=f"Run: mgit pull {remote} without --ff-only to replay yours after theirs",
        )
        self.model = model


UNCHANGED = "nothing was kept, the local repository is unchanged"


class ReceivedError(RemoteError):
    """Something a remote sent that a fetch, clone, pull or lazy read refused: the message
    names the remote (`where`), and nothing of what arrived was kept."""

    def __init__(self, message: str, *, where: str) -> None:
        MgitError.__init__(self, f"{message}; {UNCHANGED}", hint=f"Tell the remote's owner; run: mgit fsck {where}")
        self.what = message
        self.where = where

    def name_users(self, users: list[str]) -> None:
        """Say which versions use the object at fault (before what was kept)."""
        self.used_by = users
        self.message = f"{self.what} (used by {', '.join(users)}); {UNCHANGED}"


class ReceivedCorruptError(ReceivedError, CorruptObjectError):
    """An object a remote sent that does not verify against its id (or does not parse)."""

    def __init__(self, oid: str, why: str, *, where: str) -> None:
        ReceivedError.__init__(self, f"object {oid[:16]} from {where} is corrupt ({why})", where=where)
        self.oid = oid
        self.why = why
        self.used_by = []


class ReceivedMissingError(ReceivedError, MissingObjectError):
    """An object a remote's records need that the remote does not hold."""

    def __init__(self, oid: str, *, where: str, used_by: list[str] | None = None) -> None:
        users = f" (used by {', '.join(used_by)})" if used_by else ""
        ReceivedError.__init__(self, f"object {oid[:16]} is missing from {where}{users}", where=where)
        self.oid = oid
        self.used_by = used_by or []


class NotFetchedError(RemoteError, MissingObjectError):
    """An object a lazy clone has not fetched yet, while its remote cannot be reached: nothing
    here is damaged."""

    def __init__(self, oid: str, *, where: str, why: str, used_by: list[str] | None = None) -> None:
        RemoteError.__init__(
            self,
            "",
            hint="Nothing here is damaged: reconnect (or fix the remote's URL: mgit remote "
            "ls) and retry; mgit fetch --objects REF brings a model's objects for "
            "work offline",
        )
        self.oid, self.where, self.why = oid, where, why
        self.name_users(used_by or [])

    def name_users(self, users: list[str]) -> None:
        self.used_by = users
        named = f" (used by {', '.join(users)})" if users else ""
        self.message = (
            f"object {self.oid[:16]}{named} is not fetched yet, and the remote {self.where} cannot be "
            f"reached: {self.why}"
        )
        self.args = (self.message,)


class MissingKeyError(RemoteError):
    def __init__(self, url: str, key: str) -> None:
        super().__init__(f"{key} is missing from {url}", hint="Run: mgit fsck on the remote")
        self.url = url
        self.key = key


class RemoteEntryError(RemoteError):
    """Something in a folder remote that MGit neither reads nor writes through: a link (it
    could lead out of the remote), a FIFO or a device (a read would block), a socket."""

    def __init__(self, url: str, key: str, what: str, expected: str = "a regular file or folder") -> None:
        super().__init__(
            f"{key} on {url} is {what}, not {expected}",
            hint="The remote is damaged or hostile: MGit reads and writes only the files and "
            "folders inside it; nothing was kept",
        )
        self.url = url
        self.key = key


class BadParameterError(MgitError):
    """A query parameter out of its range or not among its choices (HTTP 400)."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"query parameter {name!r}: {why}", hint="Follow the links of the pages")
        self.name = name


class DiffsBusyError(MgitError):
    """The web app's diff pages: as many diffs asked for as it computes at once (HTTP 503)."""

    def __init__(self, waiting: int) -> None:
        super().__init__(f"{waiting} diffs are being computed already", hint="Try again when one has finished")
        self.waiting = waiting


class TokenRequiredError(MgitError):
    """`mgit serve` on an address other machines reach, without a token."""

    def __init__(self, host: str) -> None:
        super().__init__(
            f"serving on {host} needs a token", hint="Give --token, or let mgit serve make one (it prints it once)"
        )
        self.host = host


class SignatureError(MgitError):
    """A signature that does not parse (truncated, malformed, oversized) or does not verify:
    the message says which and why; a hint says what to check."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint or "See: mgit verify --help")


class SigningKeyError(MgitError):
    """A signing key that cannot be read or used (missing, encrypted, a kind not supported,
    an agent that refuses), or a file of allowed signers that does not parse."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint or "See: mgit config signing.key; mgit config verify.allowed-signers")


class UnverifiedVersionError(MgitError):
    """A version the policy (`verify.require signed|trusted`) refuses: unsigned, or signed by
    no allowed signer. Names the version and the signer(s) found."""

    def __init__(self, label: str, why: str, *, kept: bool = True) -> None:
        tail = "" if kept else f"; {UNCHANGED}"
        super().__init__(
            f"version {label} {why}{tail}",
            hint="Check verify.allowed-signers, or override once with --no-verify",
        )
        self.label = label
        self.why = why
