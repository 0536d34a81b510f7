"""Model heads: name validation, compare-and-swap, and locks that time out cleanly."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from mgit.errors import InvalidNameError, LockTimeoutError, RefConflictError
from mgit.index.refs import RefStore, validate_model_name
from mgit.util.locks import FileLock

A, B, C = "a" * 64, "b" * 64, "c" * 64


@pytest.mark.parametrize("name", ["bert", "bert-base.v2", "org/model_1", "A1"])
def test_valid_names(name: str) -> None:
    assert validate_model_name(name) == name


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("", "empty"),
        ("../x", "characters"),
        ("a/../b", "characters"),
        ("a@b", "characters"),
        ("/abs", "characters"),
        ("a/b/c", "characters"),
        ("x" * 200, "longer"),
        ("a..b", "'..'"),
        ("m.lock", ".lock"),
        ("-flag", "characters"),
        ("a b", "characters"),
    ],
)
def test_invalid_names(name: str, why: str) -> None:
    with pytest.raises(InvalidNameError, match=why):
        validate_model_name(name)


def test_compare_and_swap(tmp_path: Path) -> None:
    refs = RefStore(tmp_path)
    assert refs.get("m") is None
    refs.update("m", A, expected=None)
    refs.update("m", B, expected=A)
    with pytest.raises(RefConflictError, match="moved while updating"):
        refs.update("m", C, expected=A)
    assert refs.get("m") == B
    refs.update("org/m", A, expected=None)
    assert refs.all() == {"m": B, "org/m": A}
    refs.update("m", None, expected=B)
    assert refs.all() == {"org/m": A}


def test_damaged_ref_is_reported(tmp_path: Path) -> None:
    refs = RefStore(tmp_path)
    refs.update("m", A, expected=None)
    (tmp_path / "refs" / "models" / "m").write_text("garbage\n")
    with pytest.raises(Exception, match="head of model 'm' is damaged"):
        refs.get("m")


def _hold_lock(path: str, ready: multiprocessing.synchronize.Event, release: multiprocessing.synchronize.Event) -> None:
    with FileLock(Path(path), what="model 'm'"):
        ready.set()
        release.wait(30)


def test_lock_held_by_another_process_times_out_with_a_retryable_message(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(str(tmp_path / "m.lock"), ready, release))
    holder.start()
    try:
        assert ready.wait(30)
        with (
            pytest.raises(LockTimeoutError, match="try again"),
            FileLock(tmp_path / "m.lock", what="model 'm'", timeout=0.3),
        ):
            pass
        # Shared locks conflict with the exclusive holder too.
        with pytest.raises(LockTimeoutError), FileLock(tmp_path / "m.lock", what="x", shared=True, timeout=0.2):
            pass
    finally:
        release.set()
        holder.join(30)
    with FileLock(tmp_path / "m.lock", what="model 'm'", timeout=5):
        pass


def test_lock_of_a_killed_holder_is_released(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(str(tmp_path / "m.lock"), ready, release))
    holder.start()
    assert ready.wait(30)
    holder.kill()
    holder.join(30)
    with FileLock(tmp_path / "m.lock", what="model 'm'", timeout=5):
        pass


def test_shared_locks_coexist(tmp_path: Path) -> None:
    with (
        FileLock(tmp_path / "r.lock", what="repo", shared=True),
        FileLock(tmp_path / "r.lock", what="repo", shared=True, timeout=0.5),
    ):
        pass


def test_a_ref_value_that_is_no_version_id_is_an_mgit_error(tmp_path: Path) -> None:
    from mgit.errors import MgitError

    refs = RefStore(tmp_path)
    with pytest.raises(MgitError, match="must name a version id"):
        refs.update("m", "not-a-version", expected=None)
    assert refs.get("m") is None


def test_many_new_refs_are_refused_when_one_is_above_or_under_another(tmp_path: Path) -> None:
    """`update_many` (a clone's thousand refs) checks names above and under each other by
    bisection: each way round, and against refs already there."""
    from mgit.errors import ModelNameConflictError

    refs = RefStore(tmp_path)
    names = {f"m{i:04d}": (A, None) for i in range(300)}
    refs.update_many({**names, "team/solo": (B, None)})
    assert len(refs.all()) == 301
    for clash, other in (("m0007/x", "m0007"), ("team", "team/solo")):
        with pytest.raises(ModelNameConflictError, match=other):
            refs.update_many({clash: (C, None)})
    with pytest.raises(ModelNameConflictError, match="'new' has models under it \\('new/a'"):
        refs.update_many({"new": (A, None), "new/a": (B, None), "new/b": (B, None), "zz": (C, None)})
    assert "new" not in refs.all() and "zz" not in refs.all()


def test_a_damaged_ref_or_a_fifo_among_the_refs_is_named_without_blocking(tmp_path: Path) -> None:
    import os
    import threading

    from mgit.errors import DamagedRefError

    refs = RefStore(tmp_path)
    refs.dir.mkdir(parents=True)
    oid = "ab" * 32
    (refs.dir / "good").write_text(oid + "\n")
    assert refs.get("good") == oid and refs.all() == {"good": oid} and refs.get("absent") is None
    (refs.dir / "cut").write_text(oid[:40])
    with pytest.raises(DamagedRefError, match="cut"):
        refs.all()
    (refs.dir / "cut").unlink()
    os.mkfifo(refs.dir / "pipe")  # no writer: a blocking open would wait for one forever
    found: list[BaseException] = []

    def read() -> None:
        for ask in (lambda: refs.get("pipe"), refs.all):
            try:
                ask()
            except DamagedRefError as exc:
                found.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=20)
    assert not reader.is_alive() and len(found) == 2 and all("pipe" in str(e) for e in found)
