"""The README's sharing walkthrough, run line by line as it is written: two people, a folder
remote, a refused push, a pull that replays, a fast-forward."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
from conftest import make_model, run_cli, tensors

README = Path(__file__).resolve().parents[1] / "README.md"
LINE = re.compile(r"^(?P<who>\w+)\$\s+(?P<command>[^#]+?)\s*(?:#\s*(?P<comment>.*))?$")


def walkthrough() -> list[tuple[str, list[str], str]]:
    text = README.read_text()
    block = text.split("<!-- sharing-walkthrough -->", 1)[1].split("<!-- /sharing-walkthrough -->", 1)[0]
    steps = []
    for line in block.splitlines():
        m = LINE.match(line.strip())
        if m:
            steps.append((m["who"], shlex.split(m["command"]), m["comment"] or ""))
    return steps


def model_for(folder: Path) -> None:
    """A small model folder for `mgit add NAME`: bert-base, and fine-tunes of it."""
    seed = sum(map(ord, folder.name))
    state = tensors(1, width=32)
    if folder.name != "bert-base":
        rng = np.random.default_rng(seed)
        state = {
            k: v + rng.standard_normal(v.shape).astype(v.dtype) * np.float32(1e-3) if v.dtype == np.float32 else v
            for k, v in state.items()
        }
    make_model(folder, state=state)


def test_the_sharing_walkthrough_runs_as_written(tmp_path: Path) -> None:
    steps = walkthrough()
    assert len(steps) >= 12 and {who for who, _, _ in steps} == {"alice", "bob"}
    for who in ("alice", "bob"):
        (tmp_path / who).mkdir()
    for who, command, comment in steps:
        assert command[0] == "mgit"
        cwd = tmp_path / who
        if command[1] == "add" and not (cwd / command[2]).exists():
            model_for(cwd / command[2])
        code, out, err = run_cli(*command[1:], cwd=cwd)
        said = f"{who}$ {shlex.join(command)}\n{out}{err}"
        if comment.startswith("refused: "):
            assert code == 1 and comment.removeprefix("refused: ") in err, said
            continue
        assert code == 0, said
        for phrase in ("renumbered bert-sst2@2 -> bert-sst2@3", "fast-forward"):
            if phrase in comment:
                assert phrase in out, said
    alice, bob = (tmp_path / "alice"), (tmp_path / "bob")
    code, out, _ = run_cli("log", "bert-sst2", "--json", cwd=alice)
    assert [v["message"] for v in json.loads(out)][:2] == ["lr 1e-5", "3 epochs"]
    assert run_cli("ls", "--json", cwd=alice)[1] == run_cli("ls", "--json", cwd=bob)[1]
