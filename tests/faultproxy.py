"""A fault-injection TCP proxy for tests: sits between a client and redis-server on loopback.

It forwards bytes unchanged until told to misbehave: delay traffic, lose the reply of a
command that *did* run, cut every connection, refuse connections for a while (an outage), or
stall (a blackhole: connections stay open, nothing moves) for N ms. It never parses RESP
beyond matching a byte pattern; it must not be used outside tests.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from splatq.shared.redis.server import free_port


@dataclass(slots=True, eq=False)
class _Pair:
    client_writer: asyncio.StreamWriter
    server_writer: asyncio.StreamWriter
    # Set when the next server->client bytes must be swallowed and the connection cut.
    lose_next_reply: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def close(self) -> None:
        for w in (self.client_writer, self.server_writer):
            with contextlib.suppress(Exception):
                w.close()


@dataclass
class FaultProxy:
    """Listens on 127.0.0.1:`port` and forwards to `upstream_port`."""

    upstream_port: int
    port: int = field(default_factory=free_port)
    # Seconds added before forwarding each chunk, in each direction.
    delay_s: float = 0.0
    _server: asyncio.AbstractServer | None = None
    _pairs: set[_Pair] = field(default_factory=set)
    _refusing_until: float = 0.0
    _stalled: asyncio.Event = field(default_factory=asyncio.Event)
    _lose_patterns: list[bytes] = field(default_factory=list)
    lost_replies: int = 0
    # Every chunk a client sent (for tests that count resends).
    sent: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stalled.set()  # set = traffic flows

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    # -- faults ------------------------------------------------------------------------------

    def lose_reply_after(self, pattern: bytes, times: int = 1) -> None:
        """The next `times` commands containing `pattern` run on the server, but their reply
        never reaches the client: the proxy swallows it and cuts that connection."""
        self._lose_patterns.extend([pattern] * times)

    def cut(self) -> None:
        """Close every open connection at once (a network blip; new ones are accepted)."""
        for pair in list(self._pairs):
            pair.close()
        self._pairs.clear()

    def outage(self, duration_s: float) -> None:
        """Cut everything and refuse new connections for `duration_s` (Redis unreachable)."""
        self._refusing_until = asyncio.get_running_loop().time() + duration_s
        self.cut()

    async def stall(self, duration_s: float) -> None:
        """Blackhole: connections stay open but no byte moves for `duration_s`; then the held
        traffic flows again (as TCP retransmission would deliver it)."""
        self._stalled.clear()
        try:
            await asyncio.sleep(duration_s)
        finally:
            self._stalled.set()

    # -- forwarding ------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if asyncio.get_running_loop().time() < self._refusing_until:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        pair = _Pair(writer, up_writer)
        self._pairs.add(pair)
        pair.tasks = [
            asyncio.create_task(self._pump(pair, reader, up_writer, upstream=True)),
            asyncio.create_task(self._pump(pair, up_reader, writer, upstream=False)),
        ]

    async def _pump(
        self,
        pair: _Pair,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        upstream: bool,
    ) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                await self._stalled.wait()
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                if upstream:
                    self.sent.append(data)
                    for pattern in self._lose_patterns:
                        if pattern in data:
                            self._lose_patterns.remove(pattern)
                            pair.lose_next_reply = True
                            break
                elif pair.lose_next_reply:
                    # The command ran; its answer is lost on the way back.
                    self.lost_replies += 1
                    break
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            pair.close()
            self._pairs.discard(pair)
