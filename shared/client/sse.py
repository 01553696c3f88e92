"""A Server-Sent Events parser (the WHATWG rules the gateway's stream needs): fields by line,
an event per blank line, several `data:` lines joined with "\n", comments ignored."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator

import orjson

from splatq.shared.client.types import Event


class SseDecoder:
    """Feed it lines (without their line ending); it returns an `Event` at each blank line
    that ends an event with data."""

    def __init__(self) -> None:
        self._data: list[str] = []
        self._event = ""
        self.last_id = ""

    def feed(self, line: str) -> Event | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None  # a comment (the gateway's keep-alives)
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self.last_id = value
        return None

    def _dispatch(self) -> Event | None:
        data, name = self._data, self._event or "message"
        self._data, self._event = [], ""
        if not data:
            return None
        return Event(self.last_id, name, orjson.loads("\n".join(data)))


async def parse_sse(lines: AsyncIterable[bytes]) -> AsyncIterator[Event]:
    decoder = SseDecoder()
    async for raw in lines:
        event = decoder.feed(raw.decode().rstrip("\r\n"))
        if event is not None:
            yield event
