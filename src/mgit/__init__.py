"""MGit: version and manage families of machine-learning models.

    >>> import mgit
    >>> repo = mgit.Repo.init("models")
    >>> repo.add("bert-base/", name="bert-base")
    >>> repo.add("bert-sst2/", name="bert-sst2", parent="bert-base", relation="finetune")
    >>> repo.checkout("bert-sst2", "out/")
    >>> state_dict = mgit.load("bert-sst2")               # torch tensors, straight from the store

The names below are imported on first use, so that `import mgit.usercode` (the child
process that runs a user's test or recipe) and a command that needs no tensors do not load
the whole library and numpy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "AmbiguousTensorError",
    "BadParameterError",
    "CatalogError",
    "CheckExistsError",
    "CheckNotFoundError",
    "ChecksumMismatchError",
    "ClusterError",
    "CodecError",
    "CorruptObjectError",
    "DamagedRefError",
    "DeleteRefusedError",
    "DequantizeError",
    "DiffsBusyError",
    "DivergedError",
    "FormatVersionError",
    "GcRefusedError",
    "GgufFormatError",
    "InputError",
    "InvalidJobError",
    "InvalidNameError",
    "InvalidOptionError",
    "LockTimeoutError",
    "MgitError",
    "MissingDependencyError",
    "MissingKeyError",
    "MissingObjectError",
    "ModelNameConflictError",
    "ModelSignatureError",
    "ModelReader",
    "NoMatchError",
    "NoPathError",
    "NotFetchedError",
    "NothingToBisectError",
    "OutputNotEmptyError",
    "PushRefusedError",
    "ReceivedCorruptError",
    "ReceivedError",
    "ReceivedMissingError",
    "RefConflictError",
    "RemoteAuthError",
    "RemoteConflictError",
    "RemoteEntryError",
    "RemoteError",
    "RemoteNotFoundError",
    "RemoteTooLargeError",
    "RemoteUnavailableError",
    "RemoveRefusedError",
    "RemovedVersionError",
    "RenamedModelError",
    "Repo",
    "RepoConfigError",
    "RepoExistsError",
    "RepoNotFoundError",
    "SignatureError",
    "SigningKeyError",
    "StorageFullError",
    "StrayFilesError",
    "TagConflictError",
    "TokenRequiredError",
    "UnknownRefError",
    "UnsafePathError",
    "UnsafeRegistrationError",
    "UntrustedCodeError",
    "UnverifiedVersionError",
    "UserCodeError",
    "VersionRemoveRefusedError",
    "__version__",
    "load",
    "load_many",
    "load_pretrained",
]

_LAZY = {
    "Repo": "mgit.repo.repository",
    "ModelReader": "mgit.store.reader",
    "load": "mgit.loading",
    "load_many": "mgit.loading",
    "load_pretrained": "mgit.loading",
}
# Every exception of mgit.errors, where users look for it: `except mgit.PushRefusedError`.
_LAZY.update((name, "mgit.errors") for name in __all__ if name.endswith("Error"))

if TYPE_CHECKING:
    from mgit.errors import (
        AmbiguousTensorError,
        BadParameterError,
        CatalogError,
        CheckExistsError,
        CheckNotFoundError,
        ChecksumMismatchError,
        ClusterError,
        CodecError,
        CorruptObjectError,
        DamagedRefError,
        DeleteRefusedError,
        DequantizeError,
        DiffsBusyError,
        DivergedError,
        FormatVersionError,
        GcRefusedError,
        GgufFormatError,
        InputError,
        InvalidJobError,
        InvalidNameError,
        InvalidOptionError,
        LockTimeoutError,
        MgitError,
        MissingDependencyError,
        MissingKeyError,
        MissingObjectError,
        ModelNameConflictError,
        ModelSignatureError,
        NoMatchError,
        NoPathError,
        NotFetchedError,
        NothingToBisectError,
        OutputNotEmptyError,
        PushRefusedError,
        ReceivedCorruptError,
        ReceivedError,
        ReceivedMissingError,
        RefConflictError,
        RemoteAuthError,
        RemoteConflictError,
        RemoteEntryError,
        RemoteError,
        RemoteNotFoundError,
        RemoteTooLargeError,
        RemoteUnavailableError,
        RemovedVersionError,
        RemoveRefusedError,
        RenamedModelError,
        RepoConfigError,
        RepoExistsError,
        RepoNotFoundError,
        SignatureError,
        SigningKeyError,
        StorageFullError,
        StrayFilesError,
        TagConflictError,
        TokenRequiredError,
        UnknownRefError,
        UnsafePathError,
        UnsafeRegistrationError,
        UntrustedCodeError,
        UnverifiedVersionError,
        UserCodeError,
        VersionRemoveRefusedError,
    )
    from mgit.loading import load, load_many, load_pretrained
    from mgit.repo.repository import Repo
    from mgit.store.reader import ModelReader


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mgit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
