"""The Redis Cluster example (k8s/examples/redis-cluster/): KEDA watches every partition's
entry streams (the CPU worker's ingest stage) through `redis-cluster-streams`, on the same
seed nodes the Secret's `redis+cluster://` URL gives splatq, and that URL is one splatq can
parse; it replaces k8s/autoscaling's CPU worker ScaledObject with the same stage triggers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from splatq.shared.engine.keys import STREAMS, KeySchema, StreamName
from splatq.shared.redis.client import cluster_startup_nodes

EXAMPLE = Path(__file__).resolve().parents[2] / "k8s" / "examples" / "redis-cluster"
AUTOSCALING = EXAMPLE.parents[1] / "autoscaling" / "keda-scaledobject.yaml"
PARTITIONS = 6


def _docs(name: str) -> list[dict[str, Any]]:
    return _docs_at(EXAMPLE / name)


def _docs_at(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _secret_nodes() -> set[str]:
    [secret] = _docs("secret.example.yaml")
    first, others = cluster_startup_nodes(secret["stringData"]["SPLATQ_REDIS_URL"])
    return {first.rpartition("@")[2]} | {f"{h}:{p}" for h, p in others}


@pytest.mark.parametrize("cls", STREAMS, ids=str)
def test_every_partition_stream_has_a_lag_and_a_length_trigger(cls: StreamName) -> None:
    """Each per-class CPU worker's ScaledObject: the stage triggers of k8s/autoscaling's
    ScaledObject of the same name, plus a lag and a length trigger per partition on its own
    class's entry stream (the other class's pods do not scale on it)."""
    docs = _docs("keda-scaledobject.yaml")
    name = f"splatq-worker-cpu-{cls.value}"
    [scaled] = [d for d in docs if d["kind"] == "ScaledObject" and d["metadata"]["name"] == name]
    assert len([d for d in docs if d["kind"] == "ScaledObject"]) == len(STREAMS)
    [auth] = [d for d in docs if d["kind"] == "TriggerAuthentication"]
    # the CPU worker's ScaledObject of k8s/autoscaling, by name, target and stage triggers
    [cpu] = [d for d in _docs_at(AUTOSCALING) if d["metadata"]["name"] == name]
    assert scaled["spec"]["scaleTargetRef"] == cpu["spec"]["scaleTargetRef"]
    triggers = scaled["spec"]["triggers"]
    waiting = [t for t in triggers if t["type"] == "prometheus"]
    assert waiting == [t for t in cpu["spec"]["triggers"] if t["type"] == "prometheus"]
    triggers = [t for t in triggers if t["type"] != "prometheus"]
    keys = KeySchema(partitions=PARTITIONS)
    streams = {keys.stream(p, cls) for p in range(PARTITIONS)}
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
        assert t["authenticationRef"]["name"] == auth["metadata"]["name"]
        if "lagCount" in meta:
            assert meta["consumerGroup"] == "workers"
    # the password KEDA sends comes from the example Secret's bare-password key
    [secret] = _docs("secret.example.yaml")
    for ref in auth["spec"]["secretTargetRef"]:
        assert ref["name"] == secret["metadata"]["name"]
        assert ref["key"] in secret["stringData"]
