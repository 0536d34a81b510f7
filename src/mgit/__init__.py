"""MGit: version and manage families of machine-learning models.

    >>> import mgit
    >>> repo = mgit.Repo.init("models")
    >>> repo.add("bert-base/", name="bert-base")
    >>> repo.add("bert-sst2/", name="bert-sst2", parent="bert-base", relation="finetune")
    >>> repo.checkout("bert-sst2", "out/")
"""

from mgit.errors import (
    CorruptObjectError,
    InputError,
    LockTimeoutError,
    MgitError,
    MissingObjectError,
    RepoNotFoundError,
    UnknownRefError,
)
from mgit.reader import ModelReader
from mgit.repo import Repo

__version__ = "0.1.0"

__all__ = [
    "CorruptObjectError",
    "InputError",
    "LockTimeoutError",
    "MgitError",
    "MissingObjectError",
    "ModelReader",
    "Repo",
    "RepoNotFoundError",
    "UnknownRefError",
    "__version__",
]
