"""Runs a local Redis Cluster of `redis-server` children: the cluster of tests and benches.

Process and topology management only (create, wait for `cluster_state:ok`, kill a node,
move slots); it never touches splatq's keys except to move them with MIGRATE.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from splatq.shared.redis.client import CLUSTER_SCHEME
from splatq.shared.redis.server import RedisServer, RedisServerError

BUS_PORT_OFFSET = 10_000  # Redis Cluster's node-to-node bus listens on port + 10000
ALL_SLOTS = 16_384


def cluster_port(low: int = 20_000, high: int = 22_700) -> int:
    """A free port whose cluster bus port (+10000) is free too. Both stay below Linux's
    ephemeral range (32768+), so no outgoing connection can take the bus port between this
    check and the node's bind."""
    for _ in range(500):
        port = random.randint(low, high)
        try:
            for p in (port, port + BUS_PORT_OFFSET):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RedisServerError("no free port pair (port, port + 10000) for a cluster node")


@dataclass
class ClusterNode(RedisServer):
    """One cluster-enabled redis-server; `node_timeout_ms` bounds failure detection."""

    node_timeout_ms: int = 2_000
    port: int = field(default_factory=cluster_port)

    def _argv(self) -> list[str]:
        return [
            *super()._argv(),
            "--cluster-enabled", "yes",
            "--cluster-config-file", str((self.data_dir / "nodes.conf").resolve()),
            "--cluster-node-timeout", str(self.node_timeout_ms),
            # A replica may always be promoted, however long its link was down: a test or a
            # bench kills primaries on purpose.
            "--cluster-replica-validity-factor", "0",
        ]  # fmt: skip

    async def start(self, timeout_s: float = 15.0) -> None:
        """Start; a port taken between `cluster_port`'s check and the bind (another test's
        server) is retried on a fresh port pair, twice."""
        restart = self.process is not None  # a restarted node keeps its port and identity
        for attempt in range(3):
            try:
                await super().start(timeout_s)
                return
            except RedisServerError:
                if attempt == 2 or restart:
                    raise
                (self.data_dir / "nodes.conf").unlink(missing_ok=True)
                self.port = cluster_port()

    def client(self) -> Redis:
        """A plain (non-cluster) client of this node alone, for admin commands."""
        return Redis(host="127.0.0.1", port=self.port, decode_responses=True)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass(frozen=True, slots=True)
class NodeView:
    """One line of CLUSTER NODES."""

    id: str
    port: int
    role: str  # master | slave
    primary_id: str  # for a replica, its primary's id; else "-"
    failed: bool
    slots: tuple[tuple[int, int], ...]  # inclusive ranges


def parse_cluster_nodes(text: str) -> list[NodeView]:
    views = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 8:
            continue
        flags = set(parts[2].split(","))
        ranges = []
        for spec in parts[8:]:
            if spec.startswith("["):  # a slot being imported/migrated: "[1-<-id]"
                continue
            lo, _, hi = spec.partition("-")
            ranges.append((int(lo), int(hi or lo)))
        views.append(
            NodeView(
                id=parts[0],
                port=int(parts[1].split("@")[0].rsplit(":", 1)[1]),
                role="master" if "master" in flags else "slave",
                primary_id=parts[3],
                failed="fail" in flags or "fail?" in flags,
                slots=tuple(ranges),
            )
        )
    return views


@dataclass
class LocalCluster:
    """`primaries` primaries with `replicas` replicas each, on 127.0.0.1, created with
    `redis-cli --cluster create` (slots spread evenly, replicas on other primaries' nodes)."""

    data_dir: Path
    primaries: int = 3
    replicas: int = 1
    node_timeout_ms: int = 2_000
    nodes: list[ClusterNode] = field(default_factory=list)

    @property
    def url(self) -> str:
        """`redis+cluster://` with every node as a startup node, so a client started after a
        node died still finds the cluster."""
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes if n.alive)
        return f"{CLUSTER_SCHEME}{hosts}"

    async def start(self, timeout_s: float = 60.0) -> None:
        if shutil.which("redis-cli") is None:
            raise RedisServerError("redis-cli not found on PATH (it creates the cluster)")
        if self.primaries < 3 and self.replicas:
            raise RedisServerError("replicas need 3 or more primaries (redis-cli creates them)")
        count = self.primaries * (1 + self.replicas)
        self.nodes = [
            ClusterNode(self.data_dir / f"node{i}", appendonly=False,
                        node_timeout_ms=self.node_timeout_ms)
            for i in range(count)
        ]  # fmt: skip
        await asyncio.gather(*(n.start() for n in self.nodes))
        if self.primaries < 3:
            await self._small_create()
        else:
            await _run(
                "redis-cli", "--cluster", "create",
                *(f"127.0.0.1:{n.port}" for n in self.nodes),
                "--cluster-replicas", str(self.replicas), "--cluster-yes",
                timeout_s=timeout_s,
            )  # fmt: skip
        await self.wait_ok(timeout_s)

    async def _small_create(self) -> None:
        """`redis-cli --cluster create` wants three primaries: one or two (no replicas) are
        made by hand, slots split evenly, every node meeting the first."""
        n = len(self.nodes)
        for i, node in enumerate(self.nodes):
            client = node.client()
            try:
                lo, hi = i * ALL_SLOTS // n, (i + 1) * ALL_SLOTS // n - 1
                await _cmd(client, "CLUSTER", "ADDSLOTSRANGE", lo, hi)
                if i:
                    await _cmd(client, "CLUSTER", "MEET", "127.0.0.1", self.nodes[0].port)
            finally:
                await client.aclose()

    async def stop(self) -> None:
        await asyncio.gather(*(n.kill() for n in self.nodes))

    async def topology(self) -> list[NodeView]:
        """CLUSTER NODES as a live node sees it."""
        for node in self.nodes:
            if not node.alive:
                continue
            client = node.client()
            try:
                text = await _cmd(client, "CLUSTER", "NODES")
            except RedisError:
                continue
            finally:
                await client.aclose()
            return parse_cluster_nodes(str(text))
        raise RedisServerError("no cluster node answers")

    def node(self, port: int) -> ClusterNode:
        return next(n for n in self.nodes if n.port == port)

    async def primary_of(self, slot: int) -> NodeView:
        for view in await self.topology():
            serves = any(lo <= slot <= hi for lo, hi in view.slots)
            if view.role == "master" and not view.failed and serves:
                return view
        raise RedisServerError(f"no live primary serves slot {slot}")

    async def wait_ok(self, timeout_s: float = 60.0) -> None:
        """Until every live node says `cluster_state:ok` with all slots served by live
        primaries, and every live replica's link to its primary is up."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not await self._ok():
            if loop.time() > deadline:
                raise RedisServerError(f"the cluster is not ok after {timeout_s} s")
            await asyncio.sleep(0.1)

    async def _ok(self) -> bool:
        for node in self.nodes:
            if not node.alive:
                continue
            client = node.client()
            try:
                info = await _cmd(client, "CLUSTER", "INFO")
                replication = await client.info("replication")
            except RedisError:
                return False
            finally:
                await client.aclose()
            text = str(info)
            if "cluster_state:ok" not in text or f"cluster_slots_ok:{ALL_SLOTS}" not in text:
                return False
            if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
                return False
        views = await self.topology()
        live = {n.port for n in self.nodes if n.alive}
        served = sum(
            hi - lo + 1
            for v in views
            if v.role == "master" and v.port in live and not v.failed
            for lo, hi in v.slots
        )
        return served == ALL_SLOTS

    async def migrate_slots(
        self, slots: Sequence[int], to_port: int, batch: int = 20, pause_s: float = 0.0
    ) -> int:
        """Move `slots` to the primary on `to_port` as `redis-cli --cluster reshard` does
        (IMPORTING / MIGRATING, MIGRATE in batches, SETSLOT NODE everywhere), while clients
        keep working (they get ASK, TRYAGAIN and then MOVED). `pause_s` between batches
        keeps a slot in migration longer under load. Returns keys moved."""
        views = {v.port: v for v in await self.topology()}
        target = views[to_port]
        moved = 0
        for slot in slots:
            source = await self.primary_of(slot)
            if source.port == to_port:
                continue
            src, dst = self.node(source.port).client(), self.node(to_port).client()
            try:
                await _cmd(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", source.id)
                await _cmd(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", target.id)
                while True:
                    keys = await _cmd(src, "CLUSTER", "GETKEYSINSLOT", slot, batch)
                    if not keys:
                        break
                    await _cmd(src, "MIGRATE", "127.0.0.1", to_port, "", 0, 10_000, "KEYS", *keys)
                    moved += len(keys)
                    if pause_s:
                        await asyncio.sleep(pause_s)
                # The target first, so the slot is never owned by nobody (what redis-cli does).
                await _cmd(dst, "CLUSTER", "SETSLOT", slot, "NODE", target.id)
                await _cmd(src, "CLUSTER", "SETSLOT", slot, "NODE", target.id)
                for view in views.values():
                    if view.role == "master" and view.port not in {to_port, source.port}:
                        other = self.node(view.port)
                        if other.alive:
                            peer = other.client()
                            with contextlib.suppress(RedisError):
                                await _cmd(peer, "CLUSTER", "SETSLOT", slot, "NODE", target.id)
                            await peer.aclose()
            finally:
                await src.aclose()
                await dst.aclose()
        return moved


async def _cmd(client: Redis, *args: Any) -> Any:
    """One admin command on one node (redis-py leaves execute_command untyped)."""
    return await client.execute_command(*args)  # type: ignore[no-untyped-call]


async def _run(*argv: str, timeout_s: float) -> str:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise RedisServerError(f"{argv[0]} did not finish in {timeout_s} s") from None
    if proc.returncode != 0:
        raise RedisServerError(f"{' '.join(argv[:3])} failed: {out.decode(errors='replace')}")
    return out.decode(errors="replace")
