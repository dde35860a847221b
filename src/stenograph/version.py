"""The package's version, in a module that imports nothing, so the log's writer (the bottom
layer) can name it in every file header without importing the package above it."""

__version__ = "0.1.0"
