"""Per-message fast paths, generated once at import, so the codec costs less per message.

The generic codec walked each message's ``_wire`` description per field, per frame, and built
the message through the frozen dataclass's ``__init__`` (an ``object.__setattr__`` per field):
about 6 us to decode an ADD response here against 0.3 us for msgpack to unpack it. For each
message class this module writes, as ``dataclasses`` writes ``__init__``, three plain
functions with the fields unrolled:

- ``from_fields(txn_id, field, ...)``: the message built by setting its slots directly (the frozen
  dataclass's ``__setattr__`` is bypassed, as its own ``__init__`` bypasses it); every field
  given, no defaults, no checks: for values already checked;
- ``to_wire(self)``: ``[tag, txn_id, field, ...]``;
- ``_decode(value, txn_id, tag)``: the checks ``codec`` made -- the array's length, each
  field's exact Python type from ``_wire``, 64-bit range for ints, ``str -> int`` for dicts --
  with the same errors, then ``from_values`` when the class converts fields (enums), else
  ``from_fields``.

Nothing here is protocol: the rules stay in ``messages`` (``_wire``) and ``codec``; a test
checks that every message decodes and re-encodes as the generic path did.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntFlag
from typing import Any

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def _dict_ok(item: dict[Any, Any]) -> bool:
    return all(
        type(k) is str and type(v) is int and INT64_MIN <= v <= INT64_MAX for k, v in item.items()
    )


def compile_message(
    cls: Any, names: tuple[str, ...], error: type[Exception], *, converts: bool
) -> None:
    """Give ``cls`` its generated ``from_fields``, ``to_wire`` and ``_decode`` (module docstring).
    ``names`` are its fields in wire order (``txn_id`` first); ``error`` is
    ``MalformedMessageError``; ``converts``: its ``from_values`` builds it (enums from
    ints), else ``from_fields`` does."""
    slots: dict[str, Any] = {}
    for klass in cls.__mro__:
        for name in getattr(klass, "__slots__", ()):
            slots.setdefault(name, klass.__dict__[name])
    args = ", ".join(names)
    env: dict[str, Any] = {
        "_cls": cls,
        "_object_new": object.__new__,
        "_Error": error,
        "_MIN": INT64_MIN,
        "_MAX": INT64_MAX,
        "_dict_ok": _dict_ok,
        "_tag": cls.tag,
    }
    lines = [f"def from_fields({args}):", "    self = _object_new(_cls)"]
    for index, name in enumerate(names):
        env[f"_set{index}"] = slots[name].__set__
        lines.append(f"    _set{index}(self, {name})")
    lines.append("    return self")
    fields = ", ".join(f"self.{name}" for name in names)
    lines += ["", "def to_wire(self):", f"    return [_tag, {fields}]"]
    wire: tuple[tuple[type, ...], ...] = cls._wire
    values = [f"v{index}" for index in range(len(wire))]
    count = len(wire) + 2
    lines += [
        "",
        "def _decode(value, txn_id, tag):",
        f"    if len(value) != {count}:",
        f"        raise _Error(f'{cls.__name__} takes {len(wire)} fields, got "
        "{len(value) - 2}', txn_id, tag)",
    ]
    if values:
        lines.append(f"    _t, _x, {', '.join(values)} = value")
    for index, allowed in enumerate(wire):
        value, name = values[index], names[index + 1]
        where = f"{cls.__name__}.{name}"
        env[f"_allowed{index}"] = allowed
        if allowed == (int,):
            lines += [
                f"    if type({value}) is not int:",
                f"        raise _Error(f'{where}: {{type({value}).__name__}} not allowed', "
                "txn_id, tag)",
            ]
        else:
            lines += [
                f"    if type({value}) not in _allowed{index}:",
                f"        raise _Error(f'{where}: {{type({value}).__name__}} not allowed', "
                "txn_id, tag)",
            ]
        if int in allowed:
            lines += [
                f"    if type({value}) is int and not _MIN <= {value} <= _MAX:",
                f"        raise _Error('{where} out of range', txn_id, tag)",
            ]
        if dict in allowed:
            lines += [
                f"    if type({value}) is dict and not _dict_ok({value}):",
                f"        raise _Error('{where}: want str -> int', txn_id, tag)",
            ]
    if converts:
        env["_from_values"] = cls.from_values
        lines += [
            "    try:",
            "        return _from_values(value[1:])",
            "    except _Error as exc:",
            "        exc.op = tag",
            "        raise",
        ]
    else:
        lines.append(f"    return from_fields(txn_id{''.join(', ' + v for v in values)})")
    exec("\n".join(lines), env)
    cls.from_fields = staticmethod(env["from_fields"])
    cls.to_wire = env["to_wire"]
    cls._decode = staticmethod(env["_decode"])


def enum_lookup(enum: Any) -> Callable[[int], Any]:
    """``enum(value)`` through a dict for the members (IntEnum's call is ~0.5 us); values that
    are not members go through the enum itself (an IntFlag's combinations, or its error)."""
    if issubclass(enum, IntFlag):  # every combination of its bits, 0 included
        every = 0
        for member in enum:
            every |= int(member)
        members = {value: enum(value) for value in range(every + 1)}
    else:
        members = {int(member): member for member in enum}
    get = members.get

    def lookup(value: int) -> Any:
        found = get(value)
        return found if found is not None else enum(value)

    return lookup


__all__ = ["compile_message", "enum_lookup"]
