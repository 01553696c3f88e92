"""Slow clients over real loopback sockets against the gateway on its own runner and a real
Redis: headers sent a byte at a time (or not at all) get 408 request_timeout and the
connection is closed once SPLATQ_HEADER_TIMEOUT_S has passed, a body sent slowly gets 408
once SPLATQ_BODY_TIMEOUT_S has, other clients are served meanwhile, and an idle keep-alive
connection is not cut by the header deadline."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp.test_utils import TestClient

from tests.gateway.conftest import KEY_A, ClientFactory

Client = TestClient[Any, Any]
DEADLINE_S = 1.0
# What "bounded" means here: the deadline plus a generous allowance for a loaded machine,
# far below aiohttp's own 75 s keep-alive wait that slow clients used to get.
SLACK_S = 4.0


@contextlib.asynccontextmanager
async def _trickle(port: int, data: bytes, every_s: float) -> AsyncIterator[asyncio.StreamReader]:
    """A raw connection that sends `data` a byte at a time, one every `every_s`, until the
    server closes it or the block ends."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def send() -> None:
        with contextlib.suppress(ConnectionError):
            for i in range(len(data)):
                writer.write(data[i : i + 1])
                await writer.drain()
                await asyncio.sleep(every_s)

    task = asyncio.create_task(send())
    try:
        yield reader
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        writer.close()


async def _served_promptly(client: Client, times: int = 5) -> None:
    """Other clients get their answers at once while a slow one is connected."""
    loop = asyncio.get_running_loop()
    for _ in range(times):
        started = loop.time()
        resp = await client.get("/healthz")
        assert resp.status == 200
        assert loop.time() - started < DEADLINE_S
        await asyncio.sleep(0.05)


def _status_and_code(answer: bytes) -> tuple[str, str]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].decode()
    return status_line, orjson.loads(body)["code"] if body else ""


async def test_headers_a_byte_at_a_time_get_408_and_the_connection_closed(
    make_client: ClientFactory,
) -> None:
    client = await make_client(header_timeout_s=DEADLINE_S)
    assert client.port is not None
    loop = asyncio.get_running_loop()
    head = b"GET /healthz HTTP/1.1\r\nHost: slow\r\nX-Padding: " + b"a" * 500 + b"\r\n\r\n"
    started = loop.time()
    async with _trickle(client.port, head, every_s=0.05) as reader:
        await _served_promptly(client)
        answer = await asyncio.wait_for(reader.read(), timeout=DEADLINE_S + SLACK_S)  # to EOF
    elapsed = loop.time() - started
    assert DEADLINE_S * 0.9 <= elapsed < DEADLINE_S + SLACK_S
    assert _status_and_code(answer) == ("HTTP/1.1 408 Request Timeout", "request_timeout")
    assert b"\r\nConnection: close\r\n" in answer
    assert b"\r\nServer: splatq\r\n" in answer


async def test_a_connection_that_sends_nothing_is_closed(make_client: ClientFactory) -> None:
    client = await make_client(header_timeout_s=DEADLINE_S)
    assert client.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    try:
        answer = await asyncio.wait_for(reader.read(), timeout=DEADLINE_S + SLACK_S)
    finally:
        writer.close()
    assert _status_and_code(answer)[1] == "request_timeout"


async def test_an_idle_keep_alive_connection_is_not_cut(make_client: ClientFactory) -> None:
    """The deadline runs from a request's first byte: a connection idle between requests for
    longer than it is still served (aiohttp's keep-alive timeout governs idleness)."""
    client = await make_client(header_timeout_s=DEADLINE_S)
    assert client.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    request = b"GET /healthz HTTP/1.1\r\nHost: idle\r\n\r\n"
    try:
        for _ in range(2):
            writer.write(request)
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=SLACK_S)
            assert head.startswith(b"HTTP/1.1 200"), head
            length = int(head.split(b"Content-Length: ", 1)[1].split(b"\r\n", 1)[0])
            await reader.readexactly(length)
            await asyncio.sleep(DEADLINE_S * 2.5)  # idle, deliberately, past the deadline
    finally:
        writer.close()


async def test_a_slow_body_gets_408_within_the_body_deadline(make_client: ClientFactory) -> None:
    client = await make_client(header_timeout_s=DEADLINE_S * 5, body_timeout_s=DEADLINE_S)
    assert client.port is not None
    loop = asyncio.get_running_loop()
    body = orjson.dumps({"image_url": "https://example.com/x.png", "pad": "p" * 2000})
    head = (
        f"POST /v1/jobs HTTP/1.1\r\nHost: slow\r\nAuthorization: Bearer {KEY_A}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    writer.write(head)
    await writer.drain()
    started = loop.time()
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(writer.close)

        async def send_slowly() -> None:
            with contextlib.suppress(ConnectionError):
                for i in range(0, len(body), 10):
                    writer.write(body[i : i + 10])
                    await writer.drain()
                    await asyncio.sleep(0.1)

        sender = asyncio.create_task(send_slowly())
        stack.push_async_callback(_cancel, sender)
        await _served_promptly(client)
        answer_head = await asyncio.wait_for(
            reader.readuntil(b"\r\n\r\n"), timeout=DEADLINE_S + SLACK_S
        )
        elapsed = loop.time() - started
        length = int(answer_head.split(b"Content-Length: ", 1)[1].split(b"\r\n", 1)[0])
        problem = orjson.loads(await reader.readexactly(length))
    assert DEADLINE_S * 0.9 <= elapsed < DEADLINE_S + SLACK_S
    assert answer_head.startswith(b"HTTP/1.1 408 Request Timeout"), answer_head
    assert b"\r\nConnection: close\r\n" in answer_head
    assert problem["code"] == "request_timeout"


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
