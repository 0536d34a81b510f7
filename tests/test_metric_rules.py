"""A user's metrics, read one way (mgit.usercode.metrics_of) by the tests of `mgit test` and
by the lossy gate of `mgit add`: a metric that is NaN or infinite cannot pass, and the value
measured stays visible."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from conftest import make_model

from mgit import Repo
from mgit.checks import Checks, Condition
from mgit.usercode import metrics_of

EVALS = """
import os

def score(folder):  # broken on a gate's reconstruction, and on a model that holds BROKEN
    broken = "reconstruction" in folder or os.path.exists(os.path.join(folder, "BROKEN"))
    return {"acc": float("VALUE") if broken else 1.0, "loss": 0.5}
"""


def test_metrics_of_keeps_a_value_that_is_not_finite_and_names_it() -> None:
    for value in (math.nan, math.inf, -math.inf, None):  # None: a NaN as JSON carries it
        metrics, passed, problem = metrics_of({"acc": value, "loss": 0.5})
        assert passed is None and problem == "metric acc is not finite" and metrics["loss"] == 0.5
        assert not math.isfinite(metrics["acc"]) and (value is None or metrics["acc"] == value or math.isnan(value))
    assert metrics_of({"acc": 0.9}) == ({"acc": 0.9}, None, None)
    assert metrics_of({}) == ({}, None, "must return a non-empty dict of metrics")


@pytest.fixture(params=["nan", "inf"])
def work(request: pytest.FixtureRequest, repo: Repo, tmp_path: Path) -> Repo:
    (repo.root / "evals.py").write_text(EVALS.replace("VALUE", request.param))
    repo.add(make_model(tmp_path / "base", seed=1), name="base")
    make_model(tmp_path / "tuned", seed=2)
    return repo


def test_a_test_whose_metric_is_not_finite_fails_with_the_value_kept(work: Repo, tmp_path: Path) -> None:
    (tmp_path / "tuned" / "BROKEN").write_text("")
    work.add(tmp_path / "tuned", name="checked", parent="base")
    checks = Checks(work)
    checks.attach("checked", str(work.root / "evals.py:score"), conditions=[Condition("acc", "min", 0.5)])
    [outcome] = checks.run(["checked"]).outcomes
    assert outcome.status == "fail" and outcome.reasons[0] == "metric acc is not finite"
    assert math.isnan(outcome.metrics["acc"]) and outcome.metrics["loss"] == 0.5  # an inf travels as null


def test_a_gate_whose_metric_is_not_finite_refuses_with_the_values_kept(work: Repo, tmp_path: Path) -> None:
    result = work.add(
        tmp_path / "tuned", name="ft", parent="base", lossy=1e-3, gate=f"{work.root}/evals.py:score", max_drop=10.0
    )
    assert result.lossy is None
    assert result.lossless_reason == "the gate refused it: metric acc is not finite on the reconstruction"
    assert result.gate is not None and result.gate["original"] == {"acc": 1.0, "loss": 0.5}
    assert math.isnan(result.gate["reconstruction"]["acc"]) and result.gate["reconstruction"]["loss"] == 0.5
    assert result.to_json()["gate"]["reconstruction"] == {"acc": None, "loss": 0.5}  # strict JSON
