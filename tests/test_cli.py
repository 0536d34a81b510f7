"""The command line: help with an example on every command, `--json` twins, one-line errors
with exit code 1, usage errors with 2, tracebacks only with MGIT_DEBUG=1."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from conftest import make_model, run_cli, run_mgit, sha256_tree

from mgit.cli.main import cli


def _leaves(group: click.Group, prefix: tuple[str, ...] = ()) -> list[str]:
    """Every runnable command as it is typed ("ls", "lineage tree", "test run")."""
    out = []
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            out += _leaves(command, (*prefix, name))
        else:
            out.append(" ".join((*prefix, name)))
    return sorted(out)


COMMANDS = _leaves(cli)
DATA_COMMANDS = {"init": [], "add": None, "checkout": None, "ls": [], "log": ["m"], "show": ["m"], "du": [],
                 "fsck": [], "gc": ["--dry-run"], "rm": ["m"], "diff": None, "graph": [], "lineage tree": [],
                 "lineage suggest": None, "test add": None, "test ls": [], "test run": None, "test show": [],
                 "bisect": None, "cascade": None}  # fmt: skip
NO_DATA = {"test rm"}  # prints one confirmation line


def test_every_command_is_covered_here() -> None:
    assert set(COMMANDS) == set(DATA_COMMANDS) | NO_DATA


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_an_example(command: str) -> None:
    code, out, _ = run_cli(*command.split(), "--help")
    assert code == 0
    assert "Example" in out and f"mgit {command}" in out
    assert "--json" in out or command in NO_DATA


@pytest.mark.parametrize("group", sorted(n for n, c in cli.commands.items() if isinstance(c, click.Group)))
def test_every_group_has_help_with_an_example(group: str) -> None:
    code, out, _ = run_cli(group, "--help")
    assert code == 0 and "Example" in out and f"mgit {group}" in out


@pytest.fixture
def work(tmp_path: Path) -> Path:
    code, _, _ = run_cli("init", str(tmp_path))
    assert code == 0
    make_model(tmp_path / "base", seed=1)
    make_model(tmp_path / "ft", seed=2)
    return tmp_path


def cli_json(*args: str, cwd: Path) -> object:
    code, out, err = run_cli(*args, "--json", cwd=cwd)
    assert code == 0, err
    return json.loads(out)


def test_tour_through_the_commands(work: Path) -> None:
    added = cli_json("add", "base", "--name", "base", "-m", "first", cwd=work)
    assert added["created"] and added["seq"] == 1 and added["tensors"] == 6
    ft = cli_json("add", "ft", "--name", "ft", "--parent", "base", "--relation", "finetune", "-t", "k=v", cwd=work)
    assert ft["parents"][0]["model"] == "base" and ft["parents"][0]["relation"] == "finetune"

    models = cli_json("ls", cwd=work)
    assert [m["name"] for m in models] == ["base", "ft"]
    log = cli_json("log", "ft", cwd=work)
    assert log[0]["tags"] == {"k": "v"} and log[0]["id"] == ft["version"]
    shown = cli_json("show", "base@1", cwd=work)
    assert shown["version"]["message"] == "first"
    du = cli_json("du", cwd=work)
    assert du["logical_bytes"] == added["logical_bytes"] + ft["logical_bytes"] and du["stored_bytes"] > 0
    assert cli_json("fsck", cwd=work)["ok"] is True

    code, out, _ = run_cli("checkout", "ft", "-o", str(work / "out"), cwd=work)
    assert code == 0 and "verified" in out
    assert sha256_tree(work / "out") == sha256_tree(work / "ft")

    code, out, _ = run_cli("ls", cwd=work)
    assert "base" in out and "ft" in out and "base@1 (finetune)" in out
    code, out, _ = run_cli("du", cwd=work)
    assert code == 0 and "repository" in out
    removed = cli_json("rm", "ft", cwd=work)
    assert removed["model"] == "ft"
    gc = cli_json("gc", cwd=work)
    assert gc["removed"] and not gc["dry_run"]


def test_unchanged_add_says_so(work: Path) -> None:
    run_cli("add", "base", "--name", "base", cwd=work)
    code, out, _ = run_cli("add", "base", "--name", "base", cwd=work)
    assert code == 0 and "unchanged" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["show", "nope"], "Error: no model named 'nope'. See: mgit ls"),
        (["log", "base@9"], "Error: model 'base' has 1 version; no version named 'base@9'"),
        (["checkout", "nope", "-o", "x"], "Error: no model named 'nope'"),
        (["add", "missing-folder", "--name", "x"], "Error: missing-folder: no such file or folder"),
        (["add", "base", "--name", "../x"], "Error: invalid model name '../x'"),
    ],
)
def test_errors_are_one_line_with_exit_code_1(work: Path, args: list[str], message: str) -> None:
    run_cli("add", "base", "--name", "base", cwd=work)
    code, out, err = run_cli(*args, cwd=work)
    assert code == 1
    assert err.startswith(message), err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    "args",
    [["add", "base"], ["add", "base", "--name", "x", "--relation", "cousin"], ["frobnicate"], ["log"],
     ["add", "base", "--name", "x", "--tag", "novalue"]],
)  # fmt: skip
def test_usage_errors_exit_2(work: Path, args: list[str]) -> None:
    code, _, err = run_cli(*args, cwd=work)
    assert code == 2, err
    assert "Usage:" in err or "Error:" in err


def test_outside_a_repository(tmp_path: Path) -> None:
    code, _, err = run_cli("ls", cwd=tmp_path)
    assert code == 1 and "not an mgit repository" in err and "mgit init" in err


def test_dash_c_and_mgit_dir(work: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    code, _, err = run_cli("-C", str(work), "add", str(work / "base"), "--name", "base", cwd=elsewhere)
    assert code == 0, err
    code, out, _ = run_cli("-C", str(work), "ls", cwd=elsewhere)
    assert code == 0 and "base" in out
    code, out, _ = run_cli("ls", cwd=elsewhere, env={"MGIT_DIR": str(work / ".mgit")})
    assert code == 0 and "base" in out


def test_fsck_exits_1_on_corruption(work: Path) -> None:
    run_cli("add", "base", "--name", "base", cwd=work)
    obj = next(p for p in (work / ".mgit" / "objects").rglob("*") if p.is_file() and p.stat().st_size > 1000)
    obj.chmod(0o644)
    data = bytearray(obj.read_bytes())
    data[-3] ^= 0xFF
    obj.write_bytes(bytes(data))
    code, out, _ = run_cli("fsck", cwd=work)
    assert code == 1 and "corrupt" in out and "base@1" in out


def test_real_process_exit_codes_and_debug_traceback(work: Path) -> None:
    proc = run_mgit("show", "nope", cwd=work)
    assert proc.returncode == 1 and proc.stderr.startswith("Error: ") and "Traceback" not in proc.stderr
    proc = run_mgit("show", "nope", cwd=work, env={"MGIT_DEBUG": "1"})
    assert proc.returncode == 1 and "Traceback" in proc.stderr
    proc = run_mgit("--version", cwd=work)
    assert proc.returncode == 0 and "mgit" in proc.stdout
