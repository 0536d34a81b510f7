"""Printing results: plain tables for people, JSON for programs, progress bars on stderr."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

import click

from mgit.reports import human_size, json_safe

if TYPE_CHECKING:
    from mgit.reports import ParentInfo
    from mgit.util.parallel import Progress, StartProgress, StartTransfer, TransferProgress

# What a terminal would act on rather than show: C0 controls but newline and tab, DEL, C1
# (ESC and CSI among them), and the bidirectional overrides that reorder what is shown.
UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with every character a terminal would act on written as an escape (`\\x1b`,
    `\\u202e`): names, messages, paths and file contents come from users and remotes, and
    must not move the cursor, retitle the window or hide what follows. Newlines and tabs stay."""
    if text.isprintable():  # (checked in C: every character UNPRINTABLE matches is one it refuses)
        return text
    return UNPRINTABLE.sub(_escape, text)


def _escape(found: re.Match[str]) -> str:
    code = ord(found.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


class Printer:
    """Lines to a stream: strings and tables (`PlainTable`) as they are, nothing
    interpreted (names and paths come from users: "[x]" in a file name prints as itself),
    control characters escaped (`printable`: every human rendering goes through here).
    rich is loaded for progress bars only: importing it costs more than most commands run."""

    def __init__(self, stream: Callable[[], TextIO]) -> None:
        self._stream = stream  # looked up on each print: tests swap sys.stdout

    def print(self, *objects: object, end: str = "\n") -> None:
        text = " ".join(o.render() if isinstance(o, PlainTable) else str(o) for o in objects)
        stream = self._stream()
        stream.write(printable(text + end))
        stream.flush()

    @property
    def is_terminal(self) -> bool:
        stream = self._stream()
        return bool(getattr(stream, "isatty", lambda: False)())


out = Printer(lambda: sys.stdout)
err = Printer(lambda: sys.stderr)


def print_json(value: Any) -> None:
    """Strict JSON on stdout (a non-finite number is null, as in every `to_json`); strings
    as they are, their control characters escaped by the encoder (ASCII only)."""
    sys.stdout.write(json.dumps(json_safe(value), indent=2, default=str, allow_nan=False) + "\n")


size = human_size


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def short(oid: str | None) -> str:
    return oid[:12] if oid else "-"


json_option = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")


def signatures_text(checks: list[Any]) -> str:
    """A version's signatures (mgit.signing.policy.SignatureCheck) in one line: who signed,
    and what does not verify or is not trusted, said as such."""
    if not checks:
        return "not signed"
    return "; ".join(
        f"{'signed' if c.trusted else 'NOT TRUSTED'} by {c.signer} ({c.key_type} {c.fingerprint})"
        + ("" if c.trusted else f": {c.status}")
        for c in checks
    )


def parents_text(parents: list[ParentInfo]) -> str:
    return ", ".join(f"{p.label} ({p.relation})" for p in parents) or "-"


def lossy_bound(lossy: dict | None) -> str:
    """'|error| <= 0.001 (max 0.000998, 12 tensors)' for a lossy version."""
    if not lossy:
        return ""
    from mgit.store.lossy_policy import describe  # (only a lossy version's lines come here)

    return (
        f"{describe(lossy)} (max {lossy.get('max_error'):.3g}, "
        f"{plural(int(lossy.get('tensors', 0)), 'tensor')}, guard {lossy.get('guard'):g})"
    )


@dataclass
class Column:
    header: str
    justify: str = "left"


class PlainTable:
    """A borderless table laid out by hand: rich's Table spends ~0.4 s on a thousand rows,
    this takes milliseconds. Cells are plain text (markup is off everywhere)."""

    def __init__(self, columns: list[Column], title: str | None = None) -> None:
        self.columns = columns
        self.title = title
        self.rows: list[list[str]] = []

    def add_row(self, *cells: object) -> None:
        self.rows.append([printable(str(c)) for c in cells])  # escaped before widths are measured

    def render(self) -> str:
        widths = [
            max([len(c.header), *(len(r[i]) for r in self.rows if i < len(r))]) for i, c in enumerate(self.columns)
        ]

        def line(cells: list[str]) -> str:
            parts = [
                cell.rjust(w) if col.justify == "right" else cell.ljust(w)
                for cell, w, col in zip(cells, widths, self.columns, strict=False)
            ]
            return "  ".join(parts).rstrip()

        lines = [self.title.center(sum(widths) + 2 * (len(widths) - 1)).rstrip()] if self.title else []
        lines.append(line([c.header for c in self.columns]))
        lines += [line(r) for r in self.rows]
        return "\n".join(lines)


def table(*columns: str, title: str | None = None) -> PlainTable:
    """A borderless table; numeric columns (by name) are right-aligned."""
    right = {
        "size",
        "logical",
        "stored",
        "tensors",
        "versions",
        "factor",
        "params",
        "objects",
        "files",
        "new",
        "tensors: dedup",
        "delta",
        "derived",
        "standalone",
        "rel change",
        "max |b-a|",
        "min cosine",
        "max rank",
        "cosine",
        "changed",
        "rank",
    }
    return PlainTable([Column(c, "right" if c.lower() in right else "left") for c in columns], title)


@contextmanager
def progress_bar(label: str, *, enabled: bool = True, unit_bytes: bool = True) -> Iterator[StartProgress | None]:
    """Yields a factory `total -> advance` for library calls, or None when not shown
    (stderr not a terminal)."""
    if not enabled or not err.is_terminal:
        yield None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )
    from rich.progress import Progress as Bars

    console = Console(stderr=True, soft_wrap=True, highlight=False, markup=False)
    columns: list[Any] = [TextColumn("{task.description}"), BarColumn()]
    columns += (
        [DownloadColumn(binary_units=True), TransferSpeedColumn()]
        if unit_bytes
        else [TextColumn("{task.completed}/{task.total}")]
    )
    columns.append(TimeRemainingColumn())
    with Bars(*columns, console=console, transient=True) as bars:

        def factory(total: int) -> Progress:
            task = bars.add_task(printable(label), total=total)
            return lambda n: bars.advance(task, n)

        yield factory


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float | None]) -> str:
    """A metric over a run in one line of block characters, lowest ▁ to highest █ (a
    checkpoint that did not log it is a space)."""
    known = [v for v in values if v is not None]
    if not known:
        return ""
    low, high = min(known), max(known)
    span = (high - low) or 1.0
    return "".join(" " if v is None else SPARKS[round((v - low) / span * (len(SPARKS) - 1))] for v in values)


def run_text(run: dict[str, Any]) -> str:
    """A checkpoint in one line: its step, the metrics logged at it, its run."""
    metrics = ", ".join(f"{k} {'-' if v is None else f'{v:.6g}'}" for k, v in sorted(run["metrics"].items()))
    step = "-" if run["step"] is None else run["step"]
    return f"{step}{f'  {metrics}' if metrics else ''}  (run {run['id']})"


@contextmanager
def transfer_bar(label: str, *, enabled: bool = True, console: Any = None) -> Iterator[StartTransfer | None]:
    """A push's or a fetch's bar: bytes and objects, each with its rate (rich's speed column
    shows bytes a second; the objects' rate is counted here). None when stderr is not a
    terminal (or `console`, a rich Console, is given). Yields a factory
    `(total bytes, total objects) -> advance(nbytes, objects=0)`."""
    if not enabled or (console is None and not err.is_terminal):
        yield None
        return
    import time

    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, TextColumn, TimeRemainingColumn, TransferSpeedColumn
    from rich.progress import Progress as Bars

    console = console or Console(stderr=True, soft_wrap=True, highlight=False, markup=False)
    columns: list[Any] = [TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True)]
    columns += [TransferSpeedColumn(), TextColumn("{task.fields[objects]}"), TimeRemainingColumn()]
    with Bars(*columns, console=console, transient=True) as bars:

        def factory(total: int, objects: int) -> TransferProgress:
            start, done = time.monotonic(), [0]

            def counted() -> str:
                rate = done[0] / max(time.monotonic() - start, 1e-3)
                return f"{done[0]}/{objects} objects, {rate:.1f}/s"

            task = bars.add_task(printable(label), total=total, objects=counted())

            def advance(nbytes: int, objects_done: int = 0) -> None:
                done[0] += objects_done
                bars.update(task, advance=nbytes, objects=counted())

            return advance

        yield factory
