"""Value types without ``dataclasses``: ``value_type`` makes a slotted class from its
annotations, with ``__init__``, ``__eq__``, ``__repr__`` and ``__match_args__``.

Owns: ``value_type``, ``field`` and ``replace``.
Runs in: any thread; it runs once per class, as its module is imported.
Guarantees: a class made by ``value_type`` behaves as ``@dataclass(slots=True)`` with the
same options would, for what pool uses: defaults and ``field(default_factory=...)``,
fields left out of comparisons and ``repr`` (``field(compare=False, repr=False)``),
``frozen`` (assigning raises ``AttributeError``; such a value hashes by its compared
fields), ``eq=False`` (identity), ``repr=False`` (the class's own ``__repr__``).
Why not ``dataclasses``: a program's first pool imports about thirty value types, and
``dataclasses`` cost it 13 ms to import (it imports ``inspect``) and half a millisecond
per class, a third of what a short script waited for its first result. Here a class
costs a twentieth of that: only its ``__init__`` is compiled, the rest is shared.
Assumes: no value type inherits from another, and none uses ``ClassVar``,
``__post_init__``, ``super()`` or ``__class__`` in a method (the class is made anew). It
differs from ``dataclasses`` where pool does not care: ``__eq__`` does not first compare the
fields' identities (a NaN field makes a value unequal to itself), ``repr`` has no guard
against recursion, and a mutable default is not refused.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar, dataclass_transform

T = TypeVar("T")

_MISSING: Any = object()


class Field:
    """A field's options, as ``field`` gives them."""

    __slots__ = ("default", "default_factory", "compare", "repr")

    def __init__(self, default: Any, default_factory: Any, compare: bool, repr: bool) -> None:
        self.default, self.default_factory = default, default_factory
        self.compare, self.repr = compare, repr


def field(*, default: Any = _MISSING, default_factory: Callable[[], Any] = _MISSING,
          compare: bool = True, repr: bool = True) -> Any:
    """A field's default (or a callable that makes one for each value), and whether it
    takes part in comparisons and in ``repr``."""
    return Field(default, default_factory, compare, repr)


@dataclass_transform(field_specifiers=(field,))
def value_type(*, frozen: bool = False, eq: bool = True, repr: bool = True
               ) -> Callable[[type[T]], type[T]]:
    """Make the decorated class a value type (see the module docstring)."""
    def make(cls: type[T]) -> type[T]:
        return _made(cls, frozen=frozen, eq=eq, repr=repr)
    return make


def _made(cls: type[Any], *, frozen: bool, eq: bool, repr: bool) -> type[Any]:
    names = list(cls.__dict__.get("__annotations__", {}))
    fields = {}
    for name in names:
        given = cls.__dict__.get(name, _MISSING)
        fields[name] = (given if isinstance(given, Field)
                        else Field(given, _MISSING, True, True))
    namespace = {key: value for key, value in cls.__dict__.items()
                 if key not in fields and key not in ("__dict__", "__weakref__")}
    namespace["__slots__"] = tuple(names)
    namespace["__match_args__"] = tuple(names)
    namespace["__init__"] = _init(cls.__qualname__, fields, frozen)
    compared = tuple(name for name, f in fields.items() if f.compare)
    own = cls.__dict__  # what the class defines itself, a value type keeps
    if eq and "__eq__" not in own:
        namespace["__eq__"] = _eq(compared)
        if "__hash__" not in own:
            namespace["__hash__"] = _hash(compared) if frozen else None
    if repr and "__repr__" not in own:
        namespace["__repr__"] = _repr(tuple(name for name, f in fields.items() if f.repr))
    if frozen:
        namespace["__setattr__"] = _refuse_assignment
        namespace["__delattr__"] = _refuse_assignment
    # Pickling and copying set each slot again, which a frozen value refuses.
    namespace["__getstate__"] = _getstate(tuple(names))
    namespace["__setstate__"] = _setstate(tuple(names))
    made: type[Any] = type(cls.__name__, cls.__bases__, namespace)
    made.__qualname__ = cls.__qualname__
    made.__value_fields__ = tuple(names)
    return made


def _init(qualname: str, fields: dict[str, Field], frozen: bool) -> Any:
    """``__init__``, compiled: it runs for every action and task, so it is as a
    dataclass's, one store per field."""
    scope: dict[str, Any] = {"_MISSING": _MISSING, "_set": object.__setattr__}
    parameters, body = [], []
    for name, f in fields.items():
        value = name
        if f.default_factory is not _MISSING:
            scope[f"_factory_{name}"] = f.default_factory
            parameters.append(f"{name}=_MISSING")
            value = f"_factory_{name}() if {name} is _MISSING else {name}"
        elif f.default is not _MISSING:
            scope[f"_default_{name}"] = f.default
            parameters.append(f"{name}=_default_{name}")
        else:
            parameters.append(name)
        body.append(f"    _set(self, {name!r}, {value})" if frozen
                    else f"    self.{name} = {value}")
    source = (f"def __init__(self, {', '.join(parameters)}):\n" if parameters
              else "def __init__(self):\n") + ("\n".join(body) or "    pass")
    exec(source, scope)
    init = scope["__init__"]
    init.__qualname__ = f"{qualname}.__init__"
    return init


def _eq(compared: tuple[str, ...]) -> Any:
    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in compared)
    return __eq__


def _hash(compared: tuple[str, ...]) -> Any:
    def __hash__(self: Any) -> int:
        return hash(tuple(getattr(self, name) for name in compared))
    return __hash__


def _repr(shown: tuple[str, ...]) -> Any:
    def __repr__(self: Any) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in shown)
        return f"{type(self).__qualname__}({inner})"
    return __repr__


def _getstate(names: tuple[str, ...]) -> Any:
    def __getstate__(self: Any) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in names)
    return __getstate__


def _setstate(names: tuple[str, ...]) -> Any:
    def __setstate__(self: Any, state: tuple[Any, ...]) -> None:
        for name, value in zip(names, state):
            object.__setattr__(self, name, value)
    return __setstate__


def _refuse_assignment(self: Any, name: str, *value: Any) -> None:
    raise AttributeError(f"cannot assign to field {name!r} of a "
                         f"{type(self).__qualname__}: it is frozen")


def replace(value: T, **changes: Any) -> T:
    """A copy of ``value`` (a value type's) with ``changes``."""
    cls = type(value)
    names = cls.__value_fields__  # type: ignore[attr-defined]
    current = {name: getattr(value, name) for name in names}
    return cls(**{**current, **changes})
