"""Terminal escapes in data never reach a terminal raw: every human rendering (show, log, ls,
lineage, diff, errors) escapes control characters (`\\x1b`), and `--json` keeps the original
strings (escaped by the JSON encoder).

Where the data comes from: a damaged or hostile catalog.sqlite (messages, authors, tags and
names of versions, which the records themselves no longer admit), tensor names and file
contents of a model (which add keeps as they are), and what a user types (a path in an error).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from conftest import make_model, run_cli, run_mgit, tensors
from safetensors.numpy import save_file

from mgit import Repo
from mgit.cli.output import printable

RED = "\x1b[31m"
TITLE = "\x1b]0;owned\x07"


@pytest.fixture
def tampered(repo: Repo, tmp_path: Path) -> Repo:
    """A repository whose catalog was edited on disk: a message, an author, tags and a
    model name holding terminal escapes (the records are untouched)."""
    repo.add(make_model(tmp_path / "base", seed=1), name="base")
    repo.add(make_model(tmp_path / "ft", seed=2), name="ft", parent="base", message="fine", tags={"stage": "dev"})
    vid = repo.refs.get("ft")
    db = sqlite3.connect(repo.dir / "catalog.sqlite")
    with db:
        db.execute(
            "UPDATE versions SET message = ?, author = ?, tags = ? WHERE id = ?",
            (f"first {RED}red\nsecond\x9b2J", f"eve{TITLE}", json.dumps({f"k{RED}": f"v{RED}\r"}), vid),
        )
        db.execute("UPDATE versions SET model = ? WHERE model = 'base'", (f"base{RED}",))
    db.close()
    return repo


def assert_clean(*texts: str) -> None:
    for text in texts:
        for char in ("\x1b", "\x07", "\x9b", "\r", "\x00"):
            assert char not in text, (char, text)


def _strings(value: object) -> list[str]:
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *_strings(v)]]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def cli(repo: Repo, *args: str) -> tuple[int, str, str]:
    return run_cli("-C", str(repo.root), *args)


@pytest.mark.parametrize(
    "command",
    [
        ["show", "ft"],
        ["log", "ft"],
        ["ls"],
        ["lineage"],
        ["lineage", "ft", "--up"],
        ["du"],
        ["graph", "--format", "dot", "-o", "-"],
    ],
)
def test_human_output_escapes_what_the_catalog_holds(tampered: Repo, command: list[str]) -> None:
    code, out, err = cli(tampered, *command)
    assert code == 0, err
    assert_clean(out, err)


def test_show_and_log_print_the_escaped_text(tampered: Repo) -> None:
    for command in ("show", "log"):
        _, out, _ = cli(tampered, command, "ft")
        assert "first \\x1b[31mred\n" in out and "second\\x9b2J" in out
        assert "author:  eve\\x1b]0;owned\\x07" in out
        assert "k\\x1b[31m=v\\x1b[31m\\x0d" in out


@pytest.mark.parametrize("command", [["show", "ft"], ["log", "ft"]])
def test_json_keeps_the_original_strings(tampered: Repo, command: list[str]) -> None:
    code, out, _ = cli(tampered, *command, "--json")
    assert code == 0 and "\x1b" not in out
    data = json.loads(out)
    version = data["version"] if command[0] == "show" else data[0]
    assert version["message"] == f"first {RED}red\nsecond\x9b2J"
    assert version["author"] == f"eve{TITLE}"
    assert version["tags"] == {f"k{RED}": f"v{RED}\r"}


def test_diff_escapes_tensor_names_and_file_contents(repo: Repo, tmp_path: Path) -> None:
    for seed, name in ((1, "a"), (2, "b")):
        folder = tmp_path / name
        folder.mkdir()
        state = tensors(seed) | {f"evil{RED}.weight": np.full(4, seed, np.float32)}
        save_file(state, str(folder / "model.safetensors"))
        (folder / "notes.txt").write_text(f"line {seed}\n{TITLE}{seed}\n")
        repo.add(folder, name=name)

    code, out, err = cli(repo, "diff", "a", "b", "--tensors")

    assert code == 0, err
    assert_clean(out, err)
    assert "evil\\x1b[31m.weight" in out and "\\x1b]0;owned\\x07" in out
    rows = [line for line in out.splitlines() if line.startswith(("embed.weight ", "evil\\x1b[31m.weight "))]
    assert len(rows) == 2 and rows[0].index("changed") == rows[1].index("changed")  # still aligned
    code, out, _ = cli(repo, "diff", "a", "b", "--tensors", "--json")
    assert code == 0 and "\x1b" not in out
    strings = set(_strings(json.loads(out)))
    assert f"evil{RED}.weight" in strings and f"+{TITLE}2" in strings


def test_an_error_naming_what_was_typed_is_escaped(repo: Repo, tmp_path: Path) -> None:
    code, out, err = cli(repo, "add", str(tmp_path / f"missing{RED}"), "--name", "m")
    assert code == 1 and out == "" and err.startswith("Error: ") and err.count("\n") == 1, err
    assert_clean(err)
    assert "missing\\x1b[31m: no such file or folder" in err


def test_a_usage_error_and_a_subprocess_error_are_escaped(repo: Repo, tmp_path: Path) -> None:
    code, _, err = cli(repo, "add", str(tmp_path), "--name", "m", "--relation", f"x{RED}")
    assert code == 2 and "x\\x1b[31m" in err
    assert_clean(err)
    proc = run_mgit("checkout", f"nope{RED}", "-o", str(tmp_path / f"out{RED}"), cwd=repo.root)
    assert proc.returncode == 1 and proc.stdout == ""
    assert_clean(proc.stderr)


def test_a_message_printed_after_a_checkout_escapes_the_folder(repo: Repo, tmp_path: Path) -> None:
    repo.add(tensors(1), name="m")
    code, out, err = cli(repo, "checkout", "m", "-o", str(tmp_path / f"out{RED}"))
    assert code == 0, err
    assert_clean(out, err)
    assert "out\\x1b[31m" in out
    assert (tmp_path / f"out{RED}" / "model.safetensors").is_file()


def test_printable() -> None:
    assert printable("a\x1b[31mb\n\tc\x7f\x85\u202e\x00") == "a\\x1b[31mb\n\tc\\x7f\\x85\\u202e\\x00"
    assert printable("caf\u00e9 \u2603 \u4e2d") == "caf\u00e9 \u2603 \u4e2d"


def test_printable_escapes_every_code_point_a_terminal_acts_on_alone_or_in_text() -> None:
    from mgit.cli.output import UNPRINTABLE

    acted_on = [c for c in map(chr, range(0x110000)) if UNPRINTABLE.match(c)]
    assert len(acted_on) == 30 + 1 + 32 + 5 + 4  # C0 less newline and tab, DEL, C1, the bidi overrides
    for c in acted_on:  # (text Python calls printable is taken as it is: none of these may be in it)
        assert printable(c) != c and printable(f"name{c}") == f"name{printable(c)}"
