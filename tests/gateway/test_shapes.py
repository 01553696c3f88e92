"""The schema deriver (services/gateway/shape_schema.py) on small shapes, and the API's shapes
against the code that makes or parses what they describe: the names a strict parser accepts,
storage's artifacts, the stream classes, the qualities."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal, get_args

import pytest

from splatq.services.gateway import admin, admin_ops, endpoints, submission
from splatq.services.gateway.shape_schema import (
    Spec,
    absent,
    components,
    field_names,
    schema_of,
    shape,
)
from splatq.services.gateway.shapes import ArtifactUrls, Quality
from splatq.services.gateway.shapes_requests import (
    DeadLetterAction,
    EndpointCreate,
    EndpointUpdate,
    JobParams,
    KeyCreate,
    QuotaSet,
    RunningCaps,
    SubmitJobForm,
    SubmitJobJson,
    TenantCreate,
    TenantUpdate,
)
from splatq.shared.engine.keys import StreamName
from splatq.shared.storage.store import ARTIFACTS


class Color(StrEnum):
    RED = "red"
    BLUE = "blue"


@shape("Point", description="a point")
@dataclass(frozen=True, kw_only=True, slots=True)
class Point:
    x: int
    y: Annotated[float, Spec(minimum=0)]


@dataclass(frozen=True, kw_only=True, slots=True)
class Inner:
    self_: str = absent()


@shape("Box", nullable=True, closed=True, examples=({"name": "b"},))
@dataclass(frozen=True, kw_only=True, slots=True)
class Box:
    name: Annotated[str, Spec(pattern="^b", description="its name")]
    corner: Point
    maybe_corner: Annotated[Point | None, Spec(description="or null")] = absent()
    label: str | None = absent()
    color: Color
    tint: Literal["warm", "cool"] | None = absent()
    kind: Literal["box"]
    tags: list[str]
    extra: dict[str, Any]
    counts: dict[str, int] = absent()
    per_color: dict[Color, Point] = absent()
    inner: Inner
    anything: Any = absent()


def test_a_dataclass_is_an_object_with_its_required_members_in_field_order() -> None:
    assert schema_of(Point) == {
        "type": "object",
        "description": "a point",
        "required": ["x", "y"],
        "properties": {"x": {"type": "integer"}, "y": {"type": "number", "minimum": 0}},
    }


def test_every_type_the_shapes_use_maps_to_its_schema() -> None:
    point = {"$ref": "#/components/schemas/Point"}
    derived = schema_of(Box)
    assert derived["type"] == ["object", "null"]  # nullable
    assert derived["additionalProperties"] is False  # closed
    assert derived["examples"] == [{"name": "b"}]
    assert derived["required"] == ["name", "corner", "color", "kind", "tags", "extra", "inner"]
    assert derived["properties"] == {
        "name": {"type": "string", "pattern": "^b", "description": "its name"},
        "corner": point,  # a named shape inside another: referenced
        "maybe_corner": {"anyOf": [point, {"type": "null"}], "description": "or null"},
        "label": {"type": ["string", "null"]},
        "color": {"type": "string", "enum": ["red", "blue"]},
        "tint": {"enum": ["warm", "cool", None]},
        "kind": {"const": "box"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "extra": {"type": "object"},
        "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
        "per_color": {
            "type": "object",
            "properties": {"red": point, "blue": point},
            "additionalProperties": False,
        },
        "inner": {"type": "object", "properties": {"self": {"type": "string"}}},  # inline
        "anything": {},
    }


def test_names_make_references_and_a_nullable_component_is_referenced_as_is() -> None:
    @dataclass(frozen=True, kw_only=True, slots=True)
    class Holder:
        color: Color
        shade: Color | None
        box: Box | None
        grade: Annotated[Literal["a", "b"], Spec(default="a")]

    names = {Color: "Color", Literal["a", "b"]: "Grade"}
    assert schema_of(Holder, names)["properties"] == {
        "color": {"$ref": "#/components/schemas/Color"},
        "shade": {"anyOf": [{"$ref": "#/components/schemas/Color"}, {"type": "null"}]},
        "box": {"$ref": "#/components/schemas/Box"},
        "grade": {"$ref": "#/components/schemas/Grade", "default": "a"},
    }


def test_components_lists_named_shapes_only() -> None:
    assert list(components([Point, Box])) == ["Point", "Box"]
    with pytest.raises(TypeError, match="not a named shape"):
        components([Inner])


@pytest.mark.parametrize("tp", [int | str, tuple[int, ...], set[str], Literal["a", 1], bytes])
def test_a_type_without_a_schema_is_refused(tp: Any) -> None:
    with pytest.raises(TypeError):
        schema_of(tp)


def test_field_names_are_the_wire_names() -> None:
    assert field_names(Inner) == {"self"}
    assert field_names(Point) == {"x", "y"}


def test_the_parsers_accept_exactly_the_members_the_request_shapes_name() -> None:
    assert field_names(JobParams) == submission.PARAMS
    assert field_names(SubmitJobForm) == submission.FORM_PARTS
    assert field_names(SubmitJobJson) == submission.PARAMS | {"image", "image_url"}
    assert field_names(EndpointCreate) == endpoints.CREATE_FIELDS
    assert field_names(EndpointUpdate) == endpoints.UPDATE_FIELDS
    assert field_names(TenantCreate) == admin.CREATE_FIELDS
    assert field_names(TenantUpdate) == admin.UPDATE_FIELDS
    assert field_names(KeyCreate) == admin.KEY_FIELDS
    assert field_names(QuotaSet) == admin.QUOTA_FIELDS
    assert field_names(DeadLetterAction) == admin_ops.ACTION_FIELDS


def test_the_shapes_name_what_the_code_has() -> None:
    assert field_names(ArtifactUrls) == set(ARTIFACTS)
    assert field_names(RunningCaps) == {s.value for s in StreamName}
    assert submission.QUALITIES == get_args(Quality) == ("preview", "full")
