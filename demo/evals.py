"""The demo's test, attached with `mgit test add ... --fn demo/evals.py:sentiment_accuracy`:
held-out accuracy on the generated sentiment task (sentences whose keywords never occur in
training), read from a checked-out model folder. Run only by the commands that run tests.

It scores the first EXAMPLES held-out sentences (of 500) to keep the demo quick; the family
builder's `--evaluate` scores all of them."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import torch  # noqa: E402
from minilm_family import THREADS, load_classifier, read_weights, task_examples, tokenize  # noqa: E402

EXAMPLES = 200


def sentiment_accuracy(folder: str) -> dict[str, float]:
    """Its own head, or in a merged model that kept each task's head, the one named sentiment."""
    head = "sentiment." if "sentiment.classifier.weight" in read_weights(Path(folder)) else ""
    return {"accuracy": task_accuracy(folder, "sentiment", head)}


def task_accuracy(folder: str, task: str, head: str = "") -> float:
    """Held-out accuracy of a model folder on `task`, with the classifier head whose tensors
    are named `{head}classifier.*` (a merged model that kept each task's head)."""
    torch.set_num_threads(THREADS)
    model_dir = Path(folder)
    weights = read_weights(model_dir)
    if head:  # that head as `classifier.*`, the other heads left out
        chosen = {n[len(head) :]: w for n, w in weights.items() if n.startswith(head)}
        weights = {n: w for n, w in weights.items() if "classifier." not in n} | chosen
    model = load_classifier(model_dir, weights).eval()
    test = task_examples(task, "test")[:EXAMPLES]
    tokens = tokenize(model_dir, test)
    with torch.inference_mode():
        predictions = model(tokens["input_ids"], tokens["attention_mask"]).argmax(-1).tolist()
    return sum(p == label for p, (_, label) in zip(predictions, test, strict=True)) / len(test)
