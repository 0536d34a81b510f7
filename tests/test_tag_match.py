"""`KEY[=VALUE]` against a version's tags (mgit.store.objects.tag_matches): the graph's
`--tag`, a test attached to `tag:...` and the web app's tag filter choose the same models."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import tensors

from mgit import Repo
from mgit.checks import Checks
from mgit.store.objects import tag_matches
from mgit.web.models import models_page
from mgit.web.repoview import RepoView

TAGS = {"a": {"task": "nli"}, "b": {"task": "sst2", "size": "big"}, "c": {}, "d": {"note": "x=y"}}
QUERIES = {"task": ["a", "b"], "task=nli": ["a"], "task=": [], "size=big": ["b"], "note=x=y": ["d"], "nope": []}


def test_a_key_matches_any_value_and_key_value_that_value() -> None:
    assert tag_matches("task", {"task": ""}) and tag_matches("task=", {"task": ""})
    assert not tag_matches("task=nli", {"task": "nli2"}) and not tag_matches("task", {"Task": "nli"})
    assert tag_matches("a=b=c", {"a": "b=c"}) and not tag_matches("a=b", {"a": "b=c"})  # the first `=` ends the key


@pytest.fixture
def tagged(repo: Repo) -> Repo:
    for seed, (name, tags) in enumerate(TAGS.items()):
        repo.add(tensors(seed), name=name, tags=tags)
    (repo.root / "evals.py").write_text("def size(folder):\n    return {'n': 1.0}\n")
    return repo


@pytest.mark.parametrize("query", QUERIES)
def test_graph_tests_and_the_web_app_select_the_same_models(tagged: Repo, query: str) -> None:
    assert tagged.lineage.select(tag=query) == QUERIES[query]
    checks = Checks(tagged)
    checks.attach(f"tag:{query}", str(Path(tagged.root) / "evals.py:size"), name="t")
    assert [m for m in TAGS if checks.applicable(m)] == QUERIES[query]
    page = models_page(RepoView(tagged), {"tag": query})
    assert [m["name"] for m in page["models"]] == QUERIES[query]
