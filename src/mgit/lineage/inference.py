"""Parent inference from weights: rank stored versions as candidate parents of a model, with
the evidence for each, a guessed relation and the direction of derivation.

Everything works on sketches (`mgit.lineage.sketch`): a few dozen sampled values per tensor, taken at
the same positions in every model, so a thousand stored models are compared in well under a
second. Three stages:

1. Every stored sketch is compared with the query's on the tensors they share (same name and
   shape): the structural match, the share of bit-identical tensors, the relative distance of
   sampled values and the share of values the candidate reproduces exactly once cast or
   quantized the query's way. A candidate that shares no tensor is dropped at once.
2. The best REFINE candidates are compared again with layers matched by pattern (a distilled
   student's layer 1 may be its teacher's layer 2), get a direction of derivation and a
   guessed relation, and are checked in pairs for a merge. A candidate that derives from the
   query rather than the reverse (its lossy copy, a merge of it with another candidate, a
   model farther than the query from an ancestor of both) is marked so: stored children are
   often closer to a model than its parent is.
3. Close candidates are compared with each other: one that is a lossy copy (a cast, a
   quantization, a pruning) of a better candidate does not make the choice ambiguous, and is
   not preferred to its original, because a full model is rarely derived from its lossy copy.

The evidence comes from `mgit.lineage.evidence`. The score is in [0, 1]: relatedness (the strongest
of identical share, exact share and a logistic of the distance, times the square root of the
structural match) times proximity (how close the candidate is compared with the closest
plausible one), halved when the candidate looks derived from the query rather than the
reverse. The confidence discounts the score when another candidate, not explained by the
first, is nearly as good.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from mgit.lineage.evidence import (
    NOISE,
    Evidence,
    MergeFit,
    analyse,
    compare,
    compare_all,
    merge_fit,
)
from mgit.lineage.sketch import Sketch
from mgit.reports import Report

REFINE = 24  # candidates compared in detail
MERGE_POOL = 5  # best candidates checked in pairs for a merge
REVERSED_DIRECTION = 0.5  # score factor when the candidate looks derived from the query
AMBIGUITY_POWER = 8  # how sharply a close runner-up lowers the confidence
DEFAULT_MIN_CONFIDENCE = 0.5


@dataclass(frozen=True)
class ParentCandidate(Report):
    """A stored version ranked as a parent of a model, with the evidence (see mgit.lineage.inference)."""

    version: str
    model: str
    seq: int
    score: float  # in [0, 1]: relatedness x proximity, halved if it looks derived from the query
    confidence: float  # the score, discounted when an unexplained rival is nearly as good
    relation: str  # how the model would derive from it: quantize, prune, adapter, merge, distill, finetune
    direction: str  # "candidate -> query", "query -> candidate" (a child rather than a parent) or "unknown"
    structure: float  # tensors with the same name and shape / all tensors of both
    identical: float  # share of the model's float tensors that the candidate holds bit for bit
    distance: float | None  # RMS relative distance of sampled values (unrelated: ~1.4); None if none compared
    exact: float  # share of sampled values the candidate reproduces exactly (after a cast or requantization)
    compared: int  # tensors compared value by value
    merge_with: str | None = None  # the other parent when the model looks like a merge of the two
    reasons: list[str] = field(default_factory=list)

    @property
    def ref(self) -> str:
        return f"{self.model}@{self.seq}"


@dataclass(frozen=True)
class ParentSuggestion(Report):
    """Candidate parents of a model, best first, and the choice `--auto-parent` makes of them."""

    query: str
    tensors: int
    compared: int  # stored versions compared
    seconds: float
    candidates: list[ParentCandidate]
    min_confidence: float
    parents: list[str]  # the chosen parents' version ids; empty when none is confident enough
    relation: str | None  # the chosen relation
    verdict: str  # what was chosen and why, or why nothing was
    notes: list[str] = field(default_factory=list)
    # Versions (model@seq) holding every tensor of the model bit for bit: it is stored already as
    # these, which are never its candidates (added under another name, it is a copy of the first).
    stored_as: list[str] = field(default_factory=list)


@dataclass
class Candidate:
    """One stored version considered as the query's parent (library side; see `reports`)."""

    version: str
    label: str  # model@seq, for messages
    sketch: Sketch
    evidence: Evidence
    score: float = 0.0
    confidence: float = 0.0
    relation: str = "finetune"
    direction: int = 0  # +1: the query derives from it; -1: it seems to derive from the query
    downstream: bool = False  # farther than the query from an ancestor of both: a descendant or a sibling
    reasons: list[str] = field(default_factory=list)
    merge_with: str | None = None


# --- ranking -----------------------------------------------------------------------------------


def _rescore(ranked: list[Candidate]) -> None:
    """Score = relatedness x proximity to the closest candidate that may be a parent, halved
    for a candidate that looks derived from the query."""
    plausible = [c.evidence.residual for c in ranked if c.direction >= 0 and not c.downstream]
    best = min(plausible, default=0.0)
    for c in ranked:
        proximity = (
            math.sqrt((best + NOISE) / (c.evidence.residual + NOISE)) if math.isfinite(c.evidence.residual) else 0.0
        )
        penalty = REVERSED_DIRECTION if c.direction < 0 or c.downstream else 1.0
        c.score = c.evidence.relatedness * min(1.0, proximity) * penalty
    ranked.sort(key=lambda c: -c.score)


def _check_merges(q: Sketch, pool: list[Candidate]) -> None:
    """Mark the pair whose combination explains the query best, if it is a merge; then mark
    any candidate that is itself a merge of the query and another as derived from the query
    (such a merge is closer to the query than the query's own parent)."""
    best: tuple[MergeFit, Candidate, Candidate] | None = None
    for i, a in enumerate(pool):
        for b in pool[i + 1 :]:
            fit = merge_fit(q, a.sketch, b.sketch)
            if fit is not None and fit.is_merge and (best is None or fit.distance < best[0].distance):
                best = (fit, a, b)
    if best is not None:
        fit, a, b = best
        for one, other in ((a, b), (b, a)):
            one.relation, one.merge_with = "merge", other.version
            one.reasons.append(
                f"the query is {fit.x:.2f} x {a.label} + {fit.y:.2f} x {b.label} "
                f"(residual {fit.distance:.2g}, {fit.exact:.0%} of samples exact)"
            )
            one.evidence.distance = min(one.evidence.distance, fit.distance)
            one.evidence.exact = max(one.evidence.exact, fit.exact)
    for c in pool:
        if c.merge_with is not None:
            continue
        for other in pool:
            child_fit = merge_fit(c.sketch, q, other.sketch) if other is not c else None
            if child_fit is not None and child_fit.is_merge:
                c.direction = -1
                c.reasons.append(
                    f"it is {child_fit.x:.2f} x the query + {child_fit.y:.2f} x {other.label}: "
                    "a merge derived from the query"
                )
                break


def _mark_downstream(ranked: list[Candidate], top: int = 8) -> None:
    """A candidate with no one-way evidence that is farther than the query from a candidate
    both derive from (say base -> query -> query trained further) is downstream of the query,
    a descendant or a sibling, not its parent, however close it is. (Without such an
    ancestor, a chain of fine-tunes of one structure has no direction in its weights: the
    closer of the two neighbours is taken.)"""
    ancestors = [a for a in ranked[:top] if a.direction > 0 and a.merge_with is None]
    for c in ranked[:top]:
        if c.direction != 0:
            continue
        for a in ancestors:
            ev, iq, ic = compare(c.sketch, a.sketch)
            if analyse(c.sketch, a.sketch, iq, ic)[1] > 0 and ev.distance > 1.1 * a.evidence.distance:
                c.downstream = True
                c.reasons.append(
                    f"it is farther than the query from {a.label}, which both derive from: "
                    "more likely a descendant or a sibling than the parent"
                )
                break


def _is_lossy_copy(child: Sketch, original: Sketch) -> tuple[bool, float]:
    """Whether `child` looks like a cast, quantization or pruning of `original`, and their distance."""
    ev, iq, ic = compare(child, original)
    relation, direction, _ = analyse(child, original, iq, ic)
    return relation in ("quantize", "prune") and direction > 0, ev.distance


def _settle_close(ranked: list[Candidate], top: int = 4) -> list[str]:
    """Put an original above its lossy copy when both are close to the query; returns notes."""
    notes = []
    for i in range(min(top, len(ranked))):
        for j in range(i + 1, min(top + 2, len(ranked))):
            copy, original = ranked[i], ranked[j]
            if original.score < 0.5 * copy.score or original.direction < 0 or copy.score <= original.score * 0.99:
                continue
            lossy, apart = _is_lossy_copy(copy.sketch, original.sketch)
            if lossy and apart < copy.evidence.distance and copy.evidence.exact <= original.evidence.exact + 0.05:
                copy.score = original.score * 0.99
                copy.reasons.append(f"a lossy copy of {original.label}, which is likelier the parent")
                notes.append(
                    f"{copy.label} is a lossy copy of {original.label} ({original.label} -> {copy.label}): "
                    "the original is ranked first"
                )
    ranked.sort(key=lambda c: -c.score)
    return notes


def _confidence(ranked: list[Candidate]) -> None:
    """Score discounted by the best rival that is neither a merge partner nor explained by
    this candidate (closer to it than to the query, like its own lossy copy, or a copy). Below the
    first, every candidate has the first as a rival at least as good."""
    for k, c in enumerate(ranked):
        rival = 0.0
        for other in ranked[:6] if k == 0 else ranked[:1]:
            if other is c or other.version == c.merge_with or other.score <= 0 or c.score <= 0:
                continue
            if k == 0 and (
                other.sketch.same_tensors(c.sketch)  # a stored copy of it: the same answer twice
                or compare(other.sketch, c.sketch)[0].distance < other.evidence.distance
            ):
                continue
            rival = max(rival, min(1.0, other.score / c.score))
        c.confidence = c.score * (1 - 0.5 * rival**AMBIGUITY_POWER)


def parent_candidates(
    query: Sketch, stored: Iterable[tuple[str, str, Sketch]], *, limit: int = 5
) -> tuple[list[Candidate], list[str], int]:
    """Stored versions, given as (id, label, sketch), ranked as parents of `query`: the best
    first (at most `limit`), notes on close candidates, and how many were compared."""
    compared, count = compare_all(query, stored)
    first = [Candidate(vid, label, sketch, ev) for vid, label, sketch, ev in compared]
    first.sort(key=lambda c: (-c.evidence.relatedness, c.evidence.residual))
    refined = first[:REFINE]
    for c in refined:
        if query.layers == c.sketch.layers:
            continue  # layers line up by name; matching by pattern only helps a student with fewer
        by_pattern, _, _ = compare(query, c.sketch, by_pattern=True)
        if by_pattern.distance < c.evidence.distance:
            c.evidence.distance, c.evidence.compared = by_pattern.distance, by_pattern.compared
            c.evidence.exact = max(c.evidence.exact, by_pattern.exact)
    for c in refined:
        _, iq, ic = compare(query, c.sketch)
        c.relation, c.direction, c.reasons = analyse(query, c.sketch, iq, ic)
    _rescore(refined)
    _check_merges(query, [c for c in refined[:MERGE_POOL] if c.direction >= 0 and c.score > 0.05])
    _mark_downstream(refined)
    _rescore(refined)
    notes = _settle_close(refined)
    _confidence(refined[: max(limit, 6)])
    return refined[:limit], notes, count


DIRECTIONS = {1: "candidate -> query", 0: "unknown", -1: "query -> candidate"}


def _report(c: Candidate) -> ParentCandidate:
    model, _, seq = c.label.rpartition("@")
    ev = c.evidence
    return ParentCandidate(
        version=c.version,
        model=model,
        seq=int(seq) if seq.isdigit() else 0,
        score=round(c.score, 4),
        confidence=round(c.confidence, 4),
        relation=c.relation,
        direction=DIRECTIONS[c.direction],
        structure=round(ev.structure, 4),
        identical=round(ev.identical, 4),
        distance=round(ev.distance, 6) if math.isfinite(ev.distance) else None,
        exact=round(ev.exact, 4),
        compared=ev.compared,
        merge_with=c.merge_with,
        reasons=list(c.reasons),
    )


def _choose(ranked: list[Candidate], min_confidence: float) -> tuple[list[str], str | None, str]:
    """What `--auto-parent` takes: the best candidate (and its merge partner) when it is
    confident enough and does not look derived from the query; else nothing, and why."""
    if not ranked:
        return [], None, "no stored version shares a tensor name and shape with it"
    best = ranked[0]
    if best.direction < 0:
        return [], None, f"the closest, {best.label}, looks derived from it (a child, not a parent)"
    if best.confidence < min_confidence:
        return (
            [],
            None,
            (
                f"the best candidate, {best.label} ({best.relation}), has confidence "
                f"{best.confidence:.2f} < {min_confidence:.2f}"
            ),
        )
    parents = [best.version]
    partner = next((c for c in ranked if c.version == best.merge_with), None)
    if partner is not None:
        parents.append(partner.version)
    names = best.label + (f" and {partner.label}" if partner else "")
    return parents, best.relation, f"{names} ({best.relation}), confidence {best.confidence:.2f}"


def suggest(
    query: Sketch,
    stored: Iterable[tuple[str, str, Sketch]],
    *,
    label: str,
    limit: int = 5,
    min_confidence: float = DEFAULT_MIN_CONFIDENCE,
    started: float | None = None,
    history: Iterable[tuple[str, str, Sketch]] = (),
) -> ParentSuggestion:
    """`parent_candidates` as a report, with the choice `--auto-parent` makes; `seconds`
    counts from `started` (a `time.perf_counter()` value) when given. `history` are versions
    left out of the candidates (the model's own, in an add): when one of them holds the
    query's every tensor, the query is that version stored already and gets no parent."""
    started = time.perf_counter() if started is None else started
    # A version that holds the query's every tensor is the query stored already, never its
    # candidate: stored children are compared, stored copies are named.
    own = [(vid, label) for vid, label, s in history if s.same_tensors(query)]
    copies, others = list(own), []
    for vid, label, s in stored:
        if s.same_tensors(query):
            copies.append((vid, label))
        else:
            others.append((vid, label, s))
    # Choose from every refined candidate, not the shown ones: a merge partner may rank below
    # `limit`, and `--auto-parent` must choose what `suggest -n 1` says it would.
    ranked, notes, count = parent_candidates(query, others, limit=REFINE)
    parents, relation, verdict = _choose(ranked, min_confidence)
    if own:
        parents, relation = [], None
        verdict = f"already stored as {', '.join(label for _, label in copies)} (every tensor bit for bit)"
    elif copies:
        stored_as = ", ".join(label for _, label in copies)
        parents, relation = [copies[0][0]], "other"
        verdict = (
            f"already stored as {stored_as} (every tensor bit for bit); "
            f"added under another name, it is a copy of {copies[0][1]} (other)"
        )
    return ParentSuggestion(
        query=label,
        tensors=len(query),
        compared=count + len(copies) - len(own),
        seconds=round(time.perf_counter() - started, 3),
        candidates=[_report(c) for c in ranked[:limit]],
        min_confidence=min_confidence,
        parents=parents,
        relation=relation,
        verdict=verdict,
        notes=notes,
        stored_as=[label for _, label in copies],
    )
