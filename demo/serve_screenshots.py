"""The README's pictures of `mgit serve`: a small BERT-shaped family (generated weights, no
download) served on 127.0.0.1 and photographed in Debian's chromium through playwright.

    .venv/bin/python demo/serve_screenshots.py        # writes docs/serve-diff.png, docs/serve-models.png
"""

from __future__ import annotations

import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import uvicorn

from mgit import Repo
from mgit.checks import Checks, Condition
from mgit.web.app import create_app

ROOT = Path(__file__).resolve().parents[1]
KINDS = {
    "attention.query.weight": (32, 32),
    "attention.key.weight": (32, 32),
    "attention.value.weight": (32, 32),
    "attention.output.weight": (32, 32),
    "intermediate.weight": (64, 32),
    "output.weight": (32, 64),
    "output.norm.weight": (32,),
}
EVALS = (
    "def accuracy(folder):\n    return {'accuracy': 0.62 if 'int8' in open(folder + '/config.json').read() else 0.91}\n"
)


def bert(seed: int, base: dict[str, np.ndarray] | None = None, change: float = 0.0) -> dict[str, np.ndarray]:
    """Six layers; a fine-tune changes later layers more, as fine-tunes do."""
    rng = np.random.default_rng(seed)
    out = {"embeddings.word.weight": rng.standard_normal((128, 32)).astype(np.float32)}
    for i in range(6):
        for kind, shape in KINDS.items():
            name = f"encoder.layer.{i}.{kind}"
            noise = rng.standard_normal(shape).astype(np.float32)
            out[name] = noise if base is None else base[name] + noise * np.float32(change * 4 ** (i / 5))
    if base is not None:
        out["embeddings.word.weight"] = base["embeddings.word.weight"]
    return out


def folder(root: Path, name: str, state: dict[str, np.ndarray], config: dict[str, object]) -> Path:
    import json

    from safetensors.numpy import save_file

    path = root / name
    path.mkdir(parents=True)
    save_file(state, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (path / "README.md").write_text(f"---\nlicense: apache-2.0\n---\n# {name}\n\nA model of the screenshot family.\n")
    return path


def family(root: Path) -> Repo:
    repo = Repo.init(root / "repo")
    base = bert(0)
    config = {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 6}
    repo.add(folder(root, "bert-base", base, config), name="bert-base", message="pretrained", tags={"arch": "bert"})
    sst2 = bert(1, base, 0.002)
    repo.add(
        folder(root, "bert-sst2", sst2, {**config, "num_labels": 2}),
        name="bert-sst2",
        parent="bert-base",
        tags={"task": "sst2"},
        message="SST-2, 3 epochs",
    )
    repo.add(
        folder(root, "bert-mnli", bert(2, base, 0.004), {**config, "num_labels": 3}),
        name="bert-mnli",
        parent="bert-base",
        tags={"task": "mnli"},
        message="MNLI, 2 epochs",
    )
    int8 = {k: (np.round(v * 16) / 16).astype(np.float32) for k, v in sst2.items()}
    repo.add(
        folder(root, "bert-sst2-int8", int8, {**config, "num_labels": 2, "quantization": "int8"}),
        name="bert-sst2-int8",
        parent="bert-sst2",
        relation="quantize",
    )
    repo.add(folder(root, "bert-base-v2", bert(3, base, 0.0005), config), name="bert-base", message="more steps")
    (repo.root / "evals.py").write_text(EVALS)
    Checks(repo).attach("bert-sst2", "evals.py:accuracy", conditions=[Condition("accuracy", "min", 0.9)], inherit=True)
    Checks(repo).run()
    return repo


def main() -> None:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        repo = family(Path(tmp))
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        base = f"http://127.0.0.1:{sock.getsockname()[1]}"
        server = uvicorn.Server(uvicorn.Config(create_app(repo), log_level="warning"))
        threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
        for _ in range(200):  # bounded: 10 s
            if server.started:
                break
            time.sleep(0.05)
        else:
            sys.exit("the server did not start in 10 s")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--headless", "--no-sandbox"])
            page = browser.new_page(viewport={"width": 1200, "height": 760})
            page.goto(base + "/models")
            page.screenshot(path=str(ROOT / "docs" / "serve-models.png"))
            page.goto(base + "/diff?a=bert-base@1&b=bert-sst2")
            page.wait_for_selector("#heatmap", timeout=30_000)
            page.screenshot(path=str(ROOT / "docs" / "serve-diff.png"))
            browser.close()
        server.should_exit = True
    print("wrote docs/serve-diff.png and docs/serve-models.png")


if __name__ == "__main__":
    main()
