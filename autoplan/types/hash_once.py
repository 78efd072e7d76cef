"""A frozen dataclass whose hash is computed once: the search's memos key on a few such values
(a plan's routing model, a context's expert placement and process groups) hundreds of thousands
of times per plan (issue 38), and a dataclass's own ``__hash__`` re-hashes every field each time.

:func:`hash_once` keeps the dataclass's own hash and equality: it calls the generated
``__hash__`` the first time and stores the value on the instance (frozen, so its fields never
change). The stored value is left out of pickles and copies, since a ``str`` field hashes
differently in another process.
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T", bound=type)
_SLOT = "_hash_once"


def hash_once(cls: T) -> T:
    """Decorate a frozen dataclass (outside ``@dataclass``) so its hash is computed once per instance."""
    generated = cls.__hash__
    if not cls.__dataclass_params__.frozen or generated is None:
        raise TypeError(f"hash_once needs a frozen, hashable dataclass, not {cls.__name__}")

    def __hash__(self) -> int:
        value = self.__dict__.get(_SLOT)
        if value is None:
            value = generated(self)
            object.__setattr__(self, _SLOT, value)
        return value

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != _SLOT}

    cls.__hash__ = __hash__
    cls.__getstate__ = __getstate__
    return cls
