"""A model card (a version's README.md) as safe HTML: its YAML front matter as data, its
Markdown rendered with raw HTML off (markdown-it-py escapes it as text), then cleaned by an
allow-list sanitizer (nh3) as a second line: no script, no event handler, no style, no
image or frame that would fetch anything, links only to http, https and mailto."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mgit.reports import Report
from mgit.store.base import ObjectStore
from mgit.store.objectformat import blob_expected
from mgit.store.objects import Manifest

CARD = "README.md"
MAX_CARD_BYTES = 1 << 20  # a larger card is not rendered (the file is still listed)
TOO_LARGE = f"larger than {MAX_CARD_BYTES >> 20} MiB: not rendered"
TAGS = {
    "a",
    "abbr",
    "b",
    "blockquote",
    "br",
    "code",
    "del",
    "details",
    "dd",
    "dl",
    "dt",
    "em",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "hr",
    "i",
    "kbd",
    "li",
    "ol",
    "p",
    "pre",
    "s",
    "strong",
    "sub",
    "summary",
    "sup",
    "table",
    "tbody",
    "td",
    "th",
    "thead",
    "tr",
    "ul",
}
ATTRIBUTES = {"a": {"href", "title"}, "th": {"align"}, "td": {"align"}, "ol": {"start"}}


@dataclass(frozen=True)
class ModelCard(Report):
    path: str
    front_matter: dict[str, str] = field(default_factory=dict)  # values as JSON-ish text
    html: str = ""  # sanitized
    note: str | None = None  # why it is not rendered


def version_card(manifest: Manifest, store: ObjectStore) -> ModelCard | None:
    """The card of a version, if it has one; its file is read only if it will be rendered."""
    entry = next((f for f in manifest.files if f.path == CARD and f.type == "blob"), None)
    if entry is None:
        return None
    if entry.size > MAX_CARD_BYTES:
        return ModelCard(entry.path, note=TOO_LARGE)
    return render_card(store.get(entry.object, expect=blob_expected(entry.size))[1].tobytes(), path=entry.path)


def render_card(data: bytes, *, path: str = CARD) -> ModelCard:
    """The card of `data` (the bytes of a README.md)."""
    if len(data) > MAX_CARD_BYTES:
        return ModelCard(path, note=TOO_LARGE)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return ModelCard(path, note="not UTF-8 text: not rendered")
    front, body = split_front_matter(text)
    return ModelCard(path, front, sanitize(markdown(body)))


def split_front_matter(text: str) -> tuple[dict[str, str], str]:
    """({key: value as text}, the rest) of a card that starts with a `---` YAML block."""
    import yaml

    lines = text.lstrip("\ufeff").splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        return {}, text
    end = next((i for i, line in enumerate(lines[1:], 1) if line.strip() in ("---", "...")), None)
    if end is None:
        return {}, text
    try:
        data: Any = yaml.safe_load("".join(lines[1:end]))
    except yaml.YAMLError:
        data = None
    body = "".join(lines[end + 1 :])
    if not isinstance(data, dict):
        return {}, body
    return {
        str(k): v if isinstance(v, str) else yaml.safe_dump(v, default_flow_style=True).strip() for k, v in data.items()
    }, body


def markdown(text: str) -> str:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False}).enable("table").render(text)


def sanitize(html: str) -> str:
    import nh3

    return nh3.clean(
        html,
        tags=TAGS,
        attributes=ATTRIBUTES,
        url_schemes={"http", "https", "mailto"},
        link_rel="noopener noreferrer nofollow",
    )
