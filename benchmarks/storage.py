"""Storage benchmark (issue 3): what a family of related models costs to store, and how fast it
goes in and comes back out, under MGit and under the schemes it is measured against.

    python benchmarks/storage.py                 # the full MiniLM family (10 members, 757 MB)
    python benchmarks/storage.py --quick         # smoke test: demo family, MGit lossless and zstd
    python benchmarks/storage.py --runs 1 --no-doc

The family comes from `minilm_family.build_family`, cached under `.cache/family-full/` (the demo
preset of --quick under `.cache/demo-family/`, shared with the tour).
Schemes: MGit lossless (a real repository, members added parents first with their lineage);
zstd -3 on every file; ZipNN on every floating tensor; the original MGit prototype's lossy
scheme (quantized deltas + LZMA), reimplemented here; and MGit's own lossy mode when
`Repo.add` has one. The results are printed and written, between the `storage` markers, into
docs/benchmarks.md; the rest of that file is left as it is.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
import zstandard
from core import empty_dir, machine, table, warm_page_cache, write_doc
from mgit_prototype import ParameterStore, decode_folder, encode_folder
from minilm_family import WEIGHTS, EvalResult, Member, build_family, evaluate
from safetensors.torch import load_file

import mgit
from mgit import Repo
from mgit.errors import MgitError
from mgit.formats.safetensors import read_layout

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache"
FAMILY_DIRS = {"demo": CACHE / "demo-family", "full": CACHE / "family-full"}  # demo: shared with demo/tour.py
BEGIN, END = "<!-- storage:begin -->", "<!-- storage:end -->"
MB = 1e6
ZSTD_LEVEL = 3
PROTOTYPE_EPS = 1e-4  # the original scheme's error parameter; its quantization step is 2 ln(1 + eps)
# MGit's own lossy mode: absolute bounds, a bound relative to each tensor's change, and both
# (roots quantized within 1e-4, changes within 0.1 x their rms).
LOSSY = ({"lossy": 1e-4}, {"lossy": 1e-3}, {"lossy_rel": 0.1}, {"lossy": 1e-4, "lossy_rel": 0.1})
ZIPNN_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}  # what ZipNN can model
SESSION = ", one session"  # the scheme run inside repo.caching()
TARGETS = {"lossless": 4.0, "lossy": 8.0, "agreement": 0.995, "add": 300.0, "checkout": 500.0}
PAPER_REFERENCE = 5.6  # the original scheme's reduction at eps = 1e-4, as the issue quotes it
T = TypeVar("T")


@dataclass(frozen=True)
class Fidelity:
    """How far a lossy reconstruction of one member is from the original."""

    max_abs_error: float
    task: str | None = None
    accuracy: float | None = None  # held-out accuracy of the reconstruction
    original_accuracy: float | None = None
    agreement: float | None = None  # fraction of held-out predictions equal to the original's


@dataclass
class SchemeResult:
    """What one scheme did with the family: bytes stored per member and in all, and timings."""

    name: str
    lossless: bool = True
    stored: dict[str, int] = field(default_factory=dict)  # what adding each member cost
    total: int = 0
    add: list[float] = field(default_factory=list)  # seconds per run, whole family
    checkout: list[float] = field(default_factory=list)
    fidelity: dict[str, Fidelity] = field(default_factory=dict)
    note: str = ""  # why it did not run, or what to know about it
    per_member: bool = True  # False: stores what another scheme stores, shown only in the totals

    def rate(self, which: str, nbytes: int) -> float:
        """MB/s of the median run of "add" or "checkout" over `nbytes` of files."""
        seconds = sorted(getattr(self, which))
        return nbytes / seconds[len(seconds) // 2] / MB


# --- the family ----------------------------------------------------------------------------------


def files_of(folder: Path) -> list[Path]:
    """The files of a model folder, relative to it, sorted."""
    return sorted(p.relative_to(folder) for p in folder.rglob("*") if p.is_file())


def folder_bytes(folder: Path, suffix: str = "") -> int:
    """Sum of the sizes of a folder's files (those ending in `suffix`)."""
    return sum((folder / f).stat().st_size for f in files_of(folder) if f.name.endswith(suffix))


def folder_total(family: list[Member], suffix: str = "") -> int:
    """Raw bytes of the whole family (of the files ending in `suffix`)."""
    return sum(folder_bytes(m.path, suffix) for m in family)


def eps_text(eps: float) -> str:
    """An error bound as people write it: 1e-4."""
    return f"{eps:.0e}".replace("e-0", "e-")


def model_name(member: Member) -> str:
    """The MGit model a member is a version of: a new version goes under its model's name."""
    return member.version_of or member.name


def timed(action: Callable[..., T], *args: Any, **kwargs: Any) -> tuple[T, float]:
    """`action(*args, **kwargs)` and its wall-clock seconds; dirty pages are flushed first, untimed."""
    os.sync()
    start = time.perf_counter()
    out = action(*args, **kwargs)
    return out, time.perf_counter() - start


def pmap(action: Callable[[Any], T], items: Iterable[Any]) -> list[T]:
    """`action` over `items` on one thread per core (zstd, LZMA, ZipNN and torch release the GIL)."""
    with ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:
        return list(pool.map(action, items))


def sha256_tree(folder: Path) -> dict[str, str]:
    """sha256 of every file of a folder, by relative path."""
    return {str(f): hashlib.sha256((folder / f).read_bytes()).hexdigest() for f in files_of(folder)}


def check_identical(member: Member, out: Path, *, skip_weights: bool = False) -> None:
    """Fail loudly unless a checkout holds exactly the member's files with the same bytes."""
    want, got = sha256_tree(member.path), sha256_tree(out)
    if skip_weights:
        want.pop(WEIGHTS, None)
        got.pop(WEIGHTS, None)
    if want != got:
        bad = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))
        raise RuntimeError(f"checkout of {member.name} differs from {member.path}: {', '.join(bad)}")


@functools.cache
def original_eval(member: Member) -> EvalResult:
    """Held-out predictions of the original member, computed once."""
    return evaluate(member.path, member.task)


def fidelity(member: Member, folder: Path) -> Fidelity:
    """Largest weight error of a reconstructed member folder and, with a classifier head, its
    held-out accuracy and agreement with the original's predictions."""
    original, rebuilt = load_file(member.path / WEIGHTS), load_file(folder / WEIGHTS)
    error = max((rebuilt[k].double() - v.double()).abs().max().item() for k, v in original.items())
    if member.task is None:
        return Fidelity(error)
    before, after = original_eval(member), evaluate(folder, member.task)
    return Fidelity(error, member.task, after.accuracy, before.accuracy, after.agreement(before))


# --- MGit ----------------------------------------------------------------------------------------


def lossy_name(options: dict[str, float]) -> str:
    parts = ([f"eps={eps_text(options['lossy'])}"] if "lossy" in options else []) + (
        [f"rel={options['lossy_rel']:g}"] if "lossy_rel" in options else []
    )
    return "MGit lossy " + " + ".join(parts)


def run_mgit(
    family: list[Member], work: Path, runs: int, lossy: dict[str, float] | None = None, session: bool = False
) -> SchemeResult:
    """MGit: add the members parents first into a fresh repository, then check each one out.

    Parents are given by version id, not by name: after `minilm-sentiment` gets its second
    version, its name means that version, but `minilm-sentiment-bf16` was made from the first.
    With `session`, all of it runs inside `repo.caching()`: decoded tensors are kept for the
    next operations (what a cascade or a test run does); otherwise every add and checkout
    decodes what it needs afresh, as separate `mgit` commands do.
    """
    name = ("MGit lossless" if lossy is None else lossy_name(lossy)) + (SESSION if session else "")
    result = SchemeResult(name, lossless=lossy is None, per_member=not session)
    options = dict(lossy or {})
    fallbacks: dict[str, set[str]] = {}
    for run in range(runs):
        repo, ids, add = Repo.init(empty_dir(work / "repo")), {}, 0.0
        with repo.caching() if session else nullcontext():
            for m in family:
                added, seconds = timed(
                    repo.add,
                    m.path,
                    name=model_name(m),
                    parent=[ids[p] for p in m.parents] or None,
                    relation=m.relation if m.parents else None,
                    **options,
                )
                ids[m.name], add = added.version, add + seconds
                if getattr(added, "lossless_reason", None):  # a lossy add that stored the version losslessly
                    fallbacks.setdefault(added.lossless_reason, set()).add(m.name)
                result.stored[m.name] = repo.log(model_name(m))[0].new_bytes
            result.add.append(add)
            result.checkout.append(checkout_all(repo, family, ids, work, result, last_run=run == runs - 1))
        result.total = repo.du().stored_bytes
        print(f"  {name} run {run + 1}/{runs}: add {add:.1f} s, checkout {result.checkout[-1]:.1f} s", flush=True)
    shutil.rmtree(work / "repo")
    if fallbacks:
        result.note = "stored losslessly: " + "; ".join(
            f"{', '.join(sorted(ms))} ({why})" for why, ms in fallbacks.items()
        )
    return result


def checkout_all(
    repo: Repo, family: list[Member], ids: dict[str, str], work: Path, result: SchemeResult, *, last_run: bool
) -> float:
    """Check out every member, verify it, and return the seconds the checkouts took (only they are timed)."""
    total = 0.0
    for m in family:
        out = empty_dir(work / "checkout")
        total += timed(repo.checkout, ids[m.name], out)[1]
        check_identical(m, out, skip_weights=not result.lossless)
        if not result.lossless and last_run:
            result.fidelity[m.name] = fidelity(m, out)
    shutil.rmtree(work / "checkout")
    return total


def run_mgit_lossy(family: list[Member], work: Path, runs: int, options: dict[str, float]) -> SchemeResult:
    """MGit's lossy mode with these `Repo.add` options (a row that says so if they fail)."""
    try:
        return run_mgit(family, work, runs, lossy=options)
    except (TypeError, ValueError, MgitError) as exc:
        return SchemeResult(lossy_name(options), lossless=False, note=f"failed: {exc}")


# --- byte codecs: zstd per file, ZipNN per tensor ------------------------------------------------


class Codec(Protocol):
    def encode(self, data: memoryview) -> bytes: ...
    def decode(self, blob: bytes) -> bytes: ...


@dataclass(frozen=True)
class Zstd:
    """zstd at a fixed level, one frame per input (its size recorded in the frame)."""

    level: int = ZSTD_LEVEL

    def encode(self, data: memoryview) -> bytes:
        return zstandard.ZstdCompressor(level=self.level).compress(data)

    def decode(self, blob: bytes) -> bytes:
        return zstandard.ZstdDecompressor().decompress(blob)


@dataclass(frozen=True)
class ZipNN:
    """ZipNN (PyPI `zipnn`) on the raw bytes of one tensor of a given floating dtype."""

    dtype: str  # "float32", "bfloat16" or "float16": ZipNN assumes bfloat16 unless told

    def encode(self, data: memoryview) -> bytes:
        import zipnn

        # A copy: ZipNN reorders the bytes of its input in place. threads=1: pmap runs one per core.
        return zipnn.ZipNN(input_format="byte", bytearray_dtype=self.dtype, threads=1).compress(bytearray(data))

    def decode(self, blob: bytes) -> bytes:
        import zipnn

        return zipnn.ZipNN(input_format="byte", bytearray_dtype=self.dtype, threads=1).decompress(blob)


Part = tuple[Codec, memoryview]


def whole_files(path: Path, data: bytes) -> list[Part]:
    """One zstd part per file."""
    return [(Zstd(), memoryview(data))]


def tensor_parts(path: Path, data: bytes) -> list[Part]:
    """A safetensors file cut into its header (zstd) and its tensors in file order (ZipNN where
    the dtype is one ZipNN models, zstd for the others); any other file whole, with zstd."""
    if path.suffix != ".safetensors":
        return whole_files(path, data)
    layout, view = read_layout(path), memoryview(data)
    parts: list[Part] = [(Zstd(), view[: layout.data_start])]
    for span in layout.tensors:
        codec = ZipNN(ZIPNN_DTYPES[span.dtype]) if span.dtype in ZIPNN_DTYPES else Zstd()
        parts.append((codec, view[layout.data_start + span.start : layout.data_start + span.end]))
    return parts


def run_codec(name: str, family: list[Member], runs: int, split: Callable[[Path, bytes], list[Part]]) -> SchemeResult:
    """Compress every part of every file of the family, decompress it, and check that the parts
    join back into the original files. In memory, from files read beforehand (untimed)."""
    result = SchemeResult(name)
    files = [(m, f, (m.path / f).read_bytes()) for m in family for f in files_of(m.path)]
    parts = [(m.name, codec, view) for m, f, data in files for codec, view in split(m.path / f, data)]
    for run in range(runs):
        blobs, seconds = timed(pmap, lambda p: p[1].encode(p[2]), parts)
        result.add.append(seconds)
        decoded, seconds = timed(pmap, lambda pb: pb[0][1].decode(pb[1]), zip(parts, blobs, strict=True))
        result.checkout.append(seconds)
        check_round_trip(files, decoded)
        print(f"  {name} run {run + 1}/{runs}: compress {result.add[-1]:.1f} s, decompress {seconds:.1f} s", flush=True)
    for (member, _, _), blob in zip(parts, blobs, strict=True):
        result.stored[member] = result.stored.get(member, 0) + len(blob)
    result.total = sum(result.stored.values())
    return result


def check_round_trip(files: list[tuple[Member, Path, bytes]], decoded: list[bytes]) -> None:
    """Fail loudly unless the decoded parts, joined in order, give back every file."""
    joined, pos = b"".join(decoded), 0
    for member, path, data in files:
        if joined[pos : pos + len(data)] != data:
            raise RuntimeError(f"round trip of {member.name}/{path} does not give back its bytes")
        pos += len(data)
    if pos != len(joined):
        raise RuntimeError("round trip gave back more bytes than the files hold")


# --- the original MGit scheme (see mgit_prototype.py) ---------------------------------------------


def run_prototype(family: list[Member], work: Path) -> SchemeResult:
    """The original MGit scheme, once over the family: each member stored against the
    reconstruction of its first parent (as the prototype's decoder sees it), then rebuilt."""
    result = SchemeResult(f"MGit original eps={eps_text(PROTOTYPE_EPS)} (lossy)", lossless=False)
    store, rebuilt = ParameterStore(PROTOTYPE_EPS), {}
    as_prototype = 0
    for m in family:
        base, known = rebuilt[m.parents[0]] if m.parents else None, len(store.blobs)
        encoded, seconds = timed(encode_folder, store, m.path, WEIGHTS, base)
        result.add.append(seconds)
        new = list(store.blobs)[known:]
        result.stored[m.name] = sum(len(store.blobs[k]) for k in new)
        as_prototype += sum(store.raw_sizes[k] or len(store.blobs[k]) for k in new)
        (rebuilt[m.name], files), seconds = timed(decode_folder, store, encoded, WEIGHTS, base)
        result.checkout.append(seconds)
        folder = write_folder(files, empty_dir(work / "rebuilt"))
        check_identical(m, folder, skip_weights=True)
        result.fidelity[m.name] = fidelity(m, folder)
        print(
            f"  {m.name}: {result.stored[m.name] / MB:.1f} MB, encode {result.add[-1]:.1f} s, "
            f"decode {seconds:.1f} s, max error {result.fidelity[m.name].max_abs_error:.2e}",
            flush=True,
        )
    result.add, result.checkout = [sum(result.add)], [sum(result.checkout)]
    result.total = sum(len(b) for b in store.blobs.values())
    result.note = (
        f"{as_prototype / MB:,.1f} MB ({folder_total(family) / as_prototype:.2f}x) with standalone "
        "tensors and files left uncompressed, as the prototype stores them"
    )
    shutil.rmtree(work / "rebuilt")
    return result


def write_folder(files: dict[str, bytes], folder: Path) -> Path:
    """Write rebuilt files into a folder (untimed: for evaluating the reconstruction)."""
    for path, data in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(data)
    return folder


# --- report --------------------------------------------------------------------------------------


def cell(stored: int | None, raw: int) -> str:
    """Stored MB (kB below 1 MB) and the reduction factor against the raw bytes."""
    if not stored:
        return "-"
    size = f"{stored / MB:,.1f}" if stored >= MB else f"{stored / 1e3:,.0f} kB"
    return f"{size} ({raw / stored:,.{2 if raw < 100 * stored else 0}f}x)"


def per_member(family: list[Member], results: list[SchemeResult]) -> list[str]:
    """One row per member: its raw size and what each scheme stored for it."""
    rows, results = [], [r for r in results if r.per_member]
    for m in family:
        raw = folder_bytes(m.path)
        row = [
            m.name,
            m.relation + (f" (v2 of {m.version_of})" if m.version_of else ""),
            f"{raw / MB:,.1f}",
            f"{folder_bytes(m.path, '.safetensors') / MB:,.1f}",
        ]
        rows.append(row + [cell(r.stored.get(m.name), raw) if r.total else r.note for r in results])
    header = ["member", "relation", "raw MB", "weights MB", *(f"{r.name}: MB (x)" for r in results)]
    return table(header, rows)


def totals(raw: int, results: list[SchemeResult]) -> list[str]:
    """One row per scheme: total stored, reduction, throughput and, if lossy, the worst fidelity."""
    rows = []
    for r in results:
        if not r.total:
            rows.append([r.name, r.note, *["-"] * 6])
            continue
        worst = [f.agreement for f in r.fidelity.values() if f.agreement is not None]
        error = max((f.max_abs_error for f in r.fidelity.values()), default=0.0)
        rows.append(
            [
                r.name,
                "yes" if r.lossless else "no",
                f"{r.total / MB:,.1f}",
                f"{raw / r.total:.2f}x",
                f"{r.rate('add', raw):,.1f}",
                f"{r.rate('checkout', raw):,.1f}",
                "0 (bit-exact)" if r.lossless else f"{error:.2e}",
                f"{100 * min(worst):.1f}%" if worst else "-",
            ]
        )
    header = [
        "scheme",
        "lossless",
        "stored MB",
        "reduction",
        "add MB/s",
        "checkout MB/s",
        "max abs error",
        "min agreement",
    ]
    return table(header, rows)


def fidelity_rows(results: list[SchemeResult]) -> list[str]:
    """Accuracy and agreement of every lossy reconstruction of a member with a classifier head."""
    rows = [
        [
            r.name,
            name,
            f.task,
            f"{100 * f.original_accuracy:.1f}%",
            f"{100 * f.accuracy:.1f}%",
            f"{100 * f.agreement:.1f}%",
            f"{f.max_abs_error:.2e}",
            "pass" if f.original_accuracy - f.accuracy <= 0.02 * f.original_accuracy else "fail",
        ]
        for r in results
        for name, f in r.fidelity.items()
        if f.task
    ]
    header = [
        "scheme",
        "member",
        "task",
        "accuracy: original",
        "reconstruction",
        "agreement",
        "max abs error",
        "prototype's gate",
    ]
    return [*table(header, rows), ""] if rows else []


def judge(value: float, goal: float, unit: str) -> str:
    """Met, or missed by how much."""
    text = f"{value:,.1f}{unit}"
    return f"met: {text}" if value >= goal else f"missed by {100 * (1 - value / goal):.0f}%: {text}"


def targets(raw: int, results: list[SchemeResult]) -> list[str]:
    """The issue's targets against what was measured."""
    by_name = {r.name: r for r in results}
    mgit, proto = by_name["MGit lossless"], next((r for r in results if r.name.startswith("MGit original")), None)
    rows = [[f"lossless >= {TARGETS['lossless']:g}x, whole family", judge(raw / mgit.total, TARGETS["lossless"], "x")]]
    for options in LOSSY:
        r = by_name.get(lossy_name(options))
        goal = f"{lossy_name(options)[5:]}, agreement >= {100 * TARGETS['agreement']:g}%: >= {TARGETS['lossy']:g}x"
        rows.append([goal, lossy_verdict(raw, r) if r else "not measured (--quick)"])
    if proto and proto.total:
        agreement = min(f.agreement for f in proto.fidelity.values() if f.agreement is not None)
        rows.append(
            [
                f"reference: original MGit scheme, eps=1e-4 (issue: ~{PAPER_REFERENCE}x)",
                f"{raw / proto.total:.2f}x, min agreement {100 * agreement:.1f}%",
            ]
        )
    rows += [
        [
            f"{verb} >= {TARGETS[verb]:g} MB/s with deltas (MGit lossless{session}, family with parents)",
            judge(r.rate(verb, raw), TARGETS[verb], " MB/s"),
        ]
        for verb in ("add", "checkout")
        for r, session in ((mgit, ""), (by_name.get(f"MGit lossless{SESSION}"), SESSION))
        if r is not None
    ]
    return table(["target", "measured"], rows)


def lossy_verdict(raw: int, r: SchemeResult) -> str:
    """Reduction of a lossy MGit run, counted only if every member kept its predictions."""
    if not r.total:
        return r.note
    agreement = min((f.agreement for f in r.fidelity.values() if f.agreement is not None), default=1.0)
    if agreement < TARGETS["agreement"]:
        return f"missed: agreement {100 * agreement:.1f}% (reduction {raw / r.total:.2f}x)"
    return judge(raw / r.total, TARGETS["lossy"], "x") + f", min agreement {100 * agreement:.1f}%"


METHOD = """\
How: *raw* is the sum of the sizes of a member's files (config, tokenizer, README, weights);
*weights* the safetensors file alone; MB = 10^6 bytes; reduction = raw / stored. Throughput is
raw bytes of the whole family per second, the median of {runs} (the original MGit scheme: one
run, it takes minutes). The page cache is warm for the members' files; before each timed step,
untimed, `os.sync()` runs.

- *MGit lossless*: a fresh repository; `repo.add(folder, name=..., parent=[...], relation=...)`
  for each member in family order (parents first; a new version goes under the name of the
  model it is a version of, and parents are pinned by version id). Per member: the version's
  `new_bytes` (what adding it cost); total: `repo.du().stored_bytes`. Add fsyncs every object.
  Checkout: `repo.checkout(version, empty_dir)` of every member, each verified byte for byte
  (sha256 of every file) against the member's folder. Every add and checkout decodes the
  parent tensors it needs afresh, as separate `mgit` commands do.
- *MGit lossless, one session*: the same, with each run's adds and checkouts inside
  `with repo.caching():` (decoded tensors kept for the operations that follow, up to 1 GiB:
  how cascades, test runs and bisect work). It stores the same bytes; only its throughput
  is shown.
- *zstd -3*: every file of every member compressed on its own (`zstandard`, level 3), then
  decompressed and compared with the original.
- *ZipNN* (`zipnn` {zipnn}): every float32/bfloat16/float16 tensor of a safetensors file
  compressed with `ZipNN(input_format="byte", bytearray_dtype=<its dtype>, threads=1)` on a copy
  of its bytes; the file header, other tensors (int8, int64) and other files with zstd -3;
  decompressed and joined back into the original files, compared byte for byte.
- *MGit original*: the MGit prototype's delta compression, reimplemented (what it does, from its
  code, and where this differs: `benchmarks/mgit_prototype.py`): each tensor with a same-name,
  same-shape floating tensor in the member's first parent is stored as
  q = floor((child - parent) / (2 ln(1 + eps)) + 0.5), eps = 1e-4, as int64 bytes compressed with
  `lzma`, the parent being the parent's own reconstruction; an all-zero delta stores nothing.
  Other tensors, members without a parent and the other files: `lzma` standalone (lossless),
  stored once per content. Decoding adds q * 2 ln(1 + eps) to the parent's reconstruction and
  casts to the tensor's dtype. Lossy: the table below gives the largest weight error and, for
  members with a classifier head, held-out accuracy and agreement with the original's
  predictions (`minilm_family.evaluate`); *prototype's gate* is its acceptance test (accuracy
  drop at most 2%, relative), which would otherwise have stored the member uncompressed.
- *MGit lossy*: as MGit lossless, with `repo.add(..., lossy=eps)` (every value within eps;
  tensors without a parent tensor of their dtype and shape stay exact), `lossy_rel=r` (every value of a
  tensor within r x the rms of its change from the parent tensor; tensors without one stay
  exact), or both (each bound holds); the fidelity guard at its default (0.1). The checkout's
  other files are verified byte for byte, its weights as for the original scheme. Versions
  that MGit chose to store losslessly are listed under the tables, with its reason.

The three baselines run in memory from files read beforehand, one thread per core over files
or tensors: they show what the codec costs, not a tool's file handling; MGit's numbers include
reading, hashing, writing and fsync."""


def report(
    family: list[Member], results: list[SchemeResult], load: tuple[float, float], args: argparse.Namespace
) -> str:
    """The markdown section for docs/benchmarks.md (also printed)."""
    raw = folder_total(family)
    weights = folder_total(family, ".safetensors")
    busy = "; other processes were using the CPUs, so throughputs are pessimistic" if load[0] > 0.5 else ""
    notes = [f"- {r.name}: {r.note}." for r in results if r.note and r.total]
    return "\n".join(
        [
            BEGIN,
            "## Storage: a family of related models (issue 3)",
            "",
            f"Measured {datetime.now(UTC):%Y-%m-%d} on {machine()}; torch {torch.__version__}{code_under_test()}. "
            f"One-minute load average {load[0]:.2f} before the run{busy}; {load[1]:.2f} at its end.",
            "",
            f"Reproduce: `{'' if mgit_src() == Path('src') else f'PYTHONPATH={mgit_src()} '}"
            f".venv/bin/python benchmarks/storage.py{' --quick' if args.quick else ''}` "
            f'(`pip install zipnn` first for the ZipNN row). The family: `build_family(preset="{args.preset}")`, '
            f"{len(family)} members derived from all-MiniLM-L6-v2, {raw / MB:,.1f} MB raw, of which "
            f"{weights / MB:,.1f} MB of safetensors weights.",
            "",
            METHOD.format(runs=f"{args.runs} runs" if args.runs > 1 else "one run", zipnn=zipnn_version()),
            "",
            *per_member(family, results),
            "",
            *totals(raw, results),
            "",
            *fidelity_rows(results),
            *notes,
            *([""] if notes else []),
            "Targets from the issue:",
            "",
            *targets(raw, results),
            END,
        ]
    )


def zipnn_version() -> str:
    """The installed zipnn version, or "not installed"."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("zipnn")
    except PackageNotFoundError:
        return "not installed"


def mgit_src() -> Path:
    """The folder the measured mgit was imported from, relative to the checkout when inside it."""
    src = Path(mgit.__file__).resolve().parents[1]
    return src.relative_to(ROOT) if src.is_relative_to(ROOT) else src


def code_under_test() -> str:
    """Which mgit was measured, when it is not exactly the commit that `machine()` names."""
    if mgit_src() != Path("src"):  # an exported tree, by convention .cache/mgit-<commit>/src (see README)
        return f"; mgit imported from `{mgit_src()}` (by convention an export of that commit), not from src/"
    diff = subprocess.run(["git", "diff", "--stat", "HEAD", "--", "src"], cwd=ROOT, capture_output=True, text=True)
    return "; with uncommitted changes in src/" if diff.stdout.strip() else ""


# --- main ----------------------------------------------------------------------------------------


def run_schemes(family: list[Member], work: Path, args: argparse.Namespace) -> list[SchemeResult]:
    """Every scheme over the family, in one run (the quick run: MGit lossless and zstd only)."""
    print("\nMGit lossless", flush=True)
    results = [run_mgit(family, work, args.runs)]
    print(f"MGit lossless{SESSION}", flush=True)
    results.append(run_mgit(family, work, args.runs, session=True))
    print("zstd -3 per file", flush=True)
    results.append(run_codec(f"zstd -{ZSTD_LEVEL} per file", family, args.runs, whole_files))
    if args.quick:
        return results
    print("ZipNN", flush=True)
    if zipnn_version() == "not installed":
        results.append(SchemeResult("ZipNN", note="zipnn not installed (pip install zipnn)"))
    else:
        results.append(run_codec("ZipNN", family, args.runs, tensor_parts))
    print("original MGit scheme (quantized deltas + LZMA; minutes)", flush=True)
    results.append(run_prototype(family, work))
    for options in LOSSY:
        print(lossy_name(options), flush=True)
        results.append(run_mgit_lossy(family, work, args.runs, options))
    return results


def main() -> None:
    """Build or reuse the family, measure every scheme, print the section and write it into the doc."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: demo family, MGit lossless and zstd, one run, docs/ left alone",
    )
    parser.add_argument("--runs", type=int, default=3, help="runs of each fast scheme (default 3)")
    parser.add_argument("--no-doc", action="store_true", help="print the results, leave docs/ alone")
    args = parser.parse_args()
    args.preset = "demo" if args.quick else "full"
    args.runs = 1 if args.quick else args.runs
    started, load = time.perf_counter(), os.getloadavg()[0]
    family = build_family(FAMILY_DIRS[args.preset], preset=args.preset)
    for m in family:
        warm_page_cache(m.path)
    work = CACHE / "bench" / f"storage-{os.getpid()}"
    try:
        results = run_schemes(family, work, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    section = report(family, results, (load, os.getloadavg()[0]), args)
    print("\n" + section)
    if not (args.no_doc or args.quick):
        write_doc(section, BEGIN, END)
        print("\nwritten to docs/benchmarks.md")
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
