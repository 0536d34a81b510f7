"""The `mgit` command line: thin commands over `mgit.Repo`."""
