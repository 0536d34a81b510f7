"""Bad input end to end through the CLI: every kind gets one line on stderr ("Error: ...",
exit code 1, no traceback) naming what is at fault, and the repository is left untouched.

Also: PyTorch checkpoints (plain state dicts are converted, anything needing a full unpickler
is refused without running it) and checkout safety (forged paths, planted links).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import struct
from collections.abc import Callable
from pathlib import Path

import blake3
import numpy as np
import pytest
from conftest import (
    make_model,
    needs_torch,
    one_line_error,
    run_cli,
    run_mgit,
    sha256_tree,
    st_bytes,
)

from mgit import Repo
from mgit.errors import InputError
from mgit.store.objects import FileEntry, Manifest, Version

# --- helpers -------------------------------------------------------------------------------


def mgit(repo: Repo, *args: str) -> tuple[int, str, str]:
    return run_cli("-C", str(repo.root), *args)


def assert_usage_error(result: tuple[int, str, str], *fragments: str) -> None:
    rc, out, err = result
    assert rc == 2, (rc, out, err)
    assert "Error: " in err and "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def repo_state(repo: Repo) -> tuple[dict[str, str], list[dict]]:
    """Every file under objects/ and refs/ with its hash, and what `ls` shows."""
    files = {
        p.relative_to(repo.dir).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for sub in ("objects", "refs")
        for p in sorted((repo.dir / sub).rglob("*"))
        if p.is_file()
    }
    return files, [m.to_json() for m in Repo(repo.dir).ls()]


def tree(root: Path) -> dict[str, str]:
    """Every entry under `root` without following links: files by hash, links by target."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath, name)
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[rel] = "dir"
    return out


def f32(shape: list, offsets: list) -> dict:
    return {"dtype": "F32", "shape": shape, "data_offsets": offsets}


BROKEN_SAFETENSORS = [
    pytest.param(b"", "truncated safetensors file", id="empty"),
    pytest.param(b"\x10\x00", "truncated safetensors file", id="shorter-than-8"),
    pytest.param(struct.pack("<Q", 4096) + b"{}", "goes beyond the end of the file", id="header-beyond-file"),
    pytest.param(struct.pack("<Q", 2**63), "byte limit", id="header-above-limit"),
    pytest.param(st_bytes(b"{oops"), "header is not valid JSON", id="invalid-json"),
    pytest.param(st_bytes(b"[1, 2]"), "header is not a JSON object", id="json-list"),
    pytest.param(st_bytes(b'{"\xff": 1}'), "header is not valid JSON", id="not-utf8"),
    pytest.param(st_bytes(b'{"w": {}, "w": {}}'), "duplicate key 'w'", id="duplicate-keys"),
    pytest.param(
        st_bytes({"w": {"dtype": "Q8", "shape": [2], "data_offsets": [0, 2]}}, b"\0" * 2),
        "unknown dtype 'Q8'",
        id="unknown-dtype",
    ),
    pytest.param(st_bytes({"w": f32([-1], [0, 4])}, b"\0" * 4), "invalid shape [-1]", id="negative-dim"),
    pytest.param(st_bytes({"w": f32([1], [4, 0])}, b"\0" * 4), "invalid data_offsets [4, 0]", id="reversed-offsets"),
    pytest.param(st_bytes({"w": f32([2], [0, 4])}, b"\0" * 4), "needs 8", id="span-mismatch"),
    pytest.param(st_bytes({"a": f32([2], [0, 8]), "b": f32([2], [4, 12])}, b"\0" * 12), "overlaps", id="overlap"),
    pytest.param(
        st_bytes({"a": f32([1], [0, 4]), "b": f32([1], [8, 12])}, b"\0" * 12), "gap before tensor 'b'", id="gap"
    ),
    pytest.param(st_bytes({"a": f32([1], [0, 4])}, b"\0" * 9), "5 bytes after the last tensor", id="trailing"),
    pytest.param(st_bytes({"a": f32([4], [0, 16])}, b"\0" * 10), "the file is truncated", id="data-truncated"),
    pytest.param(
        st_bytes({"__metadata__": {"epoch": 1}}), "__metadata__ must map strings to strings", id="metadata-not-strings"
    ),
    pytest.param(st_bytes(b'{"a":' * 50_000), "nested too deeply", id="deeply-nested-json"),
]


@pytest.fixture
def seeded(repo: Repo, tmp_path: Path) -> Repo:
    """A repository holding one model, 'base', so that 'unchanged' has something to compare."""
    repo.add(make_model(tmp_path / "base-model", seed=0), name="base")
    return repo


# --- mgit add: files that are not valid models ----------------------------------------------


@pytest.mark.parametrize(("raw", "fragment"), BROKEN_SAFETENSORS)
def test_add_broken_safetensors_file(seeded: Repo, tmp_path: Path, raw: bytes, fragment: str) -> None:
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(raw)
    before = repo_state(seeded)

    one_line_error(mgit(seeded, "add", str(bad), "--name", "m"), str(bad), fragment)

    assert repo_state(seeded) == before


@pytest.mark.parametrize(("raw", "fragment"), BROKEN_SAFETENSORS)
def test_add_folder_with_one_broken_file_writes_nothing(
    seeded: Repo, tmp_path: Path, raw: bytes, fragment: str
) -> None:
    folder = make_model(tmp_path / "model", seed=1)  # new tensors: storing them would add objects
    (folder / "z-extra.safetensors").write_bytes(raw)
    before = repo_state(seeded)

    one_line_error(mgit(seeded, "add", str(folder), "--name", "m"), "z-extra.safetensors", fragment)

    assert repo_state(seeded) == before


def test_add_good_folder_does_write(seeded: Repo, tmp_path: Path) -> None:
    # The control for the tests above: the same folder without the broken file is stored.
    before = repo_state(seeded)

    rc, _, err = mgit(seeded, "add", str(make_model(tmp_path / "model", seed=1)), "--name", "m")

    assert rc == 0, err
    assert repo_state(seeded) != before


@pytest.mark.parametrize("inside_folder", [False, True], ids=["alone", "in-folder"])
def test_add_unreadable_file(seeded: Repo, tmp_path: Path, inside_folder: bool) -> None:
    folder = make_model(tmp_path / "model", seed=1)
    target = folder / "model.safetensors" if not inside_folder else folder / "config.json"
    target.chmod(0)
    if os.access(target, os.R_OK):
        pytest.skip("running as a user who can read a chmod 000 file (root)")
    before = repo_state(seeded)

    path = target if not inside_folder else folder
    one_line_error(mgit(seeded, "add", str(path), "--name", "m"), str(target), "cannot read file")

    assert repo_state(seeded) == before


def test_add_nonexistent_path(seeded: Repo, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    before = repo_state(seeded)

    one_line_error(mgit(seeded, "add", str(missing), "--name", "m"), str(missing), "no such file or folder")

    assert repo_state(seeded) == before


@pytest.mark.parametrize(
    "layout",
    [[], ["sub/"], ["a/b/"], [".git/HEAD"], ["__pycache__/x.pyc"]],
    ids=["empty", "empty-subfolder", "nested-empty", "only-dot-git", "only-pycache"],
)
def test_add_folder_without_files(seeded: Repo, tmp_path: Path, layout: list[str]) -> None:
    folder = tmp_path / "hollow"
    folder.mkdir()
    for rel in layout:
        (folder / rel.rstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith("/"):
            (folder / rel).mkdir(parents=True, exist_ok=True)
        else:
            (folder / rel).write_text("x")
    before = repo_state(seeded)

    one_line_error(mgit(seeded, "add", str(folder), "--name", "m"), str(folder), "holds no files")

    assert repo_state(seeded) == before


@pytest.mark.parametrize("name", ["notes.txt", "config.json", "model.onnx", "model.safetensors.gz"])
def test_add_single_file_that_is_not_a_model(seeded: Repo, tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text("hello")
    before = repo_state(seeded)

    one_line_error(mgit(seeded, "add", str(path), "--name", "m"), str(path), "not a model", ".safetensors")

    assert repo_state(seeded) == before


# --- names, refs and options ----------------------------------------------------------------

REF_COMMANDS = {
    "checkout": lambda ref, tmp: ["checkout", ref, "-o", str(tmp / "out")],
    "show": lambda ref, tmp: ["show", ref],
    "log": lambda ref, tmp: ["log", ref],
    "rm": lambda ref, tmp: ["rm", ref],
}


@pytest.mark.parametrize("command", list(REF_COMMANDS))
def test_unknown_model_suggests_ls(seeded: Repo, tmp_path: Path, command: str) -> None:
    before = repo_state(seeded)

    err = one_line_error(mgit(seeded, *REF_COMMANDS[command]("nosuchmodel", tmp_path)), "'nosuchmodel'", "See: mgit ls")

    assert "Did you mean" not in err
    assert repo_state(seeded) == before
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "command",
    [
        *["checkout", "show", "log"],
        "rm",
    ],
)
def test_near_miss_model_name_suggests_the_close_name(seeded: Repo, tmp_path: Path, command: str) -> None:
    before = repo_state(seeded)

    one_line_error(mgit(seeded, *REF_COMMANDS[command]("bsae", tmp_path)), "'bsae'", "Did you mean 'base'?", "mgit ls")

    assert repo_state(seeded) == before


@pytest.mark.parametrize("ref", ["base@7", "base@0", "base@ffffffff"])
def test_unknown_version_of_known_model_points_to_log(seeded: Repo, tmp_path: Path, ref: str) -> None:
    one_line_error(mgit(seeded, "checkout", ref, "-o", str(tmp_path / "out")), repr(ref), "mgit log base")

    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("parent", ["nosuchparent", "base@9", "bsae"])
def test_add_with_missing_parent_writes_nothing(seeded: Repo, tmp_path: Path, parent: str) -> None:
    folder = make_model(tmp_path / "child", seed=3)
    before = repo_state(seeded)

    one_line_error(mgit(seeded, "add", str(folder), "--name", "child", "--parent", parent), repr(parent))

    assert repo_state(seeded) == before


@pytest.mark.parametrize(
    "name",
    ["../x", "a@b", "", "x" * 129, "a/b/c", "/abs", "has space", "m.lock", "a..b"],
    ids=["dotdot", "at", "empty", "too-long", "two-slashes", "absolute", "space", "lock", "double-dot"],
)
def test_add_with_invalid_model_name(seeded: Repo, tmp_path: Path, name: str) -> None:
    before = repo_state(seeded)

    one_line_error(
        mgit(seeded, "add", str(make_model(tmp_path / "m", seed=4)), f"--name={name}"),
        f"invalid model name {name!r}",
        "Use letters, digits",
    )

    assert repo_state(seeded) == before


def test_add_with_unknown_relation_is_a_usage_error(seeded: Repo, tmp_path: Path) -> None:
    before = repo_state(seeded)

    assert_usage_error(
        mgit(
            seeded,
            "add",
            str(make_model(tmp_path / "m", seed=5)),
            "--name",
            "m",
            "--parent",
            "base",
            "--relation",
            "frobnicate",
        ),
        "--relation",
        "frobnicate",
        "finetune",
    )

    assert repo_state(seeded) == before


def test_add_with_tag_without_equals_is_a_usage_error(seeded: Repo, tmp_path: Path) -> None:
    before = repo_state(seeded)

    assert_usage_error(
        mgit(seeded, "add", str(make_model(tmp_path / "m", seed=5)), "--name", "m", "--tag", "stage"),
        "--tag",
        "'stage' is not key=value",
    )

    assert repo_state(seeded) == before


# --- PyTorch checkpoints --------------------------------------------------------------------


def torch_state() -> dict[str, object]:
    import torch

    g = torch.Generator().manual_seed(0)
    return {
        "encoder.weight": torch.randn(6, 4, generator=g),
        "encoder.bias": torch.randn(6, generator=g).half(),
        "head.weight": torch.randn(3, 6, generator=g).bfloat16(),
        "step_ids": torch.arange(5),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
    }


@needs_torch
@pytest.mark.parametrize(
    ("file_name", "target"),
    [
        ("ckpt.pt", "ckpt.safetensors"),
        ("pytorch_model.bin", "model.safetensors"),
        ("weights.pth", "weights.safetensors"),
    ],
)
def test_plain_state_dict_is_converted_to_safetensors(
    seeded: Repo, tmp_path: Path, file_name: str, target: str
) -> None:
    import torch
    from safetensors.torch import load_file

    state = torch_state()
    ckpt = tmp_path / file_name
    torch.save(state, ckpt)

    rc, out, err = mgit(seeded, "add", str(ckpt), "--name", "tiny")
    assert rc == 0, err
    said = " ".join(err.split())  # rich may wrap the note
    assert f"note: {file_name} is a PyTorch checkpoint" in said
    assert f"checkout rebuilds it as {target}" in said

    rc, out, err = mgit(seeded, "checkout", "tiny", "-o", str(tmp_path / "out"))
    assert rc == 0, err
    assert f"rebuilt as safetensors from {file_name}" in " ".join(err.split())
    assert sorted(sha256_tree(tmp_path / "out")) == [target]
    loaded = load_file(str(tmp_path / "out" / target))
    assert sorted(loaded) == sorted(state)
    for name, value in state.items():
        assert loaded[name].dtype == value.dtype, name
        assert torch.equal(loaded[name], value), name


@needs_torch
def test_nested_state_dict_is_flattened_to_dotted_names(seeded: Repo, tmp_path: Path) -> None:
    import torch

    ckpt = tmp_path / "nested.pt"
    torch.save({"encoder": {"weight": torch.ones(2, 2), "bias": torch.zeros(2)}}, ckpt)

    assert mgit(seeded, "add", str(ckpt), "--name", "nested")[0] == 0

    assert sorted(Repo(seeded.dir).load_state_dict("nested")) == ["encoder.bias", "encoder.weight"]


MARKER_NAME = "mgit-pwned-marker"


class RunsShell:
    """Unpickling it runs `touch MARKER`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


class OpensFile:
    """Unpickling it creates MARKER via builtins.open."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (open, (str(self.marker), "w"))


def write_malicious(path: Path, payload: str, saver: str, marker: Path) -> None:
    import torch

    evil = RunsShell(marker) if payload == "os.system" else OpensFile(marker)
    obj = {"weight": torch.ones(2), "extra": evil}
    if saver == "torch.save":
        torch.save(obj, path)
    else:
        with open(path, "wb") as fh:
            pickle.dump(obj, fh, protocol=2)


@needs_torch
@pytest.mark.parametrize("saver", ["torch.save", "pickle.dump"])
@pytest.mark.parametrize("payload", ["os.system", "open"])
def test_malicious_pickle_payload_does_run_when_fully_unpickled(tmp_path: Path, payload: str, saver: str) -> None:
    import torch

    # The control for the test below: the marker check can fail, the payload is live.
    marker = tmp_path / MARKER_NAME
    write_malicious(tmp_path / "evil.pt", payload, saver, marker)

    if saver == "torch.save":
        torch.load(tmp_path / "evil.pt", weights_only=False)
    else:
        with open(tmp_path / "evil.pt", "rb") as fh:
            pickle.load(fh)

    assert marker.exists()


@needs_torch
@pytest.mark.parametrize("saver", ["torch.save", "pickle.dump"])
@pytest.mark.parametrize("payload", ["os.system", "open"])
def test_malicious_pickle_is_refused_and_never_run(seeded: Repo, tmp_path: Path, payload: str, saver: str) -> None:
    marker = tmp_path / MARKER_NAME
    ckpt = tmp_path / "evil.pt"
    write_malicious(ckpt, payload, saver, marker)
    before = repo_state(seeded)

    one_line_error(
        mgit(seeded, "add", str(ckpt), "--name", "evil"), str(ckpt), "not a plain weights file", "state_dict()"
    )

    assert not marker.exists()
    assert repo_state(seeded) == before


@needs_torch
def test_malicious_pickle_error_message_has_no_terminal_escapes(repo: Repo, tmp_path: Path) -> None:
    ckpt = tmp_path / "evil.pt"
    write_malicious(ckpt, "open", "torch.save", tmp_path / MARKER_NAME)

    with pytest.raises(InputError, match="not a plain weights file") as info:
        repo.add(ckpt, name="evil")

    assert "\x1b" not in str(info.value)


@needs_torch
def test_malicious_pickle_in_subprocess_exits_1_without_traceback(seeded: Repo, tmp_path: Path) -> None:
    marker = tmp_path / MARKER_NAME
    ckpt = tmp_path / "evil.pt"
    write_malicious(ckpt, "os.system", "torch.save", marker)
    before = repo_state(seeded)

    proc = run_mgit("add", str(ckpt), "--name", "evil", cwd=seeded.root)

    one_line_error((proc.returncode, proc.stdout, proc.stderr), str(ckpt), "not a plain weights file")
    assert not marker.exists()
    assert repo_state(seeded) == before


@needs_torch
def test_legacy_pickle_in_subprocess_gives_only_the_error_line(seeded: Repo, tmp_path: Path) -> None:
    import torch

    marker = tmp_path / MARKER_NAME
    ckpt = tmp_path / "evil.pt"
    with open(ckpt, "wb") as fh:
        pickle.dump({"weight": torch.ones(2), "extra": RunsShell(marker)}, fh)  # default protocol (4)

    proc = run_mgit("add", str(ckpt), "--name", "evil", cwd=seeded.root)

    assert not marker.exists()
    one_line_error((proc.returncode, proc.stdout, proc.stderr), str(ckpt), "not a plain weights file")


@needs_torch
@pytest.mark.parametrize(
    ("content", "fragments"),
    [  # made in the test, given torch: it may be missing here
        pytest.param(
            lambda torch: {"epoch": 3, "model": {"w": torch.ones(2)}},
            ["'epoch'", "not a tensor", "checkpoint['state_dict']"],
            id="training-checkpoint",
        ),
        pytest.param(
            lambda torch: {"model": {"w": torch.ones(2)}, "optimizer": {"lr": 0.1}},
            ["'lr'", "not a tensor"],
            id="optimizer-state",
        ),
        pytest.param(
            lambda torch: {"w": torch.ones(2), "names": ["a", "b"]}, ["'names'", "not a tensor"], id="list-value"
        ),
        pytest.param(
            lambda torch: [torch.ones(2), torch.zeros(2)], ["holds a list, not a dict of tensors"], id="list-of-tensors"
        ),
        pytest.param(lambda torch: {}, ["holds no tensors"], id="empty-dict"),
        pytest.param(lambda torch: {1: torch.ones(2)}, ["key 1 is not a string"], id="int-key"),
    ],
)
def test_checkpoint_that_is_not_a_state_dict_is_refused(
    seeded: Repo, tmp_path: Path, content: Callable[[object], object], fragments: list[str]
) -> None:
    import torch

    ckpt = tmp_path / "train.pt"
    torch.save(content(torch), ckpt)
    before = repo_state(seeded)

    one_line_error(mgit(seeded, "add", str(ckpt), "--name", "train"), str(ckpt), *fragments)

    assert repo_state(seeded) == before


def _truncated_checkpoint(tmp_path: Path) -> bytes:
    import torch

    torch.save({"w": torch.ones(64)}, tmp_path / "whole.pt")
    raw = (tmp_path / "whole.pt").read_bytes()
    return raw[: len(raw) // 2]


@needs_torch
@pytest.mark.parametrize(
    "make",
    [
        pytest.param(_truncated_checkpoint, id="truncated-zip"),
        pytest.param(lambda _: b"", id="empty"),
        pytest.param(lambda _: b"this is a text file, not a checkpoint\n", id="text"),
        pytest.param(lambda _: bytes(np.random.default_rng(1).integers(0, 256, 512, dtype=np.uint8)), id="random"),
        pytest.param(lambda _: b"PK\x03\x04" + b"\0" * 100, id="zip-magic-only"),
    ],
)
def test_damaged_checkpoint_gives_one_line_error(seeded: Repo, tmp_path: Path, make) -> None:
    ckpt = tmp_path / "broken.pt"
    ckpt.write_bytes(make(tmp_path))
    before = repo_state(seeded)

    done = mgit(seeded, "add", str(ckpt), "--name", "broken")
    one_line_error(done, str(ckpt))
    assert "unpickler" not in done[2]  # nothing here is a pickle of objects
    if not ckpt.read_bytes().startswith((b"PK\x03\x04", b"\x80")):
        assert "not a PyTorch checkpoint: neither the zip archive torch.save writes nor a pickle" in done[2]

    assert repo_state(seeded) == before


@needs_torch
def test_checkpoint_inside_a_folder_is_kept_as_bytes_and_never_loaded(seeded: Repo, tmp_path: Path) -> None:
    folder = make_model(tmp_path / "model", seed=6)
    marker = tmp_path / MARKER_NAME
    write_malicious(folder / "training_args.bin", "os.system", "torch.save", marker)

    rc, _, err = mgit(seeded, "add", str(folder), "--name", "withbin")
    assert rc == 0, err
    assert "training_args.bin kept byte for byte" in " ".join(err.split())
    assert mgit(seeded, "checkout", "withbin", "-o", str(tmp_path / "out"))[0] == 0

    assert not marker.exists()
    assert sha256_tree(tmp_path / "out") == sha256_tree(folder)


# --- checkout safety ------------------------------------------------------------------------


def forge_version(repo: Repo, name: str, files: dict[str, bytes]) -> str:
    """Store blobs and a manifest naming `files` verbatim (paths unchecked), point `name` at it."""
    entries = []
    for path, data in files.items():
        oid = repo.store.put_blob(data).oid
        entries.append(FileEntry(path, "blob", len(data), blake3.blake3(data).hexdigest(), oid))
    manifest = repo.store.put_record("manifest", Manifest(tuple(entries)).to_json()).oid
    version = Version(
        model=name,
        manifest=manifest,
        author="forger",
        time="2024-01-01T00:00:00.000000Z",
        summary={"files": len(entries)},
    )
    vid = repo.store.put_record("version", version.to_json()).oid
    repo.refs.update(name, vid, expected=None)
    return vid


BAD_PATHS = [
    pytest.param("../evil.txt", id="dotdot"),
    pytest.param("sub/../../evil.txt", id="dotdot-inside"),
    pytest.param("ABSOLUTE", id="absolute"),
    pytest.param("..\\evil.txt", id="backslash-dotdot"),
    pytest.param("sub\\evil.txt", id="backslash"),
    pytest.param("./evil.txt", id="dot"),
    pytest.param("a//evil.txt", id="empty-part"),
    pytest.param("evil\x00.txt", id="nul"),
]


@pytest.mark.parametrize("bad", BAD_PATHS)
def test_checkout_refuses_forged_path(repo: Repo, tmp_path: Path, bad: str) -> None:
    work = tmp_path / "work"
    work.mkdir()
    escape = tmp_path / "abs-evil.txt"
    bad = str(escape) if bad == "ABSOLUTE" else bad
    forge_version(repo, "forged", {"config.json": b"{}", bad: b"pwned"})
    before = tree(tmp_path / "work")
    out = work / "out"

    one_line_error(mgit(repo, "checkout", "forged", "-o", str(out)), f"refusing path {bad!r}")

    assert tree(work) == before  # nothing outside the output folder...
    assert not out.exists()  # ...and nothing inside it, not even the good file listed first
    assert not escape.exists()
    assert not (tmp_path / "evil.txt").exists()


def test_checkout_of_forged_good_paths_works(repo: Repo, tmp_path: Path) -> None:
    # The control for the test above: forge_version builds a version checkout can write.
    forge_version(repo, "forged", {"config.json": b"{}", "sub/ok.txt": b"fine"})

    rc, _, err = mgit(repo, "checkout", "forged", "-o", str(tmp_path / "out"))

    assert rc == 0, err
    assert (tmp_path / "out" / "sub" / "ok.txt").read_bytes() == b"fine"


def test_checkout_with_force_does_not_follow_a_planted_file_link(seeded: Repo, tmp_path: Path) -> None:
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"precious")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    (out / "model.safetensors").symlink_to(victim)
    before = tree(out)

    one_line_error(mgit(seeded, "checkout", "base", "-o", str(out), "--force"), "keep.txt")
    one_line_error(mgit(seeded, "checkout", "base", "-o", str(out), "--clean"), "'model.safetensors'", "is a link")

    assert victim.read_bytes() == b"precious"
    assert tree(out) == before


def test_checkout_with_force_does_not_follow_a_planted_folder_link(seeded: Repo, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "tokenizer").symlink_to(elsewhere, target_is_directory=True)
    before = tree(out)

    one_line_error(mgit(seeded, "checkout", "base", "-o", str(out), "--clean"), "'tokenizer/vocab.txt'", "is a link")

    assert list(elsewhere.iterdir()) == []
    assert tree(out) == before


def test_checkout_into_non_empty_folder_needs_force(seeded: Repo, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")

    one_line_error(mgit(seeded, "checkout", "base", "-o", str(out)), str(out), "not empty", "--force")

    assert tree(out) == {"notes.txt": hashlib.sha256(b"mine").hexdigest()}


def test_checkout_into_non_empty_folder_with_force_writes_over_the_versions_files(seeded: Repo, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")

    one_line_error(mgit(seeded, "checkout", "base", "-o", str(out), "--force"), "notes.txt", "--clean")
    assert (out / "notes.txt").read_text() == "mine"  # refused: the folder would not be the version
    (out / "model.safetensors").write_bytes(b"an older copy")  # a file the version holds is written over
    (out / "notes.txt").unlink()
    rc, _, err = mgit(seeded, "checkout", "base", "-o", str(out), "--force")
    assert rc == 0, err
    assert (out / "model.safetensors").read_bytes() != b"an older copy"


def test_checkout_into_a_file_fails(seeded: Repo, tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("a file")

    one_line_error(mgit(seeded, "checkout", "base", "-o", str(target)), str(target), "not a folder")

    assert target.read_text() == "a file"


def test_broken_safetensors_in_subprocess_exits_1_without_traceback(seeded: Repo, tmp_path: Path) -> None:
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(st_bytes({"a": f32([4], [0, 16])}, b"\0" * 10))
    before = repo_state(seeded)

    proc = run_mgit("add", str(bad), "--name", "m", cwd=seeded.root)

    one_line_error((proc.returncode, proc.stdout, proc.stderr), str(bad), "the file is truncated")
    assert repo_state(seeded) == before


# --- file names that look like rich console markup -------------------------------------------


@needs_torch
def test_conversion_note_shows_a_bracketed_file_name_verbatim(seeded: Repo, tmp_path: Path) -> None:
    import torch

    ckpt = tmp_path / "ckpt[red].pt"
    torch.save({"w": torch.ones(2)}, ckpt)

    rc, _, err = mgit(seeded, "add", str(ckpt), "--name", "bracket")

    assert rc == 0, err
    assert "ckpt[red].pt is a PyTorch checkpoint" in " ".join(err.split())


def test_note_about_a_skipped_file_named_like_a_closing_tag_does_not_crash(seeded: Repo, tmp_path: Path) -> None:
    folder = make_model(tmp_path / "model", seed=7)
    (folder / "sub[").mkdir()
    os.mkfifo(folder / "sub[" / "x]")  # skipped with a note naming "sub[/x]"

    proc = run_mgit("add", str(folder), "--name", "fifo", cwd=seeded.root)

    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0
    assert "skipped sub[/x]: not a regular file" in " ".join(proc.stderr.split())


def test_show_lists_a_file_named_like_a_closing_tag(seeded: Repo, tmp_path: Path) -> None:
    folder = make_model(tmp_path / "model", seed=7)
    (folder / "sub[").mkdir()
    (folder / "sub[" / "x]").write_text("hi")
    Repo(seeded.dir).add(folder, name="tagged")

    proc = run_mgit("show", "tagged", cwd=seeded.root)

    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0
    assert "sub[/x]" in proc.stdout
