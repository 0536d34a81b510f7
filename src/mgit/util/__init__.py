"""Helpers with no knowledge of models: atomic files, locks, SQLite, thread pools, fault points.

Every other package may import these; they import nothing of MGit but `mgit.errors`.
"""
