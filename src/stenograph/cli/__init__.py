"""The ``stenograph`` command: parse, call one function of the package below it, print.

Nothing imports this package; it imports ``ci``, ``runner`` and ``harness`` (and the
recorder's readers). ``main`` is the click group, ``main_entry`` the console script.
"""

from stenograph.cli.main import main, main_entry, run

__all__ = ["main", "main_entry", "run"]
