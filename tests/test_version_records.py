"""Version records from anywhere (a remote, a lazy clone, a damaged disk) are validated field by
field as `add` validates its inputs: a model of `../../etc/x\\x1b[31m`, a relation nobody
knows, a tag that is a terminal escape, a time that is not a time are refused when the record
is read, and `add` refuses to write them.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import make_model, run_cli, tensors

from mgit import Repo, sync
from mgit.errors import InvalidOptionError
from mgit.index.refs import validate_model_name
from mgit.store.memory import MemoryStore
from mgit.store.objects import RecordError, Version

OID = "ab" * 32
GOOD: dict[str, Any] = {
    "format": 1,
    "model": "org/bert-sst2.v1_x",
    "manifest": OID,
    "parents": [{"version": "cd" * 32, "relation": "finetune"}, {"version": "ef" * 32, "relation": "merge"}],
    "predecessor": "01" * 32,
    "message": "SST-2, 3 epochs\n\n\tdetails",
    "author": "Ana <ana@host>",
    "time": "2026-11-30T13:49:14.413985Z",
    "tags": {"stage": "dev", "hf.repo_id": "org/name", "empty": ""},
    "summary": {"files": 13, "tensors": 104, "params": 22713728, "logical_bytes": 91651021},
    "recipe": {
        "fn": "recipes.py:finetune",
        "params": {"steps": 40, "seed": 3, "name": "x"},
        "source_sha256": "f" * 64,
        "source": OID,
        "resources": {"num_cpus": 4.0, "num_gpus": 1},
    },
    "lossy": {"eps": 0.001, "mode": "abs", "max_error": 0.00094999, "tensors": 96, "guard": 0.1},
}


def changed(path: str, value: Any) -> dict[str, Any]:
    """GOOD with the field at `path` (dot-separated; `parents.0.relation`) set to `value`,
    or removed when `value` is DROP."""
    record = copy.deepcopy(GOOD)
    *outer, last = path.split(".")
    here: Any = record
    for key in outer:
        here = here[int(key)] if isinstance(here, list) else here[key]
    if value is DROP:
        del here[last]
    elif isinstance(here, list):
        here[int(last)] = value
    else:
        here[last] = value
    return record


DROP = object()

BAD = [
    ("model", "../../etc/x\x1b[31m", "model"),
    ("model", "", "model"),
    ("model", "a" * 129, "model"),
    ("model", "a..b", "model"),
    ("model", "x.lock", "model"),
    ("model", "a/b/c", "model"),
    ("model", 3, "model"),
    ("manifest", "xyz", "manifest"),
    ("parents", {"version": OID}, "parents"),
    ("parents", [{"version": OID, "relation": "finetune"}] * 1025, "parents"),
    ("parents.0.relation", "evil", "relation"),
    ("parents.0.relation", "\x1b[31m", "relation"),
    ("parents.0.version", "../x", "parent"),
    ("parents.0.extra", 1, "parent"),
    ("predecessor", "HEAD", "predecessor"),
    ("message", "red \x1b[31m text", "message"),
    ("message", "back\rspace", "message"),
    ("message", "c1 \x9b31m", "message"),
    ("message", "x" * 65537, "message"),
    ("author", "ana\n@host", "author"),
    ("author", "\x1b]0;title\x07", "author"),
    ("author", "a" * 257, "author"),
    ("author", None, "author"),
    ("time", "t", "time"),
    ("time", "", "time"),
    ("time", "2026-13-30T13:49:14.413985Z", "time"),
    ("time", "2026-11-30 13:49:14", "time"),
    ("time", "2026-11-30T13:49:14.413985Z\x1b[31m", "time"),
    ("tags.stage", "dev\x1b[31m", "tag"),
    ("tags.stage", "dev\nnext", "tag"),
    ("tags.\x1b[31m", "x", "tag"),
    ("tags.", "x", "tag"),
    ("tags.stage", 3, "tag"),
    ("tags.stage", "v" * 1025, "tag"),
    ("tags." + "k" * 129, "v", "tag"),
    ("tags", {f"k{i}": "v" for i in range(257)}, "tags"),
    ("summary.files", -1, "summary"),
    ("summary.files", True, "summary"),
    ("summary.evil", 1, "summary"),
    ("recipe", "recipes.py:f", "recipe"),
    ("recipe.fn", DROP, "recipe"),
    ("recipe.fn", "no-function", "recipe"),
    ("recipe.fn", "recipes.py:f\x1b[31m", "recipe"),
    ("recipe.fn", "recipes.py:not an identifier", "recipe"),
    ("recipe.params", [1, 2], "recipe"),
    ("recipe.params.not-an-identifier", 1, "recipe"),
    ("recipe.source_sha256", "nope", "recipe"),
    ("recipe.source", "nope", "recipe"),
    ("recipe.resources", {"num_cpus": -1}, "recipe"),
    ("recipe.resources", {"memory": 1}, "recipe"),
    ("recipe.resources", {"num_gpus": "1"}, "recipe"),
    ("recipe.evil", 1, "recipe"),
    ("lossy", [], "lossy"),
    ("lossy.mode", "\x1b[31m", "lossy"),
    ("lossy.max_error", "big", "lossy"),
    ("lossy.eps", -1.0, "lossy"),
    ("lossy.tensors", 1.5, "lossy"),
    ("lossy.evil", 1, "lossy"),
    ("format", 2, "format"),
    ("evil", "x", "evil"),
]


def test_a_good_record_round_trips() -> None:
    assert Version.from_json(copy.deepcopy(GOOD)).to_json() == GOOD
    rel = changed("lossy", {"eps": None, "mode": "rel", "rel": 0.1, "max_error": 2.1e-07, "tensors": 36, "guard": 0.1})
    assert Version.from_json(rel).lossy == rel["lossy"]
    plain = changed("recipe", None) | {"lossy": None, "parents": [], "predecessor": None, "tags": {}, "message": ""}
    assert Version.from_json(plain).to_json() == plain
    assert Version.from_json(changed("time", "2026-11-30T13:49:14Z")).time == "2026-11-30T13:49:14Z"


@pytest.mark.parametrize(
    ("path", "value", "what"), BAD, ids=[(f"{p} dropped" if v is DROP else f"{p}={v!r}")[:60] for p, v, _ in BAD]
)
def test_a_bad_field_is_refused(path: str, value: Any, what: str) -> None:
    with pytest.raises(RecordError, match=what) as info:
        Version.from_json(changed(path, value))
    assert "\x1b" not in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "name",
    [
        "bert",
        "org/bert-sst2",
        "a" * 128,
        "a" * 129,
        "a..b",
        "x.lock",
        "x.",
        "-x",
        "a/b/c",
        "a b",
        "\u00e9",
        "a/",
        "/a",
        "x\x1b",
    ],
)
def test_the_model_rule_is_the_refs_rule(name: str) -> None:
    try:
        validate_model_name(name)
        ok = True
    except Exception:
        ok = False
    try:
        Version.from_json(changed("model", name))
        accepted = True
    except RecordError:
        accepted = False
    assert accepted == ok


def forged_remote(tmp_path: Path, record: dict[str, Any], ref: str) -> tuple[str, str]:
    """A folder remote with a good model and a version record `record` under ref `ref` (its
    manifest a real one of the good model)."""
    remote = tmp_path / "remote"
    sync.init_bare(str(remote))
    author = Repo.init(tmp_path / "author")
    sync.add_remote(author, "origin", str(remote))
    author.add(make_model(tmp_path / "good", seed=1), name="good")
    sync.push(author)
    head = author.store.get_version(author.refs.get("good"))
    forged = MemoryStore()
    vid = forged.put_record("version", record | {"manifest": head.manifest}).oid
    dest = remote / "objects" / vid[:2] / vid[2:]
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(forged.read_record(vid))
    (remote / "refs" / "models" / ref).write_text(vid + "\n")
    shutil.rmtree(tmp_path / "good")
    return str(remote), vid


def stored(repo_dir: Path) -> dict[str, list[str]]:
    root = repo_dir / ".mgit"
    return {
        sub: sorted(p.relative_to(root).as_posix() for p in (root / sub).rglob("*") if p.is_file())
        for sub in ("objects", "refs")
    }


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("model", "../../etc/x\x1b[31m"),
        ("tags.stage", "\x1b[2J"),
        ("time", "yesterday"),
        ("parents.0.relation", "evil"),
    ],
)
def test_a_fetch_refuses_a_forged_record_and_keeps_nothing(tmp_path: Path, path: str, value: Any) -> None:
    record = changed(path, value) | {"parents": [], "predecessor": None, "recipe": None, "lossy": None}
    if path.startswith("parents"):
        record["parents"] = [{"version": OID, "relation": value}]
    url, vid = forged_remote(tmp_path, record, "evil")
    bob = Repo.init(tmp_path / "bob")
    sync.add_remote(bob, "origin", url)
    before = stored(bob.root)

    code, out, err = run_cli("-C", str(bob.root), "fetch")

    assert code == 1 and out == "" and err.startswith("Error: ") and err.count("\n") == 1, (code, out, err)
    assert f"object {vid[:16]} from {url} is corrupt" in err and "not a valid version record" in err
    assert "the local repository is unchanged" in err
    assert "\x1b" not in err
    assert stored(bob.root) == before


@pytest.mark.parametrize(
    ("option", "value", "what"),
    [
        ("message", "red \x1b[31m", "message"),
        ("tags", {"stage": "\x1b[31m"}, "tag"),
        ("tags", {"a\nb": "x"}, "tag"),
        ("author", "ana\x1b[2J", "author"),
        ("message", "x" * 65537, "message"),
        ("recipe", {"fn": "recipes.py:f", "params": {}, "source_sha256": "f" * 64, "evil": 1}, "recipe"),
    ],
)
def test_add_refuses_what_a_reader_would_refuse(repo: Repo, option: str, value: Any, what: str) -> None:
    before = stored(repo.root)
    with pytest.raises(InvalidOptionError, match=what) as info:
        repo.add(tensors(1), name="m", **{option: value})
    assert "\x1b" not in str(info.value)
    assert stored(repo.root) == before


def test_add_refuses_an_author_with_an_escape_from_the_environment(repo: Repo, tmp_path: Path) -> None:
    before = stored(repo.root)
    code, out, err = run_cli(
        "-C", str(repo.root), "add", str(make_model(tmp_path / "m")), "--name", "m", env={"MGIT_AUTHOR": "eve\x1b[31m"}
    )
    assert code == 1 and err.startswith("Error: author has a control character (\\x1b)") and "\x1b" not in err, err
    assert stored(repo.root) == before


def test_add_keeps_a_multi_line_message_with_tabs(repo: Repo) -> None:
    repo.add(tensors(1), name="m", message="line one\n\tline two", tags={"stage": "dev"})
    vid = repo.refs.get("m")
    version = repo.store.get_version(vid, fresh=True)
    assert version.message == "line one\n\tline two" and version.tags == {"stage": "dev"}
