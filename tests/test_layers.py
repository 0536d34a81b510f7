"""The shape of the package: what the child process that runs user code imports, what the
commands that touch no tensor import, which errors the library raises, codecs that describe
themselves, modules small enough to read.
(The import layers themselves are checked by import-linter in `make test` and `make lint`;
pyproject.toml states them.)"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "mgit"
BUILTIN = ("RuntimeError", "ValueError", "Exception")


def test_the_user_code_child_imports_neither_the_library_nor_numpy() -> None:
    probe = (
        "import json, sys, mgit.usercode; "
        "print(json.dumps(sorted(m for m in sys.modules if m == 'numpy' or m.split('.')[0] == 'mgit')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(done.stdout) == ["mgit", "mgit.errors", "mgit.reports", "mgit.usercode"]


def test_the_package_runs_without_pytest_and_only_its_test_kit_needs_it() -> None:
    probe = (
        "import json, sys, mgit, mgit.repo, mgit.cli.main, mgit.store.lazy, mgit.store.overlay, mgit.store.remote\n"
        "before = sorted(m for m in sys.modules if m.split('.')[0] == 'pytest' or m.startswith('mgit.testing'))\n"
        "import mgit.testing.store\n"
        "print(json.dumps([before, 'pytest' in sys.modules]))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(done.stdout) == [[], True]


def test_the_package_still_offers_its_names_lazily() -> None:
    import mgit

    assert mgit.Repo.__module__ == "mgit.repo.repository" and issubclass(mgit.UnknownRefError, mgit.MgitError)
    with pytest.raises(AttributeError):
        mgit.NoSuchThing  # noqa: B018


def _bare_root_errors() -> list[str]:
    """`MgitError(...)` constructed anywhere but in a subclass's `super().__init__`."""
    found = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "MgitError":
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    return found


def test_every_error_is_a_specific_subclass_with_what_is_at_fault() -> None:
    assert _bare_root_errors() == []


def _error_classes() -> dict[str, list[str]]:
    """Every class of the package that derives from MgitError, directly or through another
    error: its name and the modules that define it."""
    bases: dict[str, list[tuple[str, set[str]]]] = {}
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                names = {
                    b.id if isinstance(b, ast.Name) else b.attr
                    for b in node.bases
                    if isinstance(b, (ast.Name, ast.Attribute))
                }
                bases.setdefault(node.name, []).append((str(path.relative_to(SRC)), names))
    errors = {"MgitError"}
    while grown := {n for n, defs in bases.items() if n not in errors and any(b & errors for _, b in defs)}:
        errors |= grown
    return {n: [where for where, _ in bases[n]] for n in errors}


def test_every_error_is_defined_in_errors_and_offered_by_the_package() -> None:
    import inspect

    import mgit
    import mgit.errors

    classes = _error_classes()
    assert {n: where for n, where in classes.items() if where != ["errors.py"]} == {}
    public = {n for n, v in vars(mgit.errors).items() if inspect.isclass(v) and issubclass(v, mgit.MgitError)}
    assert public == set(classes) and len(public) > 40
    assert {n for n in public if getattr(mgit, n, None) is not getattr(mgit.errors, n)} == set()
    assert public <= set(mgit.__all__)


def test_no_builtin_error_is_raised_where_a_user_could_meet_it() -> None:
    # RuntimeError and ValueError escape the CLI's one-line mapping. Codec configuration
    # checks raise ValueError on purpose: codec_from_dict turns it into a CodecError.
    allowed = {"codecs", "formats"}
    found = []
    for path in SRC.rglob("*.py"):
        if path.relative_to(SRC).parts[0] in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            call = node.exc if isinstance(node, ast.Raise) else None
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in BUILTIN:
                found.append(f"{path.relative_to(SRC)}:{node.lineno} {call.func.id}")
    # sketch.py parses its own blob and turns ValueError into "computed again"; usercode's
    # child reports any exception as the run's failure.
    assert [f for f in found if not f.startswith(("lineage/sketch.py", "usercode.py"))] == []


def test_catalog_inconsistency_is_an_mgit_error_with_a_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from conftest import tensors

    from mgit import Repo
    from mgit.errors import CatalogError
    from mgit.index.catalog import Catalog

    repo = Repo.init(tmp_path / "repo")
    first = repo.add(tensors(1), name="m").version
    second = repo.add(tensors(2), name="m").version
    catalog = Catalog(tmp_path / "catalog.sqlite")
    catalog.index(repo.store, first)
    read_manifest = repo.store.get_manifest

    def pruned_meanwhile(oid: str) -> object:
        # Between finding the predecessor indexed and writing: a writer that saw no head
        # prunes every version, so the predecessor the index counts on is gone.
        catalog.set_heads(dict)
        return read_manifest(oid)

    monkeypatch.setattr(repo.store, "get_manifest", pruned_meanwhile)
    expected = f"predecessor {first[:12]} of version {second[:12]} is not indexed"
    with pytest.raises(CatalogError, match=expected) as caught:
        catalog.index(repo.store, second)
    assert "rebuild-catalog" in (caught.value.hint or "")
    assert not catalog.has_version(second)  # nothing of the failed transaction was kept


def test_a_codec_says_what_it_is_and_nothing_else_needs_to_know() -> None:
    from mgit.codecs import Codec, codec_class
    from mgit.codecs.base import register
    from mgit.index.catalog import storage_class

    expected = {
        "xor_delta": "delta",
        "sub_delta": "delta",
        "patch": "delta",
        "quantized_delta": "delta",
        "cast": "derived",
        "quantize_int8": "derived",
        "absmax_scale": "derived",
        "low_rank": "derived",
        "transpose": "derived",
        "byteplanes": "standalone",
        "zstd": "standalone",
        "pco": "standalone",
    }
    assert {name: codec_class(name).storage for name in expected} == expected
    assert {n for n in expected if codec_class(n).ends_family} == {
        "cast",
        "quantize_int8",
        "absmax_scale",
        "patch",
        "transpose",
    }
    assert {n for n in expected if codec_class(n).predictive} == {
        "cast",
        "quantize_int8",
        "absmax_scale",
        "quantized_delta",
        "low_rank",
        "transpose",
    }

    @register
    @dataclass(frozen=True)
    class HalvesCodec(Codec):  # a new codec: its own class and one registration
        name = "test_halves"
        storage = "derived"

    assert storage_class("test_halves+zstd") == "derived" and storage_class("raw") == "standalone"


def test_modules_are_small_enough_to_read_or_say_why_not() -> None:
    long = []
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        doc = ast.get_docstring(ast.parse(text)) or ""
        if text.count("\n") > 520 and "not split" not in doc:
            long.append(f"{path.relative_to(SRC)}: {text.count(chr(10))} lines")
    assert long == []


# What each command that touches no tensor imports besides the standard library (and mgit):
# `mgit ls` must not wait for numpy, torch, rich, boto3 or the codecs. How long it takes is
# measured in benchmarks/startup.py; this says what it loads.
STARTUP_IMPORTS = {
    "--version": {"click"},
    "ls": {"click", "blake3"},
    "log m": {"click", "blake3"},
    "show m": {"click", "blake3", "zstandard"},  # (the manifest is a stored record)
    "lineage": {"click", "blake3"},
    "du": {"click", "blake3"},
}
NEVER_AT_STARTUP = ("numpy", "torch", "safetensors", "rich", "boto3", "botocore", "transformers", "peft", "pcodec")


@pytest.mark.parametrize("command", sorted(STARTUP_IMPORTS))
def test_commands_that_touch_no_tensor_import_only_what_they_use(tmp_path: Path, command: str) -> None:
    from conftest import tensors

    from mgit import Repo

    repo = Repo.init(tmp_path)
    repo.add(tensors(1), name="base")
    repo.add(tensors(2), name="m", parent="base", relation="finetune")
    probe = (
        "import io, json, sys, contextlib\n"
        "before = set(sys.modules)\n"
        "from mgit.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        f"    code = main({['-C', str(tmp_path), *command.split()]!r})\n"
        "print(json.dumps([code, out.getvalue(), sorted(set(sys.modules) - before)]))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    code, printed, loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert code == 0 and ("base" in printed or command == "--version"), printed
    packages = {m.split(".")[0] for m in loaded} - set(sys.stdlib_module_names) - {"mgit"}
    assert packages == STARTUP_IMPORTS[command] and not packages & set(NEVER_AT_STARTUP), sorted(packages)
    ours = {m for m in loaded if m.split(".")[0] == "mgit"}
    assert not {m for m in ours if m.startswith(("mgit.codecs", "mgit.diff", "mgit.sync", "mgit.checks"))}
    running = {"subprocess", "tempfile", "concurrent.futures", "traceback"} & set(loaded)  # what runs things needs
    assert not running, running
    if command == "--version":  # answered by click before any command module or the library is loaded
        assert ours == {"mgit", "mgit.cli", "mgit.cli.main", "mgit.errors"}
    if command in ("ls", "log m", "show m"):
        assert "mgit.lineage.graph" not in ours and "mgit.cli.commands" not in ours
        assert not {m for m in ours if m.startswith("mgit.remotes")}  # (remote-tracking refs: lineage's alone)
    if command in ("ls", "log m", "lineage"):  # (they read the catalog: the object store is not even opened)
        assert not {"mgit.store.base", "mgit.store.local", "mgit.store.objectformat"} & ours
    # what signs and judges signatures (keys, allowed signers, SSHSIG parsing), and the results of the
    # verbs that write or check, each in its verb's module: none of them for a command that only reads
    elsewhere = {"mgit.signing.keys", "mgit.signing.allowed", "mgit.signing.sshsig", "mgit.signing.agent"}
    elsewhere |= {f"mgit.repo.{m}" for m in ("fsck", "gc", "remove", "renaming", "tagging", "retention", "checkout")}
    elsewhere |= {"mgit.repo.add", "mgit.lineage.inference", "mgit.lineage.sketch", "mgit.store.reader"}
    elsewhere |= {"mgit.repo.tensors", "mgit.repo.signatures"}  # (show --tensors'; sign and verify)
    assert not elsewhere & ours, sorted(elsewhere & ours)
    if command != "show m":  # (what show says of adapters and quantization schemes)
        assert not {"mgit.formats.adapter", "mgit.formats.quant_config", "mgit.repo.adapters"} & ours


def test_the_console_script_answers_version_before_loading_click() -> None:
    from conftest import run_cli

    probe = (
        "import io, json, sys, contextlib\n"
        "from mgit.cli import entry\n"
        "sys.argv = ['mgit', '--version']\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    try:\n"
        "        entry()\n"
        "    except SystemExit as exc:\n"
        "        code = exc.code\n"
        "ours = sorted(m for m in sys.modules if m.split('.')[0] == 'mgit')\n"
        "print(json.dumps([code, out.getvalue(), ours, 'click' in sys.modules]))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    code, printed, ours, click_loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert code == 0 and ours == ["mgit", "mgit.cli"] and not click_loaded
    assert printed == run_cli("--version")[1]  # word for word what click's version option prints
