"""Hooks into the frameworks people train with, through their documented interfaces (a
transformers `TrainerCallback`), never by patching them. Each module imports its framework at
its top: importing `mgit` or this package imports none of them."""
