"""Models as Python objects straight from the store, with no checkout and no file written.

    >>> import mgit
    >>> sd = mgit.load("bert-sst2")                          # {name: torch.Tensor}
    >>> sds = mgit.load_many(["bert-base", "bert-sst2"])    # shared tensors loaded once
    >>> model = mgit.load_pretrained("bert-sst2", AutoModelForSequenceClassification)
    >>> tokenizer = mgit.load_pretrained("bert-sst2", AutoTokenizer)

`load_many` is MGit's collocation: a tensor that several of the models hold (the same
object id: an unchanged embedding, a frozen encoder) is decoded once and is the same array
or tensor in every state dict, so memory grows with what the models do not share. Such a
tensor must not be changed in place: numpy arrays come read-only; a torch tensor cannot be
marked so (clone it before writing to it).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Any

from mgit.errors import InputError, InvalidOptionError, MissingDependencyError
from mgit.formats.tensors import TORCH_SUFFIXES
from mgit.repo.repository import Repo
from mgit.store.objectformat import file_expected
from mgit.store.objects import Manifest
from mgit.store.reader import state_dicts

LOADING_OPTIONS = {"device_map", "attn_implementation", "quantization_config", "key_mapping"}  # from_pretrained's own
# Weight files other frameworks write, which MGit keeps as bytes: a version holding its weights
# only in one of these has no tensors to load, and that is said rather than loaded as nothing.
OPAQUE_WEIGHTS = (*TORCH_SUFFIXES, ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx")
RepoLike = Repo | str | os.PathLike[str] | None

__all__ = ["load", "load_many", "load_pretrained"]


def load(
    ref: str,
    *,
    repo: RepoLike = None,
    framework: str = "torch",
    device: Any = None,
    dtype: Any = None,
    jobs: int | None = None,
    merged: bool = False,
) -> dict[str, Any]:
    """Every tensor of a version, by name: torch tensors (`framework="torch"`, on `device`)
    or numpy arrays ("numpy"). `dtype` converts floating tensors (a torch dtype, a numpy
    dtype or a name such as "bfloat16"); others keep theirs. `repo` is a Repo or its path
    (default: found from the current folder). Memory: the model and the few delta bases
    its tensors decode against. With `merged`, `ref` is a PEFT adapter (LoRA, DoRA, IA3) and
    the state dict is its base's with the adapter merged, as peft's `merge_and_unload` makes it
    (mgit.merging.adapters; needs torch)."""
    if merged:
        return _merged(ref, _open(repo), framework, device, dtype, jobs)
    return _load([ref], _open(repo), framework, device, dtype, jobs, shared=False)[0]


def _merged(ref: str, repo: Repo, framework: str, device: Any, dtype: Any, jobs: int | None) -> dict[str, Any]:
    """The merged state dict of an adapter and its base (see `load`)."""
    from mgit.merging.adapters import adapter_base, merged_state

    if framework not in ("torch", "numpy"):
        raise InvalidOptionError(f"unknown framework {framework!r}", hint="Use torch or numpy")
    _module("torch", "Merging an adapter")
    vid = repo.resolve(ref)
    adapter = _adapter(repo, vid, ref)
    base, tensors = _load([adapter_base(repo, vid), vid], repo, "torch", None, None, jobs, shared=False)
    state = {**base, **merged_state(adapter, base, tensors, label=f"{ref}:adapter_config.json")}
    for name, t in state.items():
        if dtype is not None and t.is_floating_point():
            t = t.to(_torch_dtype(dtype))
        state[name] = t.to(device) if device is not None else t
    return {k: v.numpy() for k, v in state.items()} if framework == "numpy" else state


def _torch_dtype(dtype: Any) -> Any:
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    name = getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or str(dtype)
    found = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(found, torch.dtype):
        raise InvalidOptionError(f"{dtype!r} is not a dtype", hint="Give a torch dtype or a name such as bfloat16")
    return found


def _adapter(repo: Repo, vid: str, ref: str) -> Any:
    from mgit.repo.adapters import stored_adapter

    adapter = stored_adapter(repo.store, repo.manifest(vid), label=f"{ref}:adapter_config.json")
    if adapter is None:
        raise InputError(ref, "has no adapter_config.json: it is not a PEFT adapter", hint="Load it without merged")
    return adapter


def _peft_model(repo: Repo, vid: str, ref: str, model_class: Any, kwargs: dict[str, Any]) -> Any:
    """An adapter's base built as `load_pretrained` builds a model, with the adapter applied
    through peft (`PeftModel`, in inference mode, as `PeftModel.from_pretrained` loads it)."""
    from mgit.merging.adapters import adapter_base

    try:
        import peft
    except ImportError:
        raise MissingDependencyError("peft", "Loading a PEFT adapter", "peft") from None
    adapter = _adapter(repo, vid, ref)
    model = load_pretrained(adapter_base(repo, vid), model_class, repo=repo, **kwargs)
    config = peft.PeftConfig.from_peft_type(**dict(adapter.config))
    config.inference_mode = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wrapped = peft.PeftModel(model, config)
        state = _load([vid], repo, "torch", None, None, None, shared=False)[0]
        result = peft.set_peft_model_state_dict(wrapped, state)
    if result.unexpected_keys:
        raise InputError(ref, f"peft found no place for its tensor {result.unexpected_keys[0]!r} in the base model")
    return wrapped.eval()


def load_many(
    refs: Sequence[str],
    *,
    repo: RepoLike = None,
    framework: str = "torch",
    device: Any = None,
    dtype: Any = None,
    jobs: int | None = None,
) -> list[dict[str, Any]]:
    """One state dict per ref (in order), as `load` gives, in which every tensor several of
    the models hold is one tensor in memory, decoded once (read-only: see the module's
    docstring). Memory: the distinct tensors, plus the delta bases of models not asked for
    while the load runs."""
    return _load(list(refs), _open(repo), framework, device, dtype, jobs, shared=True)


def load_pretrained(ref: str, model_class: Any, *, repo: RepoLike = None, **kwargs: Any) -> Any:
    """A transformers model (or tokenizer) built from a version: `model_class` is an Auto
    class (`AutoModelForSequenceClassification`, `AutoTokenizer`) or a concrete one; its
    config.json (tokenizer files) are read from the version and the weights from the store,
    with nothing written to disk. A PEFT adapter's version gives its base (its parent of
    relation `adapter`) with the adapter applied: a `peft.PeftModel` (needs peft). `kwargs`
    go to `from_pretrained` (`dtype` or `torch_dtype` converts the weights as they load)."""
    repo_ = _open(repo)
    vid = repo_.resolve(ref)
    manifest = repo_.manifest(vid)
    transformers = _module("transformers", "Loading a transformers model")
    adapter = any(f.path == "adapter_config.json" for f in manifest.files)
    if isinstance(model_class, type) and _is_tokenizer(model_class, transformers):
        if adapter and not any(f.path == "tokenizer.json" for f in manifest.files):
            from mgit.merging.adapters import adapter_base

            return load_pretrained(adapter_base(repo_, vid), model_class, repo=repo_, **kwargs)
        return _tokenizer(repo_, manifest, ref, transformers, kwargs)
    if adapter:
        return _peft_model(repo_, vid, ref, model_class, kwargs)
    _require_tensors(ref, manifest)
    config = _config(repo_, manifest, ref, transformers)
    concrete = model_class
    mapping = getattr(model_class, "_model_mapping", None)
    if mapping is not None:  # an Auto class: the concrete class for this config
        try:
            concrete = mapping[type(config)]
        except KeyError:
            raise InvalidOptionError(
                f"{model_class.__name__} has no model for {ref}'s model_type {config.model_type!r}",
                hint="Pass a class that fits its config.json",
            ) from None
    dtype = kwargs.pop("dtype", kwargs.pop("torch_dtype", None))
    for key in [k for k in kwargs if k not in LOADING_OPTIONS and hasattr(config, k)]:
        setattr(config, key, kwargs.pop(key))  # as from_pretrained does: num_labels=3 configures the model
    state = _load([vid], repo_, "torch", None, dtype, None, shared=False)[0]
    if not state:
        raise InputError(ref, "has no tensors: there are no weights to build a model from")
    wants_info = kwargs.pop("output_loading_info", False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model, info = concrete.from_pretrained(
            None, config=config, state_dict=state, output_loading_info=True, **kwargs
        )
    _require_weights_used(ref, model, info, len(state))
    return (model, info) if wants_info else model


def _require_weights_used(ref: str, model: Any, info: dict[str, Any], count: int) -> None:
    """A model none of whose parameters came from the version would be randomly initialised
    with no more than a logged warning: that is an error here. A model some of whose weights
    are new (a task head on a base, as transformers allows) is returned as transformers does."""
    missing = set(info.get("missing_keys", ())) | {m[0] for m in info.get("mismatched_keys", ())}
    expected = set(model.state_dict())
    if expected and expected <= missing:
        names = sorted(info.get("unexpected_keys", ()))[:2]
        raise InputError(
            ref,
            f"none of its {count} tensors fit {type(model).__name__} (unexpected: {', '.join(names) or 'none'}):"
            " the model would be all random weights",
            hint="Load it with the class its config.json and weights were saved for",
        )


def _open(repo: RepoLike) -> Repo:
    return repo if isinstance(repo, Repo) else Repo(repo)


def _module(name: str, what: str) -> Any:
    try:
        return __import__(name)
    except ImportError:
        raise MissingDependencyError(name, what, "torch" if name == "torch" else "demo") from None


def _load(
    refs: list[str], repo: Repo, framework: str, device: Any, dtype: Any, jobs: int | None, *, shared: bool
) -> list[dict[str, Any]]:
    """These versions' state dicts (mgit.store.reader.state_dicts), their objects fetched at once
    in a lazy clone."""
    versions = [(vid, repo.manifest(vid)) for vid in (repo.resolve(r) for r in refs)]
    for ref, (_, manifest) in zip(refs, versions, strict=True):
        _require_tensors(ref, manifest)
    if repo.store.lazy:
        repo.store.fetch({t.object for _, m in versions for t in m.tensors()})
    return state_dicts(repo.store, versions, framework=framework, device=device, dtype=dtype, jobs=jobs, shared=shared)


def _require_tensors(ref: str, manifest: Manifest) -> None:
    """Refuses a version whose weights are only in files MGit keeps as bytes (a PyTorch pickle,
    a GGUF file): loading it would give an empty state dict, or a model of random weights."""
    if manifest.tensors():
        return
    opaque = [f.path for f in manifest.files if PurePosixPath(f.path).suffix.lower() in OPAQUE_WEIGHTS]
    if opaque:
        raise InputError(
            f"{ref}:{opaque[0]}",
            "holds the weights in a file MGit stores as opaque bytes (never unpickled), so it has no tensors to load",
            hint=f"Check it out (mgit checkout {ref}) and load the folder with from_pretrained",
        )


def _file(repo: Repo, manifest: Manifest, ref: str, path: str) -> bytes | None:
    found = next((f for f in manifest.files if f.path == path), None)
    return None if found is None else repo.store.get(found.object, expect=file_expected(found))[1].tobytes()


def _config(repo: Repo, manifest: Manifest, ref: str, transformers: Any) -> Any:
    raw = _file(repo, manifest, ref, "config.json")
    if raw is None:
        raise InputError(
            ref,
            "has no config.json: transformers cannot tell what model it is",
            hint="Add the model's folder with its config.json",
        )
    try:
        data = json.loads(raw)
        model_type = data.pop("model_type")
        return transformers.AutoConfig.for_model(model_type, **data)
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{ref}:config.json", f"is not a transformers config ({exc})") from None


def _is_tokenizer(cls: type, transformers: Any) -> bool:
    return cls is transformers.AutoTokenizer or issubclass(cls, transformers.PreTrainedTokenizerBase)


def _tokenizer(repo: Repo, manifest: Manifest, ref: str, transformers: Any, kwargs: dict[str, Any]) -> Any:
    """A fast tokenizer from the version's tokenizer.json, configured by its
    tokenizer_config.json and special_tokens_map.json, as `AutoTokenizer` would build it."""
    raw = _file(repo, manifest, ref, "tokenizer.json")
    if raw is None:
        raise InputError(
            ref,
            "has no tokenizer.json (a fast tokenizer's file)",
            hint="Add the model's folder with its tokenizer files",
        )
    from tokenizers import Tokenizer

    options: dict[str, Any] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        text = _file(repo, manifest, ref, name)
        if text is not None:
            data = json.loads(text)
            options.update(
                {k: v for k, v in data.items() if k not in ("tokenizer_class", "auto_map", "added_tokens_decoder")}
            )
    options.update(kwargs)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(raw.decode()), **options)
