"""The training script the killed-trainer tests run in a child process: a small MLP trained
with AdamW that commits a checkpoint with its optimizer state at every step and prints, per
step, a JSON line with the step, the committed version (when it waits for it) and the
sha256 of its weights, to compare with what a checkout gives back."""

from __future__ import annotations

import textwrap


def trainer_script(steps: int, *, wait: bool) -> str:
    """The script (argv[1]: the repository): `steps` steps, each committed in the run
    "killed"; `wait=False` commits in the background (no version id to print)."""
    commit = (
        "r = repo.commit_checkpoint(model.state_dict(), model='ft', step=step, metrics={'loss': float(loss)},\n"
        f"                           optimizer=opt.state_dict(), run='killed', wait={wait})"
    )
    version = ', "version": r.version' if wait else ""
    return (
        textwrap.dedent(
            """
        import hashlib, json, sys, torch
        from mgit import Repo

        def sha(state):
            h = hashlib.sha256()
            for name in sorted(state):
                h.update(name.encode() + state[name].contiguous().view(torch.uint8).numpy().tobytes())
            return h.hexdigest()

        repo = Repo(sys.argv[1])
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for step in range(1, STEPS):
            loss = model(torch.randn(8, 256)).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
        COMMIT
            print(json.dumps({"step": step VERSION, "sha": sha(model.state_dict())}), flush=True)
        """
        )
        .replace("STEPS", str(steps))
        .replace("COMMIT", textwrap.indent(commit, "    "))
        .replace(" VERSION", version)
    )
