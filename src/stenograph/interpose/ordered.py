"""The standard library's sets of threads and locks, iterated in insertion order.

An object's default hash is its address. Under the tape addresses repeat only while the
program allocates exactly as it did when recorded, and the hooks cannot keep that
promise once a real call ran (record) or did not (replay). A ``set`` of such objects
then iterates in another order, and where the order is an order of waits the schedule
changes with it: ``ThreadPoolExecutor.shutdown`` joins its workers in ``set`` order (the
shutdown thread of ``asyncio.run`` found a worker finished at record and had to wait
for it at replay: 1 replay in 30 of an OpenAI Agents SDK run), and the interpreter's
exit joins non-daemon threads in the order of ``threading._shutdown_locks``. Both are
replaced, in both modes, by a set that remembers insertion order: the same members, the
same operations, an order the program's own actions decide.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any


class InsertionOrderedSet:
    """The ``set`` operations those two call sites use, over a dict's ordered keys."""

    __slots__ = ("_d",)

    def __init__(self, items: Iterable[Any] = ()) -> None:
        self._d: dict[Any, None] = dict.fromkeys(items)

    def add(self, item: Any) -> None:
        self._d[item] = None

    def discard(self, item: Any) -> None:
        self._d.pop(item, None)

    def remove(self, item: Any) -> None:
        del self._d[item]

    def difference_update(self, *others: Iterable[Any]) -> None:
        for other in others:
            for item in other:
                self._d.pop(item, None)

    def clear(self) -> None:
        self._d.clear()

    def copy(self) -> InsertionOrderedSet:
        return InsertionOrderedSet(self._d)

    def __contains__(self, item: object) -> bool:
        return item in self._d

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._d))

    def __len__(self) -> int:
        return len(self._d)

    def __bool__(self) -> bool:
        return bool(self._d)

    def __repr__(self) -> str:
        return f"{{{', '.join(map(repr, self._d))}}}" if self._d else "set()"


def patch_threading(mod: Any) -> None:
    """``threading._shutdown_locks``: the locks the interpreter's exit waits on."""
    locks = getattr(mod, "_shutdown_locks", None)
    if isinstance(locks, set):
        mod._shutdown_locks = InsertionOrderedSet(locks)


def patch_thread_pool(mod: Any) -> None:
    """``ThreadPoolExecutor._threads``: the workers ``shutdown`` joins."""
    cls = mod.ThreadPoolExecutor
    orig = cls.__init__
    if getattr(orig, "_stenograph", False):
        return

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        if isinstance(getattr(self, "_threads", None), set):
            self._threads = InsertionOrderedSet(self._threads)

    __init__._stenograph = True  # type: ignore[attr-defined]
    cls.__init__ = __init__
