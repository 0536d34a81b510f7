"""A training run on its model's page: the metrics its checkpoints logged, one drawn over the
steps as an inline SVG (no script, no library; the numbers are laid out here, the template only
places them, escaped). The same dict is in the page's JSON twin.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mgit.reports import VersionInfo
from mgit.web.params import choice

WIDTH, HEIGHT, PAD = 640, 200, 36
PREFERRED = ("eval_loss", "loss")


def run_chart(history: list[VersionInfo], query: Mapping[str, str]) -> dict[str, Any] | None:
    """The run of a model's checkpoints (`history` newest first, as `log` gives it) and the
    metric `?metric=NAME` chose (eval_loss, else loss, else the first logged) as points of a
    chart; None when no version is a checkpoint."""
    checkpoints = [v for v in reversed(history) if v.run is not None]
    if not checkpoints:
        return None
    names = sorted({name for v in checkpoints for name in v.run["metrics"]})
    default = next((n for n in PREFERRED if n in names), names[0] if names else "")
    metric = choice(query, "metric", tuple(names) or ("",), default)
    points = [
        {"seq": v.seq, "step": v.run["step"], "value": v.run["metrics"].get(metric)}
        for v in checkpoints
        if v.run["metrics"].get(metric) is not None
    ]
    return {
        "ids": sorted({v.run["id"] for v in checkpoints}),
        "checkpoints": len(checkpoints),
        "metrics": names,
        "metric": metric,
        "points": points,
        "svg": _layout(points),
    }


def _layout(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Pixel positions: steps across (checkpoint order where a step is missing), values up."""
    size = {"width": WIDTH, "height": HEIGHT}
    if not points:
        return {**size, "dots": [], "line": ""}
    xs = [p["step"] if p["step"] is not None else i for i, p in enumerate(points)]
    ys = [p["value"] for p in points]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)

    def at(x: float, y: float) -> tuple[float, float]:
        px = PAD + (x - x0) / ((x1 - x0) or 1) * (WIDTH - 2 * PAD)
        py = HEIGHT - PAD - (y - y0) / ((y1 - y0) or 1) * (HEIGHT - 2 * PAD)
        return round(px, 1), round(py, 1)

    dots = [{"x": at(x, y)[0], "y": at(x, y)[1], **p} for x, y, p in zip(xs, ys, points, strict=True)]
    return {
        **size,
        "dots": dots,
        "line": " ".join(f"{d['x']},{d['y']}" for d in dots),
        "low": y0,
        "high": y1,
        "first_step": x0,
        "last_step": x1,
    }
