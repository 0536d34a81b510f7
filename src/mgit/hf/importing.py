"""`mgit import-hf`: every model repository of a Hugging Face cache becomes a model, each of
its cached revisions a version.

- Names: a hub id (`org/name`, or a legacy `name`) is already a valid model name almost
  always, and is used as it is, so that a model card's `base_model` names the model here
  too; an id MGit cannot hold as a name is mapped (`model_name`). Every imported version is
  tagged `hf.repo_id` (the hub id) and `hf.commit` (the revision's commit hash).
- Order: models whose cards name another model of the cache as `base_model` come after it;
  each model's revisions in commit order (mgit.hf.cache), `refs/main` last.
- Lineage: a revision's README.md front matter (`base_model`, `base_model_relation`) names
  its parents, the latest version of each such model here; with `auto_parent` a model whose
  card names none gets its first version's parent inferred from the weights. A later
  version without a card of its own keeps the parents of the one before it.
- Idempotent: a revision whose commit a version of the model already carries is not added
  again, so a second import of the same cache adds nothing, and a revision that appeared
  since adds one version (the newest, whatever its place in commit order).

Files are read through the snapshot links (`Repo.add` on the snapshot folder), each link
checked again right before (mgit.hf.cache: never a file outside the cache root); the cache is
never written to.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from mgit.errors import InputError, UnknownRefError
from mgit.formats.model_card import CARD, read_lineage
from mgit.hf.cache import CachedModel, CachedRevision, astray_files, read_cache
from mgit.index.refs import MAX_NAME, is_model_name
from mgit.repo.repository import Repo
from mgit.reports import Report
from mgit.util.parallel import StartProgress

REPO_ID_TAG = "hf.repo_id"
COMMIT_TAG = "hf.commit"
MAX_CARD_BYTES = 1 << 20  # a larger README.md is not read for lineage (as `mgit add`)


@dataclass(frozen=True)
class ImportedRevision(Report):
    """One cached revision added as a version (or, in a dry run, that would be)."""

    repo_id: str
    commit: str
    refs: list[str]  # refs of the cache naming it ("main"); empty for a detached revision
    model: str
    seq: int  # its number in the model's history (what it would get, in a dry run)
    version: str | None  # None in a dry run
    parents: list[str]  # refs of its lineage parents (model names, in a dry run)
    relation: str | None
    logical_bytes: int
    new_bytes: int  # what storing it added (0 in a dry run)
    notes: list[str] = field(default_factory=list)

    @property
    def ref(self) -> str:
        return f"{self.model}@{self.seq}"


@dataclass(frozen=True)
class ImportResult(Report):
    cache_dir: str
    dry_run: bool
    imported: list[ImportedRevision]
    already_imported: int  # revisions found here from an earlier import
    skipped: list[str]  # what was not imported, each named with why
    cache_bytes: int  # the cache's blobs on disk
    repository_bytes: int  # the repository's stored bytes, after the import
    notes: list[str] = field(default_factory=list)

    @property
    def models(self) -> list[str]:
        return list(dict.fromkeys(r.model for r in self.imported))


def import_cache(
    repo: Repo,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    dry_run: bool = False,
    auto_parent: bool = False,
    progress: StartProgress | None = None,
) -> ImportResult:
    """Import the model repositories of a Hugging Face cache (default: huggingface_hub's)
    into `repo` (see the module's docstring). `dry_run` lists what would be imported and
    changes nothing. Whatever cannot be imported is skipped and named in the result;
    `progress(total_bytes)` may return a callback for the bytes of each add."""
    listing = read_cache(cache_dir)
    skipped = list(listing.skipped)
    names: dict[str, str] = {}
    for model in listing.models:
        name = model_name(model.repo_id)
        if name is None or name in names.values():
            skipped.append(f"{model.repo_id}: no model name of its own here ({name or 'invalid'}); not imported")
        else:
            names[model.repo_id] = name
    hub_ids: dict[str, str] = {}  # lowercased -> the id: the hub compares ids without case
    for repo_id in sorted(names):
        hub_ids.setdefault(repo_id.lower(), repo_id)
    cards = {(m.repo_id, r.commit): _card(r) for m in listing.models for r in m.revisions}
    imported: list[ImportedRevision] = []
    already = 0
    planned: set[str] = set()  # models a dry run would have created by now
    needs = _dependencies(listing.models, cards, names, hub_ids, auto_parent)
    notes: list[str] = []
    for model in _bases_first(listing.models, needs, notes):
        name = names[model.repo_id]
        have = _imported_commits(repo, name, model.repo_id)
        if have is None:
            skipped.append(
                f"{model.repo_id}: the model {name!r} here was not imported from it; not imported "
                "(rename or remove that model first)"
            )
            continue
        count = _version_count(repo, name)
        for rev in model.revisions:
            if rev.commit in have:
                already += 1
                continue
            bases, relation, card_notes = _parents(
                repo, cards[(model.repo_id, rev.commit)], names, hub_ids, planned, name
            )
            infer = auto_parent and not bases and count == 0 and any(f.endswith(".safetensors") for f in rev.files)
            if dry_run:
                count += 1
                card_notes += ["auto-parent: the parent is inferred from the weights when it is added"] if infer else []
                planned.add(name)
                imported.append(
                    ImportedRevision(
                        model.repo_id,
                        rev.commit,
                        list(rev.refs),
                        name,
                        count,
                        None,
                        bases,
                        relation,
                        _size(rev),
                        0,
                        card_notes,
                    )
                )
                continue
            astray = astray_files(listing.path, model.path, rev)
            if astray:
                skipped.append(
                    f"{model.repo_id} revision {rev.commit[:12]}: {astray[0]} links outside the repository's "
                    "blobs (changed since the cache was read); not imported"
                )
                continue
            try:
                result = repo.add(
                    rev.snapshot,
                    name=name,
                    parent=bases or None,
                    relation=relation if bases else None,
                    message=_message(model.repo_id, rev),
                    tags={REPO_ID_TAG: model.repo_id, COMMIT_TAG: rev.commit},
                    model_card=False,
                    auto_parent=infer,
                    progress=progress,
                )
            except InputError as exc:
                skipped.append(f"{model.repo_id} revision {rev.commit[:12]}: {exc}")
                continue
            count = result.seq
            imported.append(
                ImportedRevision(
                    model.repo_id,
                    rev.commit,
                    list(rev.refs),
                    name,
                    result.seq,
                    result.version,
                    [p.ref for p in result.parents],
                    result.parents[0].relation if result.parents else None,
                    result.logical_bytes,
                    result.new_bytes,
                    card_notes + result.notes,
                )
            )
    stored = repo.du().stored_bytes
    return ImportResult(str(listing.path), dry_run, imported, already, skipped, listing.size_on_disk, stored, notes)


def model_name(repo_id: str) -> str | None:
    """The model name a hub id is imported as: the id itself when it is a valid model name
    (`org/name`), else the id with what a name cannot hold replaced by '-'; None if even
    that is not a name."""
    if is_model_name(repo_id):
        return repo_id
    parts = [re.sub(r"[^A-Za-z0-9._-]", "-", p).lstrip("._-").replace("..", ".") for p in repo_id.split("/", 1)]
    name = "/".join(p for p in parts if p)[:MAX_NAME].rstrip(".")
    if name.endswith(".lock"):
        name += "-hf"
    return name if is_model_name(name) else None


def _card(rev: CachedRevision) -> tuple[list[str], str | None]:
    """The base models a revision's model card names, and its relation (MGit's word)."""
    card = rev.snapshot / CARD
    if CARD not in rev.files or card.stat().st_size > MAX_CARD_BYTES:
        return [], None
    found = read_lineage(card.read_text(encoding="utf-8", errors="replace"))
    return (found.base_models, found.relation) if found else ([], None)


def _dependencies(
    models: list[CachedModel],
    cards: dict[tuple[str, str], tuple[list[str], str | None]],
    names: dict[str, str],
    hub_ids: dict[str, str],
    auto_parent: bool,
) -> dict[str, set[str]]:
    """For each model to import, the models of the cache to import before it: those its
    cards name as base_model (hub ids compared without case, as the hub does) and, with
    `auto_parent`, for a model whose cards name none of them, the one parent inference
    chooses among the cache's models (so that it is stored when the model is added).

    Inference cannot tell which of two near-identical models came first, so an inferred
    parent is kept only if it looks more like a base than the model: named as base_model by
    a card of the cache, else downloaded earlier, else first by name."""
    by_id = {m.repo_id: m for m in models if m.repo_id in names}
    needs = {
        repo_id: {
            hub_ids[b.lower()]
            for r in m.revisions
            for b in cards[(repo_id, r.commit)][0]
            if hub_ids.get(b.lower(), repo_id) != repo_id
        }
        for repo_id, m in by_id.items()
    }
    if auto_parent:
        named = {b.lower() for bases, _ in cards.values() for b in bases}
        rank = sorted(needs, key=lambda i: (i.lower() not in named, by_id[i].revisions[0].last_modified, i))
        before = {repo_id: set(rank[:n]) for n, repo_id in enumerate(rank)}
        inferred = _inferred_parents([by_id[i] for i in rank], {i for i in rank if not needs[i]})
        for repo_id, parents in inferred.items():
            needs[repo_id] = parents & before[repo_id]
    return needs


def _inferred_parents(models: list[CachedModel], asked: set[str]) -> dict[str, set[str]]:
    """The cache models that the first revision of each model in `asked` looks derived
    from, by parent inference over first revisions' weights (as `Repo.add(auto_parent=True)`
    will judge it)."""
    from mgit.formats.folder import scan_path
    from mgit.lineage.inference import suggest
    from mgit.lineage.sketch import sketch_source

    sketches = {}
    for m in models:
        if any(f.endswith(".safetensors") for f in m.revisions[0].files):
            try:
                sketches[m.repo_id] = sketch_source(scan_path(m.revisions[0].snapshot))
            except InputError:
                continue  # the add names what is wrong with it
    found = {}
    for repo_id, sketch in sketches.items():
        if repo_id not in asked:
            continue
        others = [(other, other, s) for other, s in sketches.items() if other != repo_id]
        if others and len(sketch):
            found[repo_id] = set(suggest(sketch, others, label=repo_id).parents)
    return found


def _bases_first(models: list[CachedModel], needs: dict[str, set[str]], notes: list[str]) -> list[CachedModel]:
    """Models to import, each after the models it needs (`_dependencies`); a cycle is broken
    by name order."""
    by_id = {m.repo_id: m for m in models if m.repo_id in needs}
    order: list[CachedModel] = []
    done: set[str] = set()
    while len(order) < len(by_id):
        ready = sorted(i for i in needs if i not in done and needs[i] <= done)
        if not ready:
            left = sorted(i for i in needs if i not in done)
            notes.append(
                f"{', '.join(left)} name or look derived from each other; {left[0]} is imported first, "
                "without those parents"
            )
            ready = left[:1]
        for repo_id in ready:
            done.add(repo_id)
            order.append(by_id[repo_id])
    return order


def _parents(
    repo: Repo,
    card: tuple[list[str], str | None],
    names: dict[str, str],
    hub_ids: dict[str, str],
    planned: set[str],
    own: str,
) -> tuple[list[str], str | None, list[str]]:
    """The parents (model names) a revision's card names that exist here (or that a dry run
    would have created), their relation, and notes on those that do not. A card naming its
    own model names no parent (that is history)."""
    bases, relation = card
    found, missing = [], []
    for base in bases:
        name = names[hub_ids[base.lower()]] if base.lower() in hub_ids else model_name(base)
        if name == own:
            continue
        if name is not None and (name in planned or _version_count(repo, name)):
            found.append(name)
        else:
            missing.append(base)
    notes = (
        [
            f"{CARD} names base_model {', '.join(map(repr, missing))}, in neither the cache nor this repository: "
            "not recorded as a parent"
        ]
        if missing
        else []
    )
    found = list(dict.fromkeys(found))
    return found, (relation or ("merge" if len(found) > 1 else "finetune")) if found else None, notes


def _imported_commits(repo: Repo, name: str, repo_id: str) -> set[str] | None:
    """Commits of `repo_id` that versions of `name` carry already; None when `name` exists
    but none of its versions came from `repo_id` (a model of the same name made here)."""
    try:
        versions = repo.log(name)
    except UnknownRefError:
        return set()
    commits = {v.tags[COMMIT_TAG] for v in versions if v.tags.get(REPO_ID_TAG) == repo_id and COMMIT_TAG in v.tags}
    return commits or None


def _version_count(repo: Repo, name: str) -> int:
    try:
        return repo.info(name).seq
    except UnknownRefError:
        return 0


def _message(repo_id: str, rev: CachedRevision) -> str:
    refs = f" ({', '.join(f'refs/{r}' for r in rev.refs)})" if rev.refs else ""
    return f"Imported from the Hugging Face cache: {repo_id} at commit {rev.commit}{refs}"


def _size(rev: CachedRevision) -> int:
    return sum((rev.snapshot / f).stat().st_size for f in rev.files)
