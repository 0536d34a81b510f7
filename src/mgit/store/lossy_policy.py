"""What a lossy add promises, apart from how it is done (mgit.store.lossy): the bounds, the
fidelity guard, the verdict on a whole version and how a bound reads. No numpy here: the
command line and the records read these, and they need not load the codecs."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mgit.errors import InvalidOptionError

if TYPE_CHECKING:
    from mgit.store.lossy import LossyTensor

DEFAULT_GUARD = 0.1  # the reconstruction error may be at most 10% of the change (L2 norms)
REFUSE_SHARE = 0.5  # guard failures on more than this share of changed parameters: all lossless


@dataclass(frozen=True)
class LossyPolicy:
    eps: float | None  # absolute bound
    guard: float = DEFAULT_GUARD
    rel: float | None = None  # bound relative to the rms of each tensor's change
    scope: str | None = None  # only tensors whose name starts with this (a checkpoint's "optimizer."); None: all

    def __post_init__(self) -> None:
        if self.scope is not None and not (isinstance(self.scope, str) and self.scope.isprintable() and self.scope):
            raise InvalidOptionError(f"a lossy scope is a tensor-name prefix, not {self.scope!r}")
        if self.eps is None and self.rel is None:
            raise InvalidOptionError("a lossy policy needs a bound", hint="Give --lossy EPS or --lossy-rel R")
        checks = [("lossy bound", self.eps), ("relative lossy bound", self.rel), ("guard threshold", self.guard)]
        for what, value in checks:
            if value is None and what != "guard threshold":
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not (math.isfinite(value) and value > 0)
            ):
                raise InvalidOptionError(f"the {what} must be a positive number, not {value!r}")

    @classmethod
    def from_options(cls, eps: float | None, rel: float | None, guard: float = DEFAULT_GUARD) -> LossyPolicy | None:
        """The policy that an add's `lossy=EPS`, `lossy_rel=R` and `guard` ask for; None (lossless)
        when neither bound is given."""
        return cls(eps, guard, rel) if eps is not None or rel is not None else None

    def covers(self, name: str) -> bool:
        """Whether the tensor of this name may be stored lossily (the others stay exact)."""
        return self.scope is None or name.startswith(self.scope)

    @property
    def mode(self) -> str:
        return "+".join(m for m, v in (("abs", self.eps), ("rel", self.rel)) if v is not None)

    def bound(self, change_rms: float) -> float:
        """The error bound of one tensor whose change from its parent tensor has this rms."""
        bounds = [] if self.eps is None else [float(self.eps)]
        if self.rel is not None:
            bounds.append(float(self.rel) * change_rms)
        return min(bounds)


def describe_policy(policy: LossyPolicy) -> str:
    """The bound of a policy as people read it: `1e-05`, `0.1 x rms(change)` or both."""
    return describe({"eps": policy.eps, "rel": policy.rel}).removeprefix("|error| <= ")


def describe(record: dict[str, Any]) -> str:
    """'|error| <= 0.0001' / '|error| <= 0.1 x rms(change)' / both, for people."""
    parts = []
    if record.get("eps") is not None:
        parts.append(f"{record['eps']:g}")
    if record.get("rel") is not None:
        parts.append(f"{record['rel']:g} x rms(change)")
    scope = f" ({record['scope']}* only)" if record.get("scope") else ""
    return "|error| <= " + " and <= ".join(parts) + scope


@dataclass
class LossyTally:
    """The lossy outcome of a whole version, accumulated tensor by tensor."""

    tensors: int = 0
    max_error: float = 0.0
    changed_params: int = 0
    refused_params: int = 0

    def record(self, outcome: LossyTensor | None) -> None:  # (lossy.LossyTensor)
        if outcome is None:
            return
        self.changed_params += outcome.changed_params
        self.refused_params += outcome.changed_params if outcome.guard_failed else 0
        if outcome.chain is not None:
            self.tensors += 1
            self.max_error = max(self.max_error, outcome.max_error)


def verdict(
    tally: LossyTally, policy: LossyPolicy, *, new_tensors: int | None = None
) -> tuple[dict[str, Any] | None, str | None]:
    """The version's `lossy` record, or None and the reason it is stored losslessly
    (`new_tensors`: how many of its tensors were not stored already)."""
    if tally.changed_params and tally.refused_params > REFUSE_SHARE * tally.changed_params:
        share = tally.refused_params / tally.changed_params
        return None, (
            f"the fidelity guard failed on {share:.0%} of the changed parameters: the changes are too "
            f"small for a bound of {describe_policy(policy)} and would round back to the parent"
        )
    if not tally.tensors and new_tensors == 0:
        return None, (
            "every tensor is stored already (the same bytes as in a stored version): deduplication "
            "keeps them as they are, and nothing is left to store lossily"
        )
    if not tally.tensors:
        return None, (
            "no tensor could be stored lossily for less than its exact form (none has a changed parent "
            "tensor of its dtype and shape that a quantized step stores more cheaply)"
        )
    record = {
        "eps": None if policy.eps is None else float(policy.eps),
        "mode": policy.mode,
        "max_error": tally.max_error,
        "tensors": tally.tensors,
        "guard": float(policy.guard),
    }
    if policy.rel is not None:
        record["rel"] = float(policy.rel)
    if policy.scope is not None:
        record["scope"] = policy.scope
    return record, None
