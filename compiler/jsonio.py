"""JSON round trip of the plan: a generic dataclass <-> plain-data codec driven by type hints.

`to_data` turns dataclasses into dicts (field order kept), enums into their values and tuples
into lists; `from_data(type, data)` rebuilds the typed object from the annotations, so tuples,
enums, optional fields and enum-keyed dicts come back as they were. Unknown keys are errors;
missing keys take the field default (plans written before a field existed still load).
"""

from __future__ import annotations

import json
import types
from dataclasses import MISSING, fields, is_dataclass
from enum import Enum
from functools import cache
from typing import Any, Union, get_args, get_origin, get_type_hints

from compiler.plan import ExecutionPlan


def to_data(obj: Any) -> Any:
    """Plain JSON-able data (dicts, lists, str, int, float, bool, None) of `obj`."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_data(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, tuple | list):
        return [to_data(x) for x in obj]
    if isinstance(obj, dict):
        return {_key_to_str(k): to_data(v) for k, v in obj.items()}
    return obj


def _key_to_str(key: Any) -> str:
    if isinstance(key, Enum):
        return str(key.value)
    if isinstance(key, str | int):
        return str(key)
    raise TypeError(f"dict key {key!r} has no JSON form")


@cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def from_data(tp: Any, data: Any) -> Any:
    """The object of type `tp` that `to_data` turned into `data`."""
    origin = get_origin(tp)
    if tp is Any or tp is object:
        return data
    if origin is Union or origin is types.UnionType:
        return _from_union(get_args(tp), data)
    if is_dataclass(tp):
        return _from_dataclass(tp, data)
    if isinstance(tp, type) and issubclass(tp, Enum):
        return tp(data)
    if origin is tuple:
        args = get_args(tp)
        _expect(data, list, tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_data(args[0], x) for x in data)
        if len(args) != len(data):
            raise ValueError(f"expected {len(args)} items for {tp}, got {len(data)}")
        return tuple(from_data(a, x) for a, x in zip(args, data, strict=True))
    if origin is list:
        _expect(data, list, tp)
        return [from_data(get_args(tp)[0], x) for x in data]
    if origin is dict:
        key_type, value_type = get_args(tp)
        _expect(data, dict, tp)
        return {_key_from_str(key_type, k): from_data(value_type, v) for k, v in data.items()}
    return _from_scalar(tp, data)


def _from_union(args: tuple[Any, ...], data: Any) -> Any:
    if data is None and type(None) in args:
        return None
    errors = []
    for arg in (a for a in args if a is not type(None)):
        try:
            return from_data(arg, data)
        except (TypeError, ValueError, KeyError) as e:
            errors.append(str(e))
    raise ValueError(f"{data!r} matches none of {args}: {'; '.join(errors)}")


def _from_dataclass(cls: type, data: Any) -> Any:
    _expect(data, dict, cls)
    known = {f.name: f for f in fields(cls) if f.init}
    unknown = set(data) - set(known)
    if unknown:
        raise ValueError(f"unknown keys for {cls.__name__}: {sorted(unknown)}")
    hints = _hints(cls)
    kwargs = {}
    for name, f in known.items():
        if name in data:
            kwargs[name] = from_data(hints[name], data[name])
        elif f.default is MISSING and f.default_factory is MISSING:
            raise ValueError(f"missing key {cls.__name__}.{name}")
    return cls(**kwargs)


def _key_from_str(key_type: Any, key: str) -> Any:
    if key_type is int:
        return int(key)
    return from_data(key_type, key)


def _from_scalar(tp: Any, data: Any) -> Any:
    if tp is type(None) or tp is None:
        if data is not None:
            raise TypeError(f"expected null, got {data!r}")
        return None
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            raise TypeError(f"expected a number, got {data!r}")
        return float(data)
    if tp is int and (isinstance(data, bool) or not isinstance(data, int)):
        raise TypeError(f"expected an int, got {data!r}")
    if tp in (str, bool, int):
        _expect(data, tp, tp)
        return data
    raise TypeError(f"no JSON decoding for type {tp!r}")


def _expect(data: Any, kind: type, tp: Any) -> None:
    if not isinstance(data, kind):
        raise TypeError(f"expected {kind.__name__} for {tp}, got {type(data).__name__}")


def plan_to_json(plan: ExecutionPlan, indent: int | None = 1) -> str:
    """The plan as a JSON document."""
    return json.dumps(to_data(plan), indent=indent)


def plan_from_json(text: str) -> ExecutionPlan:
    """The plan a `plan_to_json` document describes (identity round trip)."""
    return from_data(ExecutionPlan, json.loads(text))
