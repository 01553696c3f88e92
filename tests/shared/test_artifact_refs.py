"""How a record keeps its artifacts' URLs (shared/engine/artifact_refs.py), and how a history
item keeps its extra (shared/engine/history.py's tokens): compact, and read back exactly."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio import Redis

from splatq.shared.engine import artifact_refs, history
from splatq.shared.engine.events import stage_fields
from splatq.shared.engine.scripts import LuaHelpers, _preamble
from splatq.shared.engine.states import lua_transition_table

JOB = "job_00006H4Q0K8S11F5E9J1W58SRFTKG"
BASE = "https://splatq.example.com"


def _urls(base: str, *names: str) -> dict[str, str]:
    return {n: f"{base}/v1/jobs/{JOB}/artifacts/{n}" for n in names}


def test_the_gateways_own_urls_are_kept_as_a_base_and_names() -> None:
    artifacts = _urls(BASE, "gaussian_ply", "splat", "spz", "rendered_preview")
    fields = artifact_refs.record_fields(JOB, artifacts)
    assert fields == {
        "artifacts": "",
        "artifact_base": BASE,
        "artifact_names": "gaussian_ply,splat,spz,rendered_preview",
    }
    assert artifact_refs.from_record(fields, JOB) == artifacts
    assert sum(map(len, fields.values())) < len(orjson.dumps(artifacts)) // 5


@pytest.mark.parametrize(
    "artifacts",
    [
        {},  # nothing to name
        {"ply": "s3://bucket/x.ply"},  # a handler's own URL
        {**_urls(BASE, "a"), **_urls("http://other", "b")},  # two bases
        _urls(BASE, "a,b"),  # a name a comma would split
        {"a": f"{BASE}/v1/jobs/{JOB}/artifacts/b"},  # a URL not named after its key
        {"a": f"{BASE}/v1/jobs/job_other/artifacts/a"},  # another job's artifact
        {"a": f"{BASE}/v1/jobs/{JOB}/artifacts/a?variant=quick"},  # a query
    ],
)
def test_any_other_outcome_is_kept_whole(artifacts: dict[str, str]) -> None:
    fields = artifact_refs.record_fields(JOB, artifacts)
    assert fields["artifact_names"] == ""
    assert orjson.loads(fields["artifacts"]) == artifacts
    assert artifact_refs.from_record(fields, JOB) == artifacts


def test_each_form_clears_the_other_so_a_job_committed_again_shows_its_latest() -> None:
    record = artifact_refs.record_fields(JOB, _urls(BASE, "a", "b"))
    record.update(artifact_refs.record_fields(JOB, {"c": "s3://bucket/c"}))
    assert artifact_refs.from_record(record, JOB) == {"c": "s3://bucket/c"}
    record.update(artifact_refs.record_fields(JOB, _urls(BASE, "d")))
    assert artifact_refs.from_record(record, JOB) == _urls(BASE, "d")


def test_a_record_from_before_and_a_job_not_completed_read_as_before() -> None:
    old = {"artifacts": orjson.dumps(_urls(BASE, "a")).decode()}
    assert artifact_refs.from_record(old, JOB) == _urls(BASE, "a")
    assert artifact_refs.from_record({}, JOB) is None
    with pytest.raises(ValueError, match="JSON object"):
        artifact_refs.from_record({"artifacts": "[1]"}, JOB)


@given(
    st.floats(0, 1, allow_nan=False),
    st.sampled_from(["ingest", "reconstruct", "publish", 'we"ird\x01stage']),
    st.sampled_from(["running", "succeeded", "failed", "retrying"]),
    st.sampled_from(["", "export", "render"]),
)
def test_history_tokens_give_back_every_progress_extra_exactly(
    progress: float, stage: str, status: str, next_stage: str
) -> None:
    extra = stage_fields(progress, stage, status, next_stage)
    # What emit stores, done here with the same table in the same order (Python's replace
    # for Lua's gsub over an escaped pattern: the same literal).
    stored = extra
    for char, text in history.PROGRESS_TOKENS:
        stored = stored.replace(text, char)
    assert history.expand(stored, JOB) == extra


async def test_the_generated_lua_table_encodes_as_expand_decodes(redis: Redis) -> None:
    """The generated table and the helpers' replace_plain, run by Redis's Lua: what they
    store for each kind of progress extra is shorter and expands back exactly."""
    extras = [
        stage_fields(0.4, "export", "succeeded", "render"),
        stage_fields(0.2, "reconstruct", "running") + ',"attempt":3',
        stage_fields(0.6, "render", "retrying"),
        '"progress":0.5,"stage":"100%.[*]?\'"',  # pattern characters and a quote in a value
        '"progress":0.1,"stage":"a","stage":"b"',  # a member twice
    ]
    body = (
        "local out = {}\n"
        "for i, extra in ipairs(ARGV) do\n"
        "  for j = 1, #HISTORY_TOKENS do\n"
        "    extra = replace_plain(extra, HISTORY_TOKENS[j][1], HISTORY_TOKENS[j][2])\n"
        "  end\n"
        "  out[i] = extra\n"
        "end\n"
        "return out\n"
    )
    helpers = LuaHelpers(lua_transition_table() + history.lua_constants() + _preamble())
    script = helpers.include_for(body)
    stored = await redis.eval(script, 0, *extras)  # type: ignore[misc]
    for extra, item in zip(extras, stored, strict=True):
        assert history.expand(item, JOB) == extra
    assert len(stored[0]) < len(extras[0]) // 2
