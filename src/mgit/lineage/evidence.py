"""Evidence: how one sketch compares with another, as the parent of the first.

Tensors are matched by name (across a wrapper prefix such as a task model's `bert.`) and shape
(or, for a student with fewer layers, by name pattern and shape); a GGUF's tensors meet a
Hugging Face model's under the names llama.cpp's convert script gives them (a llama's q and k,
whose rows it permutes, are sampled unpermuted: `mgit.lineage.sketch`), and what the script
drops is no structural evidence. For matched tensors, sampled
values give a relative distance (to the RMS of the two samples: two unrelated zero-mean
tensors are ~sqrt(2) apart whatever their scales, a fine-tune 0.01-0.1, a bf16 cast ~0.002)
and the share of values the candidate reproduces exactly once cast or quantized the query's
way. Object ids give the share of bit-identical tensors; the tensor names, the structural
match. `analyse` reads a relation and a direction of derivation from dtypes, zeros, layers and
added tensors; `merge_fit` checks whether a model is a combination of two others.
`compare_all` does the first comparison for thousands of stored sketches at once.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from mgit.formats.gguf import conversion_pairs
from mgit.formats.pairing import tensor_names, wrapper_prefix
from mgit.lineage.sketch import (
    CONSTANT,
    FLOAT,
    PLAIN,
    PRECISION,
    QUANTIZED,
    SCALE,
    Sketch,
    pattern,
    round_to,
)

HALF_RELATED = 0.5  # distance at which relatedness is 1/2 (unrelated tensors are ~1.41 apart)
NOISE = 1e-3  # distances below this are within the noise of a 64-value sample
TRIM = 0.8  # the distance is the RMS of the closest 80% of tensors: a bias's tiny values can
# change by a large fraction of themselves and would otherwise drown what the matrices say
MERGE_GAIN = 0.25  # a merge must fit at most this fraction of the distance of its better parent
INT_RANGE = {"I8": (-128, 127), "U8": (0, 255)}


@dataclass
class Evidence:
    """How a query compares with one candidate."""

    structure: float = 0.0  # tensors with the same name and shape / all tensors of both (scales aside)
    identical: float = 0.0  # share of the query's float tensors stored bit for bit in the candidate
    distance: float = math.inf  # trimmed RMS over compared tensors of the relative distance of samples
    exact: float = 0.0  # share of the query's nonzero samples the candidate reproduces exactly
    compared: int = 0  # tensors whose samples were compared

    @property
    def closeness(self) -> float:
        by_distance = 1 / (1 + (self.distance / HALF_RELATED) ** 4) if math.isfinite(self.distance) else 0.0
        return max(self.identical, self.exact, by_distance)

    @property
    def residual(self) -> float:
        """The distance left once exactly reproduced values are set aside (0 for an exact
        cast); below the noise floor, the share of exact values still tells candidates apart."""
        return (self.distance + NOISE) * (1 - self.exact) if math.isfinite(self.distance) else math.inf

    @property
    def relatedness(self) -> float:
        return self.closeness * math.sqrt(self.structure)


def _informative(s: Sketch) -> np.ndarray:
    return (s.roles == FLOAT) | (s.roles == QUANTIZED)


def _comparable(s: Sketch) -> np.ndarray:
    return _informative(s) | (s.roles == CONSTANT)


@lru_cache(maxsize=64)
def _prefixes(names: tuple[str, ...], others: tuple[str, ...]) -> tuple[str, str]:
    return wrapper_prefix(names, others)


@lru_cache(maxsize=64)
def _pairing(names: tuple[str, ...], others: tuple[str, ...]) -> tuple[dict[str, str], frozenset[str]]:
    """Each of `names` paired with its counterpart among `others`, and the names of either
    side left unpaired on purpose; once per pair of architectures (ranking compares each
    candidate often). A GGUF and a Hugging Face model pair by the convert script's names
    (`mgit.formats.gguf.conversion_pairs`): the usual GGUF is made from a stored model."""
    converted, left_out = conversion_pairs(names, others)
    if converted:
        return converted, left_out
    return tensor_names(names, others), frozenset()


def _paired_names(names: tuple[str, ...], others: tuple[str, ...]) -> dict[str, str]:
    return _pairing(names, others)[0]


def _named(s: Sketch, aside: frozenset[str]) -> int:
    """How many of a sketch's tensors count for the structural match: scales and the tensors
    a pairing leaves out on purpose do not."""
    plain = s.roles != SCALE
    return (
        int(plain.sum()) - sum(1 for i in np.flatnonzero(plain) if s.names[i] in aside) if aside else int(plain.sum())
    )


def counterparts(q: Sketch, c: Sketch) -> list[int | None]:
    """For each tensor of `c`, the index of the query's tensor of the same name (across the
    wrapper prefix the two differ by, `mgit.formats.pairing.tensor_names`) and shape, or None."""
    names = _paired_names(tuple(c.names), tuple(q.names))
    out: list[int | None] = []
    for j, name in enumerate(c.names):
        i = q.index.get(names.get(name, ""))
        out.append(i if i is not None and q.shapes[i] == c.shapes[j] else None)
    return out


def _name_pairs(q: Sketch, c: Sketch) -> tuple[np.ndarray, np.ndarray, int]:
    """Indexes of tensors with the same name and shape whose values say something (floats,
    not both constant: a norm trained away from its initial ones is compared with them), and
    how many tensors of any kind share name and shape (for the structural match)."""
    iq, ic, common = [], [], 0
    q_inf, c_inf, q_cmp, c_cmp = _informative(q), _informative(c), _comparable(q), _comparable(c)
    for j, i in enumerate(counterparts(q, c)):
        if i is None or c.roles[j] == SCALE:
            continue
        common += 1
        if q_cmp[i] and c_cmp[j] and (q_inf[i] or c_inf[j]):
            iq.append(i)
            ic.append(j)
    return np.array(iq, np.int64), np.array(ic, np.int64), common


def _pattern_pairs(q: Sketch, c: Sketch) -> tuple[np.ndarray, np.ndarray]:
    """Every pair of informative tensors with the same name pattern (once the wrapper prefix
    they differ by is set aside) and shape."""
    mine, theirs = _prefixes(tuple(q.names), tuple(c.names))
    groups: dict[tuple[str, tuple[int, ...]], list[int]] = {}
    for j in np.flatnonzero(_comparable(c)):
        name = c.names[j]
        groups.setdefault((pattern(name.removeprefix(theirs)), c.shapes[j]), []).append(int(j))
    iq, ic = [], []
    for i in np.flatnonzero(_informative(q)):
        for j in groups.get((pattern(q.names[i].removeprefix(mine)), q.shapes[i]), ()):
            iq.append(int(i))
            ic.append(j)
    return np.array(iq, np.int64), np.array(ic, np.int64)


def _reproduced(q: Sketch, iq: np.ndarray, cv: np.ndarray) -> np.ndarray:
    """Whether each candidate sample, cast or quantized the way the query's tensor is, gives
    the query's sample exactly."""
    qv = q.values[iq]
    out = np.zeros(qv.shape, bool)
    dtypes = np.array([q.dtypes[i] for i in iq])
    quantized = q.roles[iq] == QUANTIZED
    for dtype in set(dtypes.tolist()):
        rows = (dtypes == dtype) & ~quantized
        if rows.any():
            out[rows] = round_to(cv[rows], dtype) == qv[rows]
        rows = (dtypes == dtype) & quantized
        if rows.any():
            s = q.scales[iq][rows]
            with np.errstate(divide="ignore", invalid="ignore"):
                mine, theirs = qv[rows] / s, cv[rows] / s
            if dtype in INT_RANGE:
                lo, hi = INT_RANGE[dtype]
                out[rows] = np.rint(mine) == np.clip(np.rint(theirs), lo, hi)
            else:
                out[rows] = round_to(mine, dtype) == round_to(theirs, dtype)
    return out


def _row_distances(q: Sketch, iq: np.ndarray, cv: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per pair of a query tensor and candidate samples `cv`: the relative distance of the
    samples where the query is nonzero (a pruned query is compared on what it kept), exact
    reproductions, and samples compared."""
    qv = q.values[iq]
    mask = np.isfinite(qv) & np.isfinite(cv) & (qv != 0)
    qm, cm = np.where(mask, qv, 0.0), np.where(mask, cv, 0.0)
    norm = ((qm * qm).sum(1) + (cm * cm).sum(1)) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        dist = np.sqrt(((qm - cm) ** 2).sum(1) / norm)
    dist = np.where(norm > 0, dist, np.where(mask.any(1), 0.0, np.nan))
    exact = (_reproduced(q, iq, cv) & mask).sum(1)
    return dist, exact, mask.sum(1)


def compare(q: Sketch, c: Sketch, *, by_pattern: bool = False) -> tuple[Evidence, np.ndarray, np.ndarray]:
    """The evidence for `c` as the parent of `q`, and the tensor pairs it rests on. With
    `by_pattern`, each query tensor is compared with the closest candidate tensor of its name
    pattern and shape instead of only the one of its name."""
    iq, ic, common = _name_pairs(q, c)
    aside = _pairing(tuple(c.names), tuple(q.names))[1]
    ev = Evidence(structure=common / max(_named(q, aside) + _named(c, aside) - common, 1))
    q_inf = np.flatnonzero(_informative(q))
    if q_inf.size:
        theirs = set(c.oids)
        ev.identical = sum(q.oids[i] in theirs for i in q_inf) / q_inf.size
    if by_pattern:
        iq, ic = _pattern_pairs(q, c)
    if not iq.size:
        return ev, iq, ic
    dist, exact, counted = _row_distances(q, iq, c.values[ic])
    if by_pattern:  # keep, for each query tensor, its closest candidate tensor
        order = np.lexsort((np.nan_to_num(dist, nan=np.inf), iq))
        first = np.r_[True, iq[order][1:] != iq[order][:-1]]
        keep = order[first]
        iq, ic, dist, exact, counted = iq[keep], ic[keep], dist[keep], exact[keep], counted[keep]
    ok = counted >= 2
    if ok.any():
        kept = np.sort(dist[ok])[: max(1, math.ceil(TRIM * ok.sum()))]
        ev.distance = float(np.sqrt(np.mean(kept**2)))
        ev.exact = float(exact[ok].sum() / counted[ok].sum())
        ev.compared = int(ok.sum())
    return ev, iq[ok], ic[ok]


def compare_all(
    q: Sketch, stored: Iterable[tuple[str, str, Sketch]]
) -> tuple[list[tuple[str, str, Sketch, Evidence]], int]:
    """`compare` for every stored (id, label, sketch) at once: the matched rows of all of them
    are gathered into one array and reduced per candidate, and name matching is done once per
    distinct architecture. Returns those that share a tensor with `q`, and the count seen."""
    q_cmp, q_inf = _comparable(q), _informative(q)
    q_oids = Counter(q.oids[i] for i in np.flatnonzero(q_inf))
    matches: dict[tuple[object, ...], tuple[np.ndarray, np.ndarray, frozenset[str]]] = {}
    kept: list[tuple[str, str, Sketch, Evidence]] = []
    rows_q, gathered, owners = [], [], []
    count = 0
    for vid, label, c in stored:
        count += 1
        key = (tuple(c.names), tuple(c.shapes))
        if key not in matches:
            pairs = [(i, j) for j, i in enumerate(counterparts(q, c)) if i is not None]
            matches[key] = (
                np.array([i for i, _ in pairs], np.int64),
                np.array([j for _, j in pairs], np.int64),
                _pairing(tuple(c.names), tuple(q.names))[1],
            )
        iq, ic, aside = matches[key]
        named = c.roles[ic] != SCALE
        iq, ic, common = iq[named], ic[named], int(named.sum())
        if not common:
            continue
        ev = Evidence(structure=common / max(_named(q, aside) + _named(c, aside) - common, 1))
        if q_oids:
            ev.identical = sum(q_oids[o] for o in set(c.oids) & q_oids.keys()) / sum(q_oids.values())
        c_cmp, c_inf = _comparable(c), _informative(c)
        use = q_cmp[iq] & c_cmp[ic] & (q_inf[iq] | c_inf[ic])
        kept.append((vid, label, c, ev))
        rows_q.append(iq[use])
        gathered.append(c.values[ic[use]])
        owners.append(np.full(int(use.sum()), len(kept) - 1))
    if not kept or not sum(len(r) for r in rows_q):
        return [k for k in kept if k[3].identical], count
    iq, owner = np.concatenate(rows_q), np.concatenate(owners)
    dist, exact, counted = _row_distances(q, iq, np.concatenate(gathered))
    ok = counted >= 2
    dist = np.where(ok, np.nan_to_num(dist, nan=np.inf), np.inf)
    n = len(kept)
    compared = np.bincount(owner[ok], minlength=n)
    order = np.lexsort((dist, owner))  # by candidate, closest tensors first
    start = np.r_[0, np.cumsum(np.bincount(owner, minlength=n))[:-1]]
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size) - start[owner[order]]
    trimmed = ok & (rank < np.maximum(1, np.ceil(TRIM * compared[owner])))
    squares = np.bincount(owner[trimmed], weights=dist[trimmed] ** 2, minlength=n)
    hits = np.bincount(owner[ok], weights=exact[ok], minlength=n)
    samples = np.bincount(owner[ok], weights=counted[ok], minlength=n)
    for k, (_, _, _, ev) in enumerate(kept):
        if compared[k]:
            kept_rows = min(compared[k], max(1, math.ceil(TRIM * compared[k])))
            ev.distance = float(np.sqrt(squares[k] / kept_rows))
            ev.exact = float(hits[k] / samples[k])
            ev.compared = int(compared[k])
    return [k for k in kept if k[3].compared or k[3].identical], count


# --- relation and direction ----------------------------------------------------------------------


def _is_narrower(q: Sketch, i: int, c: Sketch, j: int) -> bool:
    if q.roles[i] == QUANTIZED and c.roles[j] != QUANTIZED:
        return True
    return PRECISION.get(q.dtypes[i], 99) < PRECISION.get(c.dtypes[j], 99) and c.roles[j] != QUANTIZED


def analyse(q: Sketch, c: Sketch, iq: np.ndarray, ic: np.ndarray) -> tuple[str, int, list[str]]:
    """The relation by which `q` would derive from `c`, the direction of derivation (+1: q
    from c, -1: c from q, 0: no one-way evidence) and the reasons, in words."""
    reasons: list[str] = []
    q_plain, c_plain = q.roles != SCALE, c.roles != SCALE
    q_params, c_params = int(q.params[q_plain].sum()), int(c.params[c_plain].sum())
    # Tensors one side has and the other lacks, buffers aside: a save that drops a
    # non-persistent buffer (`position_ids`) says nothing of which model came first.
    # Nor does a tensor a GGUF's convert script drops or moves (`_pairing`).
    pair = counterparts(q, c)
    paired = {i for i in pair if i is not None}
    aside = _pairing(tuple(c.names), tuple(q.names))[1]
    added = [
        i for i in range(len(q)) if q_plain[i] and q.roles[i] != PLAIN and i not in paired and q.names[i] not in aside
    ]
    dropped = [
        j for j in range(len(c)) if c_plain[j] and c.roles[j] != PLAIN and pair[j] is None and c.names[j] not in aside
    ]
    new = sum(int(q.params[i]) for i in added)
    missing = sum(int(c.params[j]) for j in dropped)
    same_name = np.array([pair[j] == i for i, j in zip(iq, ic, strict=True)], bool)
    changed = np.array([q.oids[i] != c.oids[j] for i, j in zip(iq, ic, strict=True)], bool) & same_name
    narrowed = np.array([_is_narrower(q, i, c, j) for i, j in zip(iq, ic, strict=True)], bool) & changed
    widened = np.array([_is_narrower(c, j, q, i) for i, j in zip(iq, ic, strict=True)], bool) & changed
    weights = q.params[iq].astype(np.float64)
    changed_params = float(weights[changed].sum())
    zero_gain = float((weights * (q.zeros[iq] - c.zeros[ic])).sum() / weights.sum()) if iq.size else 0.0
    vectors_changed = int(sum(len(q.shapes[i]) < 2 for i in iq[changed]))
    q_layers, c_layers = q.layers, c.layers

    votes = 0
    if changed_params and weights[narrowed].sum() >= 0.5 * changed_params:
        votes += 1
        reasons.append(f"{int(narrowed.sum())} tensors are lower precision or quantized in the query")
    elif changed_params and weights[widened].sum() >= 0.5 * changed_params:
        votes -= 1
        reasons.append(f"{int(widened.sum())} tensors are lower precision or quantized in the candidate")
    if zero_gain >= 0.1:
        votes += 1
        reasons.append(f"the query has {zero_gain:.0%} more exact zeros")
    elif zero_gain <= -0.1:
        votes -= 1
        reasons.append(f"the candidate has {-zero_gain:.0%} more exact zeros")
    if 0 < q_layers < c_layers:
        votes += 1
        reasons.append(f"the query has fewer layers ({q_layers} vs {c_layers})")
    elif q_layers > c_layers > 0:
        votes -= 1
        reasons.append(f"the candidate has fewer layers ({c_layers} vs {q_layers})")
    elif new and not missing and new <= 0.1 * q_params:
        votes += 1
        reasons.append(f"the query adds {len(added)} small tensors ({new:,} parameters)")
    elif missing and not new and missing <= 0.1 * c_params:
        votes -= 1
        reasons.append(f"the candidate adds {len(dropped)} small tensors ({missing:,} parameters)")
    direction = (votes > 0) - (votes < 0)

    if changed_params and weights[narrowed].sum() >= 0.5 * changed_params:
        relation = "quantize"
    elif zero_gain >= 0.1:
        relation = "prune"
    elif 0 < q_layers < c_layers or (missing > 0.2 * c_params and q_params < 0.8 * c_params):
        relation = "distill"
    elif (
        (new or changed.any())
        and new <= 0.1 * q_params
        and not vectors_changed
        and changed.sum() <= 0.5 * same_name.sum()
    ):
        relation = "adapter"
        reasons.append(
            f"only {int(changed.sum())} of {int(same_name.sum())} shared tensors changed, "
            "all of them matrices (a low-rank update merged, or none)"
        )
    else:
        relation = "finetune"
    return relation, direction, reasons


@dataclass(frozen=True)
class MergeFit:
    """Least squares q ~ x a + y b over the tensors all three share. Distances are on values
    scaled per tensor (compare them with each other only); exact shares as in `compare`."""

    x: float
    y: float
    distance: float  # of the fit
    alone: float  # of the better of a and b on its own
    exact: float  # of the fit
    exact_alone: float  # of the better of a and b on its own

    @property
    def is_merge(self) -> bool:
        """A linear merge fits to rounding error (or reproduces the query's values exactly in
        a narrower dtype), while the middle of a fine-tune chain, which also lies between its
        neighbours, fits only about half better."""
        better = self.distance <= MERGE_GAIN * self.alone or self.exact >= self.exact_alone + 0.3
        return min(self.x, self.y) >= 0.1 and self.alone > NOISE / 10 and better


def merge_fit(q: Sketch, a: Sketch, b: Sketch) -> MergeFit | None:
    ia, ja, _ = _name_pairs(q, a)
    ib, jb, _ = _name_pairs(q, b)
    common, ka, kb = np.intersect1d(ia, ib, return_indices=True)
    if common.size < 2:
        return None
    qv, av, bv = q.values[common], a.values[ja[ka]], b.values[jb[kb]]
    mask = np.isfinite(qv) & np.isfinite(av) & np.isfinite(bv) & (qv != 0)
    scale = np.sqrt(np.where(mask, qv * qv, 0).sum(1, keepdims=True) / np.maximum(mask.sum(1, keepdims=True), 1))
    scale[scale == 0] = 1
    qn, an, bn = (np.where(mask, v, 0) / scale for v in (qv, av, bv))
    gram = np.array([[(an * an).sum(), (an * bn).sum()], [(an * bn).sum(), (bn * bn).sum()]])
    rhs = np.array([(an * qn).sum(), (bn * qn).sum()])
    if abs(np.linalg.det(gram)) < 1e-9 * gram.trace() ** 2:
        return None
    x, y = (float(v) for v in np.linalg.solve(gram, rhs))

    def rms_distance(fit: np.ndarray) -> float:
        norm = ((qn * qn).sum(1) + (fit * fit).sum(1)) / 2
        rows = norm > 0
        return float(np.sqrt(np.mean(((qn - fit) ** 2).sum(1)[rows] / norm[rows]))) if rows.any() else math.inf

    def exact(fit: np.ndarray) -> float:
        return float((_reproduced(q, common, fit.astype(np.float32)) & mask).sum() / max(mask.sum(), 1))

    return MergeFit(
        x,
        y,
        rms_distance(x * an + y * bn),
        min(rms_distance(an), rms_distance(bn)),
        exact(x * av + y * bv),
        max(exact(av), exact(bv)),
    )
