"""The stable codes an image is refused with before decoding, and the refusal itself.

Shared by every pre-decode reader (headers.py, isobmff.py, exif.py); pure, no imports.
"""

from __future__ import annotations

from typing import Literal

HeaderCode = Literal[
    "invalid_image", "image_too_large", "image_too_complex", "unsupported_media_type"
]

INVALID_IMAGE: HeaderCode = "invalid_image"
IMAGE_TOO_LARGE: HeaderCode = "image_too_large"
IMAGE_TOO_COMPLEX: HeaderCode = "image_too_complex"
UNSUPPORTED_MEDIA_TYPE: HeaderCode = "unsupported_media_type"


class HeaderRejected(Exception):
    """The image is refused from its structure alone; `code` is the contract's code."""

    code: HeaderCode
    detail: str

    def __init__(self, code: HeaderCode, detail: str) -> None:
        super().__init__(code, detail)  # args match __init__, so the exception pickles
        self.code = code
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.code}: {self.detail}"
