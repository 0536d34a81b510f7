"""A model name is a list of path segments, so `x` and `x/y` cannot both be models: on disk
`x` would be a file and a folder at once, on S3 both keys exist and every clone then fails.
The second of the two is refused in one line, wherever it would be created: an add, a push
to a remote that has the other, a pull or clone of one; a remote that holds both is refused."""
# ruff: noqa: F811

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from conftest import one_line_error, run_cli, tensors
from s3server import S3Bucket, s3_bucket, s3_server  # noqa: F401

from mgit import Repo, sync
from mgit.errors import ModelNameConflictError

requires_s3 = pytest.mark.skipif(
    not (importlib.util.find_spec("boto3") and importlib.util.find_spec("moto")),
    reason="needs the S3 extra (boto3) and moto",
)


@pytest.mark.parametrize(
    ("first", "second", "said"),
    [
        ("x", "x/y", "model name 'x/y' is under the model 'x'"),
        ("x/y", "x", "model name 'x' has models under it ('x/y')"),
    ],
)
def test_an_add_refuses_a_name_above_or_under_a_model(tmp_path: Path, first: str, second: str, said: str) -> None:
    repo = Repo.init(tmp_path / "repo")
    repo.add(tensors(1), name=first)
    before = run_cli("-C", str(repo.root), "ls", "--json")[1]
    from safetensors.numpy import save_file

    save_file(tensors(2), str(tmp_path / "m.safetensors"))

    one_line_error(run_cli("-C", str(repo.root), "add", str(tmp_path / "m.safetensors"), "--name", second), said)

    assert run_cli("-C", str(repo.root), "ls", "--json")[1] == before
    with pytest.raises(ModelNameConflictError):
        repo.add(tensors(3), name=second)
    assert list(Repo(repo.root).refs.all()) == [first]


def test_models_side_by_side_under_one_folder_are_fine(tmp_path: Path) -> None:
    repo = Repo.init(tmp_path / "repo")
    for name in ("org/a", "org/b", "orga", "org-b"):
        repo.add(tensors(len(name)), name=name)
    assert list(repo.refs.all()) == ["org-b", "org/a", "org/b", "orga"]


class NamesOnRemote:
    """Subclasses supply `url` (a fresh remote)."""

    @pytest.fixture
    def url(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    @pytest.mark.parametrize(
        ("first", "second", "said"),
        [
            ("x", "x/y", "model name 'x/y' is under the model 'x' on "),
            ("x/y", "x", "model name 'x' has models under it ('x/y' on "),
        ],
    )
    def test_a_push_of_a_name_above_or_under_one_on_the_remote_is_refused(
        self, url: str, tmp_path: Path, first: str, second: str, said: str
    ) -> None:
        alice, bob = Repo.init(tmp_path / "alice"), Repo.init(tmp_path / "bob")
        alice.add(tensors(1), name=first)
        bob.add(tensors(2), name=second)
        sync.push(alice, url)

        one_line_error(run_cli("-C", str(bob.root), "push", url), said)

        clone = sync.clone(url, tmp_path / "carol")
        assert clone.models == [first]

    def test_a_pull_of_a_name_under_a_local_model_is_refused(self, url: str, tmp_path: Path) -> None:
        alice, bob = Repo.init(tmp_path / "alice"), Repo.init(tmp_path / "bob")
        alice.add(tensors(1), name="x/y")
        sync.push(alice, url)
        bob.add(tensors(2), name="x")
        sync.add_remote(bob, "origin", url)
        heads = bob.refs.all()

        one_line_error(run_cli("-C", str(bob.root), "pull"), "model name 'x/y' is under the model 'x'")

        assert Repo(bob.root).refs.all() == heads


class TestFolderRemote(NamesOnRemote):
    @pytest.fixture
    def url(self, tmp_path: Path) -> str:
        sync.init_bare(str(tmp_path / "remote"))
        return str(tmp_path / "remote")


@requires_s3
class TestS3Remote(NamesOnRemote):
    @pytest.fixture
    def url(self, s3_bucket: S3Bucket) -> str:
        url = f"{s3_bucket.url}/team"
        sync.init_bare(url)
        return url

    def test_a_remote_holding_both_is_refused_by_a_clone(self, url: str, s3_bucket: S3Bucket, tmp_path: Path) -> None:
        alice = Repo.init(tmp_path / "alice")
        alice.add(tensors(1), name="x")
        sync.push(alice, url)
        vid = alice.resolve("x")
        # What an older mgit let two pushes make: S3 has no folders, so both keys can exist.
        s3_bucket.client().put_object(Bucket=s3_bucket.name, Key="team/refs/models/x/y", Body=f"{vid}\n".encode())

        err = one_line_error(
            run_cli("clone", url, str(tmp_path / "bob")), "model name 'x/y' is under the model 'x' on "
        )

        assert url in err
        assert not (tmp_path / "bob" / ".mgit").exists() or Repo(tmp_path / "bob").refs.all() == {}
