"""The log: codec, segments, group commit, reader, blob store, trajectory files.

This package imports nothing from ``harness`` or ``interpose``.
"""
