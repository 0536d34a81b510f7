"""The two walks over what versions link to (mgit.store.objects): a model's history, newest
first (`walk_history`), and every reachable version, ancestors first (`ancestors_first`);
each checked alone and through the modules that walk with it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import add_lineage, tensors

from mgit import Repo
from mgit.errors import MgitError
from mgit.index.catalog import Catalog
from mgit.store.memory import MemoryStore
from mgit.store.objects import Manifest, Parent, Version, ancestors_first, walk_history
from mgit.store.transfer import history


def test_walk_history_is_newest_first_reads_no_further_than_asked_and_ends_on_a_loop() -> None:
    links = {"c": "b", "b": "a", "a": None}
    asked: list[str] = []

    def predecessor(v: str) -> str | None:
        asked.append(v)
        return links[v]

    assert list(walk_history("c", predecessor)) == ["c", "b", "a"]
    asked.clear()
    walk = walk_history("c", predecessor)
    assert [next(walk), next(walk)] == ["c", "b"] and asked == ["c"]  # "b" not asked: the walk stopped at it
    assert list(walk_history("x", {"x": "y", "y": "x"}.get)) == ["x", "y"]
    assert list(walk_history(None, links.get)) == []


def test_a_repository_and_its_lineage_walk_the_same_history(repo: Repo) -> None:
    add_lineage(repo, "m", "m", "m", "other")
    vids = [v.id for v in repo.log("m")]  # newest first
    assert repo.chain(vids[0]) == vids == [n.id for n in repo.lineage.versions("m")]
    assert repo.chain(vids[1]) == vids[1:]


def test_ancestors_first_puts_each_version_after_all_it_links_to() -> None:
    links = {"d": ["c", "b"], "c": ["a"], "b": ["a"], "a": [], "e": ["a"]}
    asked: list[str] = []

    def linked(v: str) -> list[str]:
        asked.append(v)
        return links[v]

    order = ancestors_first(["d", "e"], linked)
    assert sorted(order) == sorted(links) and sorted(asked) == sorted(links)  # each asked once
    assert all(order.index(p) < order.index(v) for v in links for p in links[v])
    assert order[-1] == "e"  # the first tip's history first
    assert ancestors_first(["d"], links.__getitem__, stop={"a", "b"}.__contains__) == ["c", "d"]


def _long_history(n: int) -> tuple[MemoryStore, list[str]]:
    """A store holding one model's history of `n` versions (records only, each from the
    third on also derived from the first), oldest first."""
    store, vids = MemoryStore(), []
    manifest = store.put_record("manifest", Manifest(()).to_json()).oid
    for i in range(n):
        parents = (Parent(vids[0], "finetune"),) if i > 1 else ()
        version = Version("m", manifest, parents, vids[-1] if vids else None, f"v{i}", time="2024-01-01T00:00:00Z")
        vids.append(store.put_record("version", version.to_json()).oid)
    return store, vids


def test_a_history_longer_than_the_recursion_limit_is_indexed_and_sent_ancestors_first(tmp_path: Path) -> None:
    n = sys.getrecursionlimit() + 100
    store, vids = _long_history(n)
    assert history(store, [vids[-1]]) == vids  # what a push sends
    assert history(store, [vids[-1]], stop=set(vids[:-3]).__contains__) == vids[-3:]
    catalog = Catalog(tmp_path / "catalog.sqlite")
    catalog.index(store, vids[-1])  # what the catalog indexes: every predecessor first
    assert [catalog.version(v).seq for v in (vids[0], vids[-1])] == [1, n]


def test_a_remote_history_is_walked_the_same_by_show_and_by_push(tmp_path: Path) -> None:
    from mgit import sync

    url = str(tmp_path / "remote.mgit")
    sync.init_bare(url)
    alice = Repo.init(tmp_path / "alice")
    sync.add_remote(alice, "origin", url)
    for seed in range(3):
        alice.add(tensors(seed), name="m")
    sync.push(alice)
    sync.clone(url, tmp_path / "bob")
    bob = Repo(tmp_path / "bob")
    for seed in (3, 4):
        alice.add(tensors(seed), name="m")
    sync.push(alice)
    bob.add(tensors(9), name="m")
    [show] = sync.remote_show(bob).models
    assert (show.state, show.ahead, show.behind) == ("diverged", 1, 2)
    with pytest.raises(MgitError, match="has @5"):  # the remote's head, numbered by its history
        sync.push(bob)
    [forced] = sync.push(bob, force=True).models
    assert "drops 2 versions of origin's history, up to @5" in (forced.note or "")
