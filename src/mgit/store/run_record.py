"""The `run` field of a version record: what makes a version a checkpoint of a training run
(docs/format.md, "Version record"). A checkpoint keeps its run's id, its training step, the
metrics logged at it, the training arguments, and the part of an optimizer's `state_dict()`
that is not tensors (hyperparameters, param groups, scalar state); the optimizer's tensors
(Adam's moments) are tensors of the version's files, delta-coded like the weights.

The optimizer's scalars must come back exactly as they were (`load_state_dict` then steps
bit for bit as before), so they are kept in a tagged JSON that says what JSON cannot:
`{"(tuple)": [...]}`, `{"(dict)": [[key, value], ...]}` (keys of any scalar type, in order),
`{"(tensor)": NAME}` (a tensor of the version, by name) and `{"(float)": "nan" | "inf" |
"-inf"}`. Every JSON object in the encoding is one of these tags, so nothing is ambiguous.
Nothing here imports numpy or torch: tensors are handed over by callbacks.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

RUN_KEYS = {"id", "step", "metrics"}
RUN_OPTIONAL_KEYS = {"args", "optimizer"}
MAX_RUN_ID, MAX_METRICS, MAX_METRIC_NAME = 256, 256, 128
MAX_DEPTH, MAX_NODES, MAX_STRING = 32, 200_000, 65536
MAX_STEP = 2**63 - 1
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
TAGS = ("(tuple)", "(dict)", "(tensor)", "(float)")
# Keys of training arguments never recorded: credentials a Trainer is given (hub_token and the like).
SECRET = re.compile(r"token|secret|password|passwd|api_key|apikey|credential", re.IGNORECASE)


class RunFieldError(ValueError):
    """A `run` field, or an optimizer state to encode into one, that cannot be (the record's
    reader turns it into a RecordError, `commit_checkpoint` into an InputError)."""


def checked_run(value: Any, error: type[Exception] = RunFieldError) -> dict[str, Any]:
    """A `run` field as a reader must find it; anything else raises `error` (a record's
    RecordError) saying what is wrong."""

    def check(cond: bool, what: str) -> None:
        if not cond:
            raise error(f"run {what}")

    check(isinstance(value, dict), "is not an object")
    keys = set(value)
    check(RUN_KEYS <= keys <= RUN_KEYS | RUN_OPTIONAL_KEYS, f"is not an object of {', '.join(sorted(RUN_KEYS))}")
    run_id = value["id"]
    check(isinstance(run_id, str) and 0 < len(run_id) <= MAX_RUN_ID, "id is not a name")
    check(CONTROL.search(run_id) is None, "id has a control character")
    step = value["step"]
    check(step is None or _count(step, MAX_STEP), "step is not a count")
    metrics = value["metrics"]
    check(isinstance(metrics, dict) and len(metrics) <= MAX_METRICS, "metrics is not an object of numbers")
    for name, number in metrics.items():
        check(0 < len(name) <= MAX_METRIC_NAME and CONTROL.search(name) is None, f"metric name {name[:40]!r}")
        check(number is None or _finite(number), f"metric {name!r} is not a finite number")
    try:
        if "args" in value:
            check(isinstance(value["args"], dict), "args is not an object")
            _check_json(value["args"], tagged=False)
        if "optimizer" in value:
            _check_json(value["optimizer"], tagged=True)
    except RunFieldError as exc:
        raise error(f"run {exc}") from None
    return value


def _count(value: Any, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= high


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_json(value: Any, *, tagged: bool) -> None:
    """Plain JSON (training arguments) or the tagged encoding (an optimizer's scalars), of
    bounded depth and size, strings without control characters, numbers finite."""
    nodes = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        nodes += 1
        if depth > MAX_DEPTH or nodes > MAX_NODES:
            raise RunFieldError("is nested too deep or too large")
        if isinstance(item, str):
            if len(item) > MAX_STRING or CONTROL.search(item):
                raise RunFieldError("has a string too long or with a control character")
        elif isinstance(item, float) and not math.isfinite(item):
            raise RunFieldError("has a number that is not finite")
        elif isinstance(item, list):
            stack.extend((x, depth + 1) for x in item)
        elif isinstance(item, dict):
            if tagged:
                _check_tag(item)
                stack.append((next(iter(item.values())), depth + 1))
            else:
                stack.extend((k, depth + 1) for k in item)
                stack.extend((v, depth + 1) for v in item.values())
        elif not (item is None or isinstance(item, bool | int | float)):
            raise RunFieldError("holds a value that is not JSON")


def _check_tag(item: dict[str, Any]) -> None:
    if len(item) != 1 or next(iter(item)) not in TAGS:
        raise RunFieldError(f"optimizer has an object that is not one of {', '.join(TAGS)}")
    tag, body = next(iter(item.items()))
    ok = {
        "(tuple)": lambda: isinstance(body, list),
        "(dict)": lambda: isinstance(body, list) and all(isinstance(p, list) and len(p) == 2 for p in body),
        "(tensor)": lambda: isinstance(body, str),
        "(float)": lambda: body in ("nan", "inf", "-inf"),
    }[tag]()
    if not ok:
        raise RunFieldError(f"optimizer has a malformed {tag}")


def encode_state(value: Any, tensor: Callable[[Any], str | None], path: str = "") -> Any:
    """An optimizer's `state_dict()` (or any tree of dicts, lists, tuples and scalars) in the
    tagged encoding. `tensor(value, path)` returns the name a tensor is stored under, or None
    for a value that is not a tensor; `path` names where in the tree a value is."""
    name = tensor(value, path)
    if name is not None:
        return {"(tensor)": name}
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"(float)": str(value)}
    if isinstance(value, tuple):
        return {"(tuple)": [encode_state(v, tensor, f"{path}.{i}") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [encode_state(v, tensor, f"{path}.{i}") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        pairs = []
        for k, v in value.items():
            if not (k is None or isinstance(k, bool | int | float | str)):
                raise RunFieldError(f"a key of type {type(k).__name__} at {path or 'the top'}")
            pairs.append([encode_state(k, lambda *_: None), encode_state(v, tensor, f"{path}.{k}".lstrip("."))])
        return {"(dict)": pairs}
    raise RunFieldError(f"a value of type {type(value).__name__} at {path or 'the top'}")


def decode_state(value: Any, tensor: Callable[[str], Any]) -> Any:
    """The tree `encode_state` encoded; `tensor(name)` gives back a stored tensor."""
    if isinstance(value, list):
        return [decode_state(v, tensor) for v in value]
    if not isinstance(value, dict):
        return value
    tag, body = next(iter(value.items()))
    if tag == "(tensor)":
        return tensor(body)
    if tag == "(float)":
        return float(body)
    if tag == "(tuple)":
        return tuple(decode_state(v, tensor) for v in body)
    return {decode_state(k, tensor): decode_state(v, tensor) for k, v in body}


def public_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """Training arguments as a record keeps them: JSON values only (anything else as its
    text), credentials left out (hub_token and the like, whatever their value)."""
    out: dict[str, Any] = {}
    for key, value in args.items():
        if not isinstance(key, str) or SECRET.search(key):
            continue
        out[key] = _plain(value)
    return out


def _plain(value: Any, depth: int = 0) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if depth < 8 and isinstance(value, list | tuple):
        return [_plain(v, depth + 1) for v in value]
    if depth < 8 and isinstance(value, Mapping):
        return {str(k): _plain(v, depth + 1) for k, v in value.items() if not SECRET.search(str(k))}
    return str(getattr(value, "value", value))
