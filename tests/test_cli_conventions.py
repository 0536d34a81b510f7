"""What git and huggingface_hub users expect of any command: `-C DIR` as git's (every relative
path found from DIR), `--json` errors as JSON on stdout, and an unknown command answered with
the closest one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import make_model, run_cli, run_mgit, sha256_tree

EVALS = """
import json, pathlib


def width(folder):
    return {"files": len(list(pathlib.Path(folder).iterdir()))}
"""


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A work folder holding a repository, a model folder and an evals file, and a folder
    elsewhere to run from."""
    root = tmp_path / "work"
    root.mkdir()
    make_model(root / "models" / "base", seed=1)
    (root / "evals.py").write_text(EVALS)
    assert run_mgit("init", cwd=root).returncode == 0
    (tmp_path / "elsewhere").mkdir()
    return root


def test_dash_c_finds_every_relative_path_from_dir(work: Path) -> None:
    elsewhere = work.parent / "elsewhere"
    added = run_mgit("-C", str(work), "add", "models/base", "--name", "base", "--json", cwd=elsewhere)
    assert added.returncode == 0, added.stderr
    test = run_mgit(
        "-C",
        str(work),
        "test",
        "add",
        "base",
        "--fn",
        "evals.py:width",
        "--name",
        "w",
        "--min",
        "files=1",
        cwd=elsewhere,
    )
    assert test.returncode == 0, test.stderr
    ran = run_mgit("-C", str(work), "test", "run", "base", "--json", cwd=elsewhere)
    assert ran.returncode == 0, ran.stderr
    out = run_mgit("-C", str(work), "checkout", "base", "-o", "out", cwd=elsewhere)
    assert out.returncode == 0, out.stderr
    assert sha256_tree(work / "out") == sha256_tree(work / "models" / "base")
    assert not (elsewhere / "out").exists() and list(elsewhere.iterdir()) == []


def test_dash_c_in_process_gives_the_caller_its_folder_back(work: Path) -> None:
    before = os.getcwd()
    code, out, err = run_cli("-C", str(work), "ls", "--json")
    assert code == 0, err
    assert os.getcwd() == before


def test_dash_c_to_a_missing_folder_is_a_usage_error(tmp_path: Path) -> None:
    done = run_mgit("-C", str(tmp_path / "nope"), "ls", cwd=tmp_path)
    assert done.returncode == 2
    assert f"cannot change to '{tmp_path / 'nope'}': No such file or directory" in done.stderr


@pytest.mark.parametrize(
    ("args", "code", "kind", "error"),
    [
        (["show", "nope", "--json"], 1, "UnknownRefError", "no model named 'nope'"),
        (["ls", "--json", "--bogus"], 2, "NoSuchOption", "No such option '--bogus'."),
        (["graph", "--format", "json", "nope"], 1, "NoMatchError", "no models yet"),
    ],
)
def test_a_json_error_is_a_json_object_on_stdout(work: Path, args: list[str], code: int, kind: str, error: str) -> None:
    done = run_mgit(*args, cwd=work)
    assert done.returncode == code
    body = json.loads(done.stdout)
    assert body["type"] == kind and body["error"] == error and set(body) == {"error", "hint", "type"}
    assert error in done.stderr  # and still one line for a person watching


def test_without_json_an_error_leaves_stdout_empty(work: Path) -> None:
    done = run_mgit("show", "nope", cwd=work)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == "Error: no model named 'nope'. See: mgit ls\n"


def test_json_after_a_double_dash_is_an_argument_not_the_flag(work: Path) -> None:
    done = run_mgit("show", "--", "--json", cwd=work)
    assert done.returncode != 0 and done.stdout == ""


@pytest.mark.parametrize(
    ("args", "suggestion"),
    [
        (["checkot"], "Did you mean 'checkout'?"),
        (["linage"], "Did you mean 'lineage'?"),
        (["test", "rn"], "Did you mean 'run'?"),
        (["remote", "sho"], "Did you mean 'show'?"),
    ],
)
def test_an_unknown_command_suggests_the_closest(work: Path, args: list[str], suggestion: str) -> None:
    code, _, err = run_cli(*args, cwd=work)
    assert code == 2
    assert f"No such command '{args[-1]}'. {suggestion}" in err


def test_an_unknown_command_far_from_any_suggests_nothing(work: Path) -> None:
    code, _, err = run_cli("zzzzzz", cwd=work)
    assert code == 2 and "No such command 'zzzzzz'." in err and "Did you mean" not in err


def test_add_without_a_name_takes_the_folders_or_the_files(work: Path) -> None:
    code, out, err = run_cli("add", "models/base", cwd=work)
    assert (
        code == 0 and out.startswith("base@1 ") and "note: no --name: the model is named 'base' after its folder" in err
    )
    code, out, err = run_cli("add", ".", cwd=work / "models" / "base")  # `.` is the folder it names
    assert code == 0 and out.startswith("base@1 ") and "unchanged" in out
    code, out, _ = run_cli("add", "models/base/model.safetensors", "--json", cwd=work)
    assert code == 0 and json.loads(out)["model"] == "model"


def test_checkout_without_output_writes_dot_slash_name_and_refuses_a_full_folder(work: Path) -> None:
    assert run_cli("add", "models/base", "--name", "acme/base", cwd=work)[0] == 0
    code, out, err = run_cli("checkout", "acme/base", cwd=work)
    assert code == 0, err
    assert sha256_tree(work / "base") == sha256_tree(work / "models" / "base")  # ORG/NAME: ./NAME
    code, out, err = run_cli("checkout", "acme/base", cwd=work)
    assert code == 1 and "output folder base is not empty" in err


def test_show_labels_its_digest_and_prints_sha256_as_sha256sum_does(work: Path) -> None:
    import hashlib
    import subprocess

    assert run_cli("add", "models/base", cwd=work)[0] == 0
    code, out, err = run_cli("show", "base", cwd=work)
    assert code == 0 and any(ln.startswith("file ") and ln.rstrip().endswith("blake3") for ln in out.splitlines())
    code, out, err = run_cli("show", "base", "--sha256", cwd=work)
    assert code == 0, err
    model = work / "models" / "base"
    expected = {
        p.relative_to(model).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in model.rglob("*")
        if p.is_file()
    }
    lines = [ln for ln in out.splitlines() if len(ln) > 66 and ln[64:66] == "  "]
    assert {ln[66:]: ln[:64] for ln in lines} == expected
    (model / "SUMS").write_text("\n".join(lines) + "\n")
    checked = subprocess.run(["sha256sum", "-c", "SUMS"], cwd=model, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    code, out, _ = run_cli("show", "base", "--sha256", "--json", cwd=work)
    assert code == 0 and json.loads(out)["sha256"] == expected
    assert not any(p.name.startswith("sha256-") for p in (work / ".mgit").iterdir())  # the rebuilt files are gone


def test_odd_adds_are_said_and_file_manager_litter_is_not_stored(work: Path) -> None:
    folder = work / "cfg"
    (folder / ".cache" / "huggingface" / "download").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (folder / ".cache" / "huggingface" / "download" / "config.json.lock").write_text("")
    code, out, err = run_cli("add", "cfg", "--json", cwd=work)
    assert code == 0, err
    added = json.loads(out)
    assert added["files"] == 1 and added["tensors"] == 0
    assert any(
        n.startswith("skipped 2 files that are not part of a model: .DS_Store, .cache/huggingface/")
        for n in added["notes"]
    )
    assert any(n.startswith("the model holds no tensors: only its files are stored") for n in added["notes"])
    assert run_cli("add", "models/base", "--name", "base", cwd=work)[0] == 0
    other = work / "other"
    make_model(other, seed=9)  # another architecture: its tensors renamed
    from safetensors.numpy import load_file, save_file

    state = load_file(str(other / "model.safetensors"))
    save_file({f"other.{k}": v for k, v in state.items()}, str(other / "model.safetensors"))
    code, out, err = run_cli("add", "other", "--name", "base", cwd=work)
    assert code == 0 and "note: this version shares 0 of" in err and "with base@1: another architecture" in err


def test_a_forced_checkout_refuses_strays_and_clean_makes_the_folder_the_version(work: Path) -> None:
    assert run_cli("add", "models/base", cwd=work)[0] == 0
    (work / "small").mkdir()
    (work / "small" / "config.json").write_text('{"small": true}')
    assert run_cli("add", "small", cwd=work)[0] == 0
    assert run_cli("checkout", "base", "-o", "out", cwd=work)[0] == 0
    before = sha256_tree(work / "out")
    code, out, err = run_cli("checkout", "small", "-o", "out", "--force", cwd=work)
    assert code == 1 and out == "" and "Error: out holds " in err and "that small@1 does not: model.safetensors" in err
    assert sha256_tree(work / "out") == before  # refused before writing anything
    code, out, err = run_cli("checkout", "small", "-o", "out", "--clean", cwd=work)
    assert code == 0, err
    assert "note: removed " in err and "model.safetensors" in err
    assert sha256_tree(work / "out") == sha256_tree(work / "small")  # exactly the version, empty folders gone
    assert sorted(p.name for p in (work / "out").iterdir()) == ["config.json"]


@pytest.mark.parametrize(
    "command",
    [
        ["test", "add", "base", "--fn", "evals.py:nofn", "--name", "t", "--min", "files=1"],
        ["add", "models/base", "--name", "r", "--recipe", "evals.py:does_not_exist"],
    ],
)
def test_a_function_the_file_does_not_define_is_refused_when_registered(work: Path, command: list[str]) -> None:
    assert run_cli("add", "models/base", cwd=work)[0] == 0
    missing = command[command.index("--fn") + 1 if "--fn" in command else command.index("--recipe") + 1]
    code, out, err = run_cli(*command, cwd=work)
    assert code == 1 and out == ""
    assert err.startswith(f"Error: cannot use '{missing}': evals.py defines no '{missing.split(':')[1]}' at its top")


def test_what_a_file_defines_is_read_without_running_it() -> None:
    from mgit.usercode import defines

    source = b"import os\nfrom json import loads as parse\nif True:\n    late = 1\nclass C: pass\ndef f(): pass\n"
    assert all(defines(source, n) for n in ("os", "parse", "late", "C", "f"))
    assert not defines(source, "g") and not defines(b"def f(): g = 1\n", "g")
    assert defines(b"from helpers import *\n", "anything") and defines(b"def __getattr__(n): ...\n", "x")


def test_log_without_a_model_is_every_version_newest_first_with_filters(work: Path) -> None:
    from mgit import Repo

    repo = Repo(work)
    repo.add(make_model(work / "a", seed=1), name="a", message="first\nmore")
    repo.add(make_model(work / "b", seed=2), name="b", parent="a", relation="quantize", tags={"task": "x"})
    repo.add(make_model(work / "a2", seed=3), name="a", message="again")
    code, out, err = run_cli("log", "--oneline", cwd=work)
    assert code == 0, err
    assert [line.split()[0] for line in out.splitlines()] == ["a@2", "b@1", "a@1"]
    assert out.splitlines()[2].endswith(" first")  # the message's first line
    code, out, _ = run_cli("log", "--json", "-n", "2", cwd=work)
    assert [v["ref"] if "ref" in v else f"{v['model']}@{v['seq']}" for v in json.loads(out)] == ["a@2", "b@1"]
    assert [ln.split()[0] for ln in run_cli("log", "--oneline", "--tag", "task=x", cwd=work)[1].splitlines()] == ["b@1"]
    assert [
        ln.split()[0] for ln in run_cli("log", "--oneline", "--relation", "quantize", cwd=work)[1].splitlines()
    ] == ["b@1"]
    assert run_cli("log", "--oneline", "--since", "2999-01-01", cwd=work)[1] == ""
    assert [ln.split()[0] for ln in run_cli("log", "a", "--oneline", cwd=work)[1].splitlines()] == ["a@2", "a@1"]
