"""Defaults that bound how long user code runs, in a module that imports nothing (the CLI's
options and `Repo` need them without loading the machinery that runs user code)."""

DEFAULT_TIMEOUT = 600.0  # seconds a test or gate run may take unless told otherwise
