"""A training run on its model's page in `mgit serve`: the chosen metric over the checkpoints
as an inline SVG (a dot per checkpoint, linked to it), the same points in the JSON twin, names
escaped, an unknown metric refused."""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import pytest
from conftest import tensors

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from mgit import Repo  # noqa: E402
from mgit.web.app import create_app  # noqa: E402

BASE = "http://127.0.0.1:8808"
EVAL = {100: 0.9, 200: 0.5, 300: 0.7, 400: 0.4}


@pytest.fixture
def client(repo: Repo) -> Iterator[TestClient]:
    repo.add(tensors(0), name="base")
    for step, loss in EVAL.items():
        state = {k: v + np.float32(step / 1e4) for k, v in tensors(0).items()}
        metrics = {"eval_loss": loss, "loss": loss * 2} if step != 300 else {"loss": 1.0}
        repo.commit_checkpoint(
            state, model="ft", parent="base" if step == 100 else None, step=step, metrics=metrics, run="<b>r</b>"
        )
    with TestClient(create_app(repo), base_url=BASE) as c:
        yield c


def test_the_model_page_draws_the_metric_over_the_run(client: TestClient) -> None:
    page = client.get("/models/ft")
    assert page.status_code == 200
    html = page.text
    assert 'id="run-chart"' in html and "Run &lt;b&gt;r&lt;/b&gt;" in html and "<b>r</b>" not in html
    titles = re.findall(r"<title>(@\d+ step \d+: [^<]+)</title>", html)
    assert titles == ["@1 step 100: eval_loss 0.9", "@2 step 200: eval_loss 0.5", "@4 step 400: eval_loss 0.4"]
    cy = [float(y) for y in re.findall(r'<circle cx="[\d.]+" cy="([\d.]+)"', html)]
    assert cy[0] < cy[1] and cy[2] == max(cy)  # the highest value is drawn highest (smallest y)
    # the head's own line (the chart's titles say "step 400" too, so the line is matched whole)
    assert '<p id="checkpoint">checkpoint of run <span class="mono">&lt;b&gt;r&lt;/b&gt;</span> at step 400 ' in html

    api = client.get("/api/models/ft").json()["run"]
    assert api["metric"] == "eval_loss" and api["metrics"] == ["eval_loss", "loss"]
    assert [(p["seq"], p["step"], p["value"]) for p in api["points"]] == [(1, 100, 0.9), (2, 200, 0.5), (4, 400, 0.4)]

    losses = client.get("/api/models/ft?metric=loss").json()["run"]["points"]
    assert [p["value"] for p in losses] == [1.8, 1.0, 1.0, 0.8]
    assert client.get("/models/ft?metric=nope").status_code == 400
    assert client.get("/api/models/base").json()["run"] is None
    assert 'id="run"' not in client.get("/models/base").text
