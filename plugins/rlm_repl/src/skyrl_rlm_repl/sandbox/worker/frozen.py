"""Read-only list and dict types for ``context``, so model code cannot mutate it in place.

They are real ``list``/``dict`` subclasses (isinstance, json, slicing and iteration work); copies
(``list(context)``, ``copy.deepcopy(context)``) are ordinary mutable containers.
"""

from __future__ import annotations

from typing import Any, NoReturn


def _refuse(self: Any, *args: Any, **kwargs: Any) -> NoReturn:
    kind = "list" if isinstance(self, list) else "dict"
    raise TypeError(f"context is read-only; make a mutable copy first, e.g. data = {kind}(context) "
                    "or copy.deepcopy(context)")


class FrozenList(list):
    __slots__ = ()
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse

    def __reduce_ex__(self, protocol: int) -> tuple:
        return (list, (list(self),))


class FrozenDict(dict):
    __slots__ = ()
    pop = popitem = clear = update = setdefault = _refuse
    __setitem__ = __delitem__ = __ior__ = _refuse

    def __reduce_ex__(self, protocol: int) -> tuple:
        return (dict, (dict(self),))


def freeze(value: Any) -> Any:
    """Recursively turn lists and dicts (as loaded from JSON) into their read-only twins."""
    if isinstance(value, list):
        return FrozenList(freeze(item) for item in value)
    if isinstance(value, dict):
        return FrozenDict((key, freeze(item)) for key, item in value.items())
    return value
