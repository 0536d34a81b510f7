"""Manifest -> files: rebuild each file of a version under an output folder, atomically,
decoding its tensors (or the blocks of large ones) ahead on a thread pool that writes each
where it belongs, and check every rebuilt file against the digest recorded when it was
added."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import blake3
import numpy as np

from mgit.errors import ChecksumMismatchError, InputError, OutputNotEmptyError, StrayFilesError, UnsafePathError
from mgit.reports import FileInfo, Report
from mgit.store.base import ObjectStore
from mgit.store.cache import CHECKOUT_BASES, DecodedCache
from mgit.store.lossy_policy import describe
from mgit.store.objectformat import Expected, file_objects_expected
from mgit.store.objects import FileEntry, Manifest, Version, check_relative_path
from mgit.util.atomicfile import TMP_PREFIX, atomic_writer, write_atomic
from mgit.util.faults import crash_point
from mgit.util.parallel import Progress, StartProgress, ordered_map


@dataclass(frozen=True)
class CheckoutResult(Report):
    """A version written out by `checkout`: its files, their bytes, notes, and a model signature if asked."""

    model: str
    version: str
    seq: int
    out_dir: str
    files: list[FileInfo]
    bytes: int
    notes: list[str] = field(default_factory=list)
    model_signature: str | None = None  # the OpenSSF model signature written over the folder, if asked
    signer: str | None = None  # its key: type and fingerprint (`ecdsa-sha2-nistp256 SHA256:...`)


class _Mismatch(Exception):
    """Raised inside the writer so that the temporary file is removed."""


def safe_join(root: Path, rel: str) -> Path:
    """`root/rel`, refusing anything that could land outside `root`: a path a manifest could
    not hold, or a link planted anywhere on the way in the output folder."""
    check_relative_path(rel)
    parts = rel.split("/")
    target = root.joinpath(*parts)
    probe = root
    for p in parts:
        probe = probe / p
        if probe.is_symlink():
            raise UnsafePathError(rel, f"{probe} is a link")
    return target


# object, offset in the file, block (None: whole; -1: a piece of a skeleton), bytes
Item = tuple[str, int, "int | None", int]
SKELETON_PIECE = -1
SKELETON_FILES = ("torch-zip", "gguf")  # a skeleton blob with its tensors at `storage_offsets`


def _skeleton_pieces(entry: FileEntry) -> list[Item]:
    """A checkpoint's skeleton is the file less its storages: the pieces of it between them,
    each as (where it starts in the skeleton, its offset in the file, SKELETON_PIECE, bytes)."""
    pieces: list[Item] = []
    cursor = taken = 0
    for at, t in zip([*entry.storage_offsets, entry.size], [*entry.tensors, None], strict=True):
        if at > cursor:
            pieces.append((str(taken), cursor, SKELETON_PIECE, at - cursor))
            taken += at - cursor
        cursor = at + (t.nbytes if t is not None else 0)
    return pieces


def _items(store: ObjectStore, entry: FileEntry, expected: dict[str, Expected]) -> tuple[list[Item], dict[str, int]]:
    """The work of rebuilding a file: (object, its offset in the file, block k or None for
    an object decoded whole, bytes), each object's header checked against what the entry
    expects of it; and how often each delta base will be asked for whole (a planned cache
    releases it after its last use). A checkpoint's storages go between the pieces of its
    skeleton (`_skeleton_pieces`), in file order."""
    items: list[Item] = []
    uses: dict[str, int] = {}
    offset = 0
    torch_zip = entry.type in SKELETON_FILES
    objects = [t.object for t in entry.tensors] if torch_zip else [entry.object, *(t.object for t in entry.tensors)]
    if torch_zip:
        store.block_table(entry.object, expected[entry.object])
    for i, oid in enumerate(objects):
        if torch_zip:
            offset = entry.storage_offsets[i]
        header = store.block_table(oid, expected[oid]).header  # checked before anything is decoded
        if header.blocks:
            items += [
                (oid, offset + start, k, stop - start)
                for k, (start, stop) in enumerate(map(header.block_span, range(header.block_count)))
            ]
        else:
            items.append((oid, offset, None, header.size))
        for base in header.bases:  # a base coded otherwise than in the same blocks is decoded whole
            if not header.blocks or store.block_table(base).header.blocks != header.blocks:
                uses[base] = uses.get(base, 0) + header.block_count
        offset += header.size
    if torch_zip:
        items = sorted(items + _skeleton_pieces(entry), key=lambda item: item[1])
    return items, uses


def restore_file(
    store: ObjectStore,
    entry: FileEntry,
    out_dir: Path,
    *,
    pool: ThreadPoolExecutor,
    jobs: int,
    reuse: DecodedCache,
    progress: Progress | None = None,
) -> Path:
    """Rebuild one file under `out_dir` atomically and check its size and digest.

    The workers decode objects, or blocks of large ones, ahead and write each at its offset
    in the file (allocated up front); this thread hashes them in file order. Objects are not
    hashed one by one: the file's digest covers every byte of them (and so their bases).
    When it does not match, each object is verified, so that the error names a damaged one."""
    target = safe_join(out_dir, entry.path)
    target.parent.mkdir(parents=True, exist_ok=True)
    expected = file_objects_expected(entry)
    items, uses = _items(store, entry, expected)
    reuse.expect(uses)
    skeleton = None
    if entry.type in SKELETON_FILES:  # small: decoded once, its pieces written between the storages
        skeleton = store.get(entry.object, expect=expected[entry.object])[1]
    hasher, written = blake3.blake3(), 0
    try:
        with atomic_writer(target, sync_dir=False, size=entry.size) as fh:
            fd = fh.fileno()
            _allocate(fd, entry.size)

            def rebuild(oid: str, offset: int, k: int | None, n: int) -> np.ndarray:
                if k == SKELETON_PIECE:
                    assert skeleton is not None
                    data = skeleton[int(oid) : int(oid) + n]
                elif k is None:  # (a session keeps what it decodes: verified, as everything it holds)
                    data = store.get(oid, reuse=reuse, verify=reuse.keep_all, expect=expected[oid])[1]
                else:
                    data = store.decode_block(oid, k, reuse=reuse)
                if os.pwrite(fd, data, offset) != data.nbytes:  # the disk took fewer bytes
                    raise OSError(errno.ENOSPC, f"short write to {target}")
                return data

            for data in ordered_map(pool, rebuild, items, jobs=jobs, size=lambda item: item[3]):
                hasher.update(data)
                written += data.nbytes
                crash_point("checkout-piece-written")
                if progress:
                    progress(data.nbytes)
            if written != entry.size or hasher.hexdigest() != entry.digest:
                raise _Mismatch
    except _Mismatch:
        store.explain([entry.object, *(t.object for t in entry.tensors)])
        raise ChecksumMismatchError(entry.path) from None
    return target


def _allocate(fd: int, size: int) -> None:
    """Reserve the file's blocks up front (one extent, and a full disk known now)."""
    if size:
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
            os.ftruncate(fd, size)


def stray_files(out_dir: Path, paths: set[str]) -> list[str]:
    """Files (and links) under a folder that are not among a version's `paths`, sorted, but for
    the temporary files a killed checkout leaves (`.tmp-*`); links to folders are not followed."""
    strays = []
    for dirpath, dirs, names in os.walk(out_dir):
        here = Path(dirpath)
        for d in list(dirs):
            if (here / d).is_symlink():
                dirs.remove(d)
                names.append(d)
        for name in names:
            rel = (here / name).relative_to(out_dir).as_posix()
            if rel not in paths and not name.startswith(TMP_PREFIX):  # an interrupted checkout's own: not a stray
                strays.append(rel)
    return sorted(strays)


def remove_strays(out_dir: Path, strays: list[str]) -> None:
    """Remove these files of a folder, then the folders they leave empty."""
    for rel in strays:
        (out_dir / rel).unlink(missing_ok=True)
    for rel in sorted({str(Path(r).parent) for r in strays if "/" in r}, key=len, reverse=True):
        folder = out_dir / rel
        while folder != out_dir and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
            folder = folder.parent


def restore_manifest(
    store: ObjectStore,
    manifest: Manifest,
    out_dir: Path,
    *,
    jobs: int,
    reuse: DecodedCache | None = None,
    progress: Progress | None = None,
) -> None:
    """Rebuild every file of a manifest under `out_dir`, created if need be (a version need
    not exist yet). A lazy clone's store fetches every object it lacks first, in parallel;
    `reuse` keeps delta bases across the files (the shards of one checkpoint share them)."""
    for f in manifest.files:
        safe_join(out_dir, f.path)  # refuse before writing anything
    out_dir.mkdir(parents=True, exist_ok=True)
    if store.lazy:
        store.fetch(manifest.object_ids())
    cache = reuse if reuse is not None else DecodedCache(CHECKOUT_BASES, planned=True)
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="mgit-restore") as pool:
        for f in manifest.files:
            restore_file(store, f, out_dir, pool=pool, jobs=jobs, reuse=cache, progress=progress)


def checkout_version(
    store: ObjectStore,
    vid: str,
    model: str,
    seq: int,
    out: Path,
    *,
    force: bool,
    clean: bool,
    jobs: int,
    reuse: DecodedCache,
    progress: StartProgress | None,
    model_card: bool,
    model_of: Callable[[str], str],
) -> CheckoutResult:
    """`Repo.checkout` once the reference is resolved: refuse an output folder that would
    lose files, rebuild the version there, then remove strays (`clean`) and write the model
    card (`model_card`; `model_of` names a parent's model). `model` is the name the version
    is under now (its record's, unless the model was renamed). The result's notes say what
    else was done."""
    version = store.get_version(vid)
    manifest = store.get_manifest(version.manifest)
    if out.exists() and not out.is_dir():
        raise InputError(str(out), "exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not (force or clean):
        raise OutputNotEmptyError(str(out))
    strays = stray_files(out, {f.path for f in manifest.files}) if out.is_dir() else []
    if strays and not clean:
        raise StrayFilesError(str(out), f"{model}@{seq}", strays)
    tick = progress(manifest.logical_bytes) if progress else None
    restore_manifest(store, manifest, out, jobs=jobs, reuse=reuse, progress=tick)
    notes = [f"{f.path} was rebuilt as safetensors from {f.converted_from}" for f in manifest.files if f.converted_from]
    if strays:
        remove_strays(out, strays)
        notes.append(
            f"removed {len(strays)} file{'s' if len(strays) != 1 else ''} that {model}@{seq} "
            f"does not hold: {', '.join(strays[:5])}{' ...' if len(strays) > 5 else ''}"
        )
    if model_card:
        notes.append(_write_card(version, out, model_of))
    if version.lossy:
        notes.append(
            f"these files are a lossy reconstruction of what was added: {describe(version.lossy)} "
            f"(measured max error {version.lossy.get('max_error'):.3g})"
        )
    files = [FileInfo(f.path, f.type, f.size, f.digest, len(f.tensors), f.converted_from) for f in manifest.files]
    return CheckoutResult(model, vid, seq, str(out), files, manifest.logical_bytes, notes)


def _write_card(version: Version, out: Path, model_of: Callable[[str], str]) -> str:
    from mgit.formats.model_card import CARD, write_lineage

    if not version.parents:
        return f"{CARD} left as it was: {version.model} has no lineage parents"
    names = [model_of(p.version) for p in version.parents]
    card = out / CARD
    text = card.read_text(encoding="utf-8") if card.is_file() else None
    write_atomic(card, [write_lineage(text, names, version.parents[0].relation).encode()])
    return f"{CARD}: base_model {', '.join(names)} ({version.parents[0].relation}) written into its front matter"
