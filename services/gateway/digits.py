"""One parsing rule the query and header parsers share."""

from __future__ import annotations


def is_digits(value: str) -> bool:
    """ASCII digits only. `str.isdigit()` alone also takes "¹" (which `int()` refuses: a 500)
    and "٣" (which it reads as 3), and the OpenAPI document's integers are ASCII digits."""
    return value.isascii() and value.isdigit()
