"""Names, ids and keys end where they end: a pattern's `$` also matches before a final
newline, so every check of a name or id read from a user, a file or a remote must refuse
one that carries it (a ref file named "bert\\n", an id with a newline passed on)."""

from __future__ import annotations

import pytest

from mgit.errors import InvalidNameError, RemoteError
from mgit.index.refs import validate_model_name
from mgit.remotes.base import check_key
from mgit.remotes.config import REMOTE_NAME_RE
from mgit.store.objects import OID_RE, RecordError

OID = "ab" * 32


def test_an_object_id_with_a_newline_is_not_an_id() -> None:
    from mgit.codecs.base import OID_RE as CODEC_OID_RE

    assert OID_RE.match(OID) and CODEC_OID_RE.match(OID)
    assert not OID_RE.match(OID + "\n") and not CODEC_OID_RE.match(OID + "\n")


@pytest.mark.parametrize("name", ["bert\n", "org/bert\n"])
def test_a_model_name_with_a_newline_is_refused(name: str) -> None:
    with pytest.raises(InvalidNameError):
        validate_model_name(name)


def test_a_remote_key_and_name_with_a_newline_are_refused() -> None:
    with pytest.raises(RemoteError):
        check_key("objects/ab/cd\n")
    assert not REMOTE_NAME_RE.match("origin\n")


def test_a_version_record_with_a_newline_in_its_model_or_time_is_refused() -> None:
    from mgit.store.objects import Version

    good = {
        "format": 1,
        "model": "bert",
        "manifest": OID,
        "parents": [],
        "predecessor": None,
        "message": "",
        "author": "a",
        "time": "2026-01-01T00:00:00Z",
        "tags": {},
        "recipe": None,
        "lossy": None,
        "summary": {"files": 1, "tensors": 1, "params": 1, "logical_bytes": 4},
    }
    assert Version.from_json(good).model == "bert"
    for field, value in (("model", "bert\n"), ("time", "2026-01-01T00:00:00Z\n"), ("manifest", OID + "\n")):
        with pytest.raises(RecordError):
            Version.from_json({**good, field: value})
