"""The Redis Cluster example (k8s/examples/redis-cluster/): KEDA watches every partition's
streams through `redis-cluster-streams`, on the same seed nodes the Secret's
`redis+cluster://` URL gives splatq, and that URL is one splatq can parse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from splatq.shared.engine.keys import STREAMS, KeySchema
from splatq.shared.redis.client import cluster_startup_nodes

EXAMPLE = Path(__file__).resolve().parents[2] / "k8s" / "examples" / "redis-cluster"
PARTITIONS = 6


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLE / name).read_text()) if d]


def _secret_nodes() -> set[str]:
    [secret] = _docs("secret.example.yaml")
    first, others = cluster_startup_nodes(secret["stringData"]["SPLATQ_REDIS_URL"])
    return {first.rpartition("@")[2]} | {f"{h}:{p}" for h, p in others}


def test_every_partition_stream_has_a_lag_and_a_length_trigger() -> None:
    [scaled] = [d for d in _docs("keda-scaledobject.yaml") if d["kind"] == "ScaledObject"]
    triggers = scaled["spec"]["triggers"]
    # plus one Prometheus trigger per stream class on the fair queues' backlog (all partitions)
    waiting = [t for t in triggers if t["type"] == "prometheus"]
    assert {t["name"] for t in waiting} == {f"{s.value}-waiting" for s in STREAMS}
    assert all("splatq_queue_depth" in t["metadata"]["query"] for t in waiting)
    triggers = [t for t in triggers if t["type"] != "prometheus"]
    keys = KeySchema(partitions=PARTITIONS)
    streams = {keys.stream(p, s) for p in range(PARTITIONS) for s in STREAMS}
    lag = {t["metadata"]["stream"] for t in triggers if "lagCount" in t["metadata"]}
    length = {t["metadata"]["stream"] for t in triggers if "streamLength" in t["metadata"]}
    assert lag == streams
    assert length == streams
    assert len(triggers) == 2 * len(streams)
    for t in triggers:
        meta = t["metadata"]
        assert t["type"] == "redis-cluster-streams"
        assert all(isinstance(v, str) for v in meta.values()), meta  # KEDA wants strings
        assert set(meta["addresses"].split(",")) == _secret_nodes()
        assert "databaseIndex" not in meta
        assert t["authenticationRef"]["name"] == "splatq-redis"
        if "lagCount" in meta:
            assert meta["consumerGroup"] == "workers"
