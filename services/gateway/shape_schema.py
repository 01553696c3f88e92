"""JSON Schema (OpenAPI 3.1) derived from typed frozen dataclasses: the API's shapes are
written once (services/gateway/shapes*.py) and the document's schemas come from them.

Pure; no I/O, no gateway imports. The mapping:

- `str`, `int`, `float`, `bool` -> `string`, `integer`, `number`, `boolean`; `Any` -> `{}`
- `Literal["a", "b"]` -> a string `enum`; a one-value `Literal` -> `const`
- `X | None` -> `["x", "null"]` for a plain type, `anyOf: [X, null]` for a reference, and
  `enum: [..., null]` for a `Literal` (a nullable component is referenced as is)
- `list[X]` -> `array` of X; `dict[str, Any]` -> `object`; `dict[str, X]` -> an object
  whose values are X; `dict[E, X]` with E an Enum (or a `Literal`) -> one optional property
  of X per member, nothing else
- a dataclass -> an `object`: every field is a property, and a field without a default is
  `required` (in field order; `absent()` is the default of one that is not); a field name's
  trailing `_` is dropped (`self_` -> `self`).
  One decorated `@shape("Name")` is referenced (`#/components/schemas/Name`) where it
  appears inside another shape; `components()` lists them.
- `Annotated[X, Spec(minimum=0, description="...")]` adds keywords to X's schema.
- a type `names` maps to a name (an Enum, a `Literal` alias) is that component's reference;
  another Enum is a string `enum` of its values.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")
Schema = dict[str, Any]
_JSON_TYPES: tuple[tuple[type, str], ...] = (
    (bool, "boolean"),  # before int: a bool is an int
    (str, "string"),
    (int, "integer"),
    (float, "number"),
)


class Spec:
    """Keywords merged into the schema of the type it annotates:
    `Annotated[int, Spec(minimum=0, description="...")]`."""

    __slots__ = ("keywords",)

    def __init__(self, **keywords: Any) -> None:
        self.keywords: Mapping[str, Any] = keywords

    def __repr__(self) -> str:
        return f"Spec({self.keywords!r})"


@dataclass(frozen=True, slots=True)
class ShapeInfo:
    """What `@shape` records on a class besides its fields."""

    name: str | None = None
    description: str | None = None
    closed: bool = False  # additionalProperties: false
    nullable: bool = False  # the component itself admits null
    examples: tuple[Any, ...] = ()
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def shape(
    name: str | None = None,
    *,
    description: str | None = None,
    closed: bool = False,
    nullable: bool = False,
    examples: tuple[Any, ...] = (),
    extra: Mapping[str, Any] | None = None,
) -> Callable[[type[T]], type[T]]:
    """Mark a dataclass as a shape: `name` makes it a component (referenced by name where
    another shape uses it); `closed` forbids other members; `extra` adds schema keywords."""

    def mark(cls: type[T]) -> type[T]:
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"{cls.__name__} is not a dataclass")
        info = ShapeInfo(name, description, closed, nullable, examples, dict(extra or {}))
        setattr(cls, "__shape__", info)  # noqa: B010 (a class attribute, not a field)
        return cls

    return mark


def shape_info(cls: object) -> ShapeInfo:
    info = getattr(cls, "__shape__", None)
    return info if isinstance(info, ShapeInfo) else ShapeInfo()


def absent() -> Any:
    """The default of a member that may be missing from the object (so not `required`):
    `resets_at: Time = absent()`."""
    return dataclasses.field(default=None)


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def wire_name(field_name: str) -> str:
    """The member's name in JSON: a trailing `_` (a Python keyword or builtin) dropped."""
    return field_name[:-1] if field_name.endswith("_") else field_name


def field_names(cls: type) -> frozenset[str]:
    """The members a shape names (what a strict parser accepts)."""
    return frozenset(wire_name(f.name) for f in dataclasses.fields(cls))


def schema_of(tp: Any, names: Mapping[Any, str] | None = None) -> Schema:
    """The schema of `tp`; a dataclass is described in full (not referenced) at the top."""
    names = names or {}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _object(tp, names)
    return _schema(tp, names)


def components(shapes: list[type], names: Mapping[Any, str] | None = None) -> dict[str, Schema]:
    """`{name: schema}` for named shapes, in the order given."""
    out: dict[str, Schema] = {}
    for cls in shapes:
        name = shape_info(cls).name
        if name is None:
            raise TypeError(f"{cls.__name__} is not a named shape")
        out[name] = schema_of(cls, names)
    return out


def _object(cls: type, names: Mapping[Any, str]) -> Schema:
    info = shape_info(cls)
    hints = get_type_hints(cls, include_extras=True)
    properties: Schema = {}
    required: list[str] = []
    for f in dataclasses.fields(cls):
        name = wire_name(f.name)
        properties[name] = _schema(hints[f.name], names)
        no_default = f.default is dataclasses.MISSING
        if no_default and f.default_factory is dataclasses.MISSING:
            required.append(name)
    out: Schema = {"type": ["object", "null"] if info.nullable else "object"}
    if info.description is not None:
        out["description"] = info.description
    if required:
        out["required"] = required
    out["properties"] = properties
    if info.closed:
        out["additionalProperties"] = False
    if info.examples:
        out["examples"] = list(info.examples)
    out.update(info.extra)
    return out


def _named(tp: Any, names: Mapping[Any, str]) -> str | None:
    try:
        return names.get(tp)
    except TypeError:  # an unhashable annotation: not a named one
        return None


def _schema(tp: Any, names: Mapping[Any, str]) -> Schema:
    name = _named(tp, names)
    if name is not None:
        return ref(name)
    origin = get_origin(tp)
    return _plain(tp, names) if origin is None else _generic(tp, origin, names)


def _plain(tp: Any, names: Mapping[Any, str]) -> Schema:
    """A type without arguments: a dataclass, an Enum, a JSON scalar, `Any`."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        info = shape_info(tp)
        return ref(info.name) if info.name is not None else _object(tp, names)
    if isinstance(tp, type) and issubclass(tp, Enum):  # an enum with no component of its own
        return _literal(tuple(m.value for m in tp))
    if tp is Any:
        return {}
    for python_type, json_type in _JSON_TYPES:
        if tp is python_type:
            return {"type": json_type}
    raise TypeError(f"no schema for {tp!r}")


def _generic(tp: Any, origin: Any, names: Mapping[Any, str]) -> Schema:
    """`Annotated`, `Literal`, `X | None`, `list[X]`, `dict[K, V]`."""
    args = get_args(tp)
    if origin is Annotated:
        out = _schema(args[0], names)
        for item in args[1:]:
            if isinstance(item, Spec):
                out = {**out, **item.keywords}
        return out
    if origin is Literal:
        return _literal(args)
    if origin is Union or origin is types.UnionType:
        return _optional(tp, names)
    if origin is list:
        return {"type": "array", "items": _schema(args[0], names)}
    if origin is dict:
        return _mapping(tp, names)
    raise TypeError(f"no schema for {tp!r}")


def _literal(values: tuple[Any, ...]) -> Schema:
    if len(values) == 1:
        return {"const": values[0]}
    kinds = {_json_type(v) for v in values}
    if len(kinds) != 1:
        raise TypeError(f"a Literal of mixed types: {values!r}")
    return {"type": kinds.pop(), "enum": list(values)}


def _json_type(value: object) -> str:
    for python_type, json_type in _JSON_TYPES:
        if isinstance(value, python_type):
            return json_type
    raise TypeError(f"no JSON type for {value!r}")


def _optional(tp: Any, names: Mapping[Any, str]) -> Schema:
    """`X | None`: the one union the shapes use."""
    args = get_args(tp)
    present = [a for a in args if a is not type(None)]
    if len(present) != 1 or len(args) != 2:
        raise TypeError(f"only `X | None` unions have a schema, not {tp!r}")
    (inner,) = present
    if isinstance(inner, type) and dataclasses.is_dataclass(inner) and shape_info(inner).nullable:
        return _schema(inner, names)  # the component itself admits null
    out = _schema(inner, names)
    if "$ref" in out:
        return {"anyOf": [out, {"type": "null"}]}
    if "enum" in out:
        rest = {k: v for k, v in out.items() if k not in {"type", "enum"}}
        return {"enum": [*out["enum"], None], **rest}
    if isinstance(out.get("type"), str):
        return {**out, "type": [out["type"], "null"]}
    raise TypeError(f"no nullable schema for {tp!r}")


def _mapping(tp: Any, names: Mapping[Any, str]) -> Schema:
    key, value = get_args(tp)
    if key is str:
        return {"type": "object"} if value is Any else {
            "type": "object", "additionalProperties": _schema(value, names),
        }  # fmt: skip
    if isinstance(key, type) and issubclass(key, Enum):
        members = [m.value for m in key]
    elif get_origin(key) is Literal:
        members = list(get_args(key))
    else:
        raise TypeError(f"no schema for a mapping keyed by {key!r}")
    item = _schema(value, names)
    return {
        "type": "object",
        "properties": {str(m): item for m in members},
        "additionalProperties": False,
    }
