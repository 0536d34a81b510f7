"""Porcelain: the Hugging Face cache, imported into a repository and exported from it."""
