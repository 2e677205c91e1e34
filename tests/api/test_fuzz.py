"""No input gives a 5xx: schemathesis over the app's OpenAPI, and hypothesis with hostile values on every path.

The app under fuzz has a control token configured (so the control routes answer 401/422, not 403) and a
search command that does nothing, in case a generated request ever passed the guard.
"""

from __future__ import annotations

import sys

import pytest
import schemathesis
import schemathesis.checks
from api_search_data import MIXED, STUDY, TOKEN
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.app import create_app
from api.settings import ApiSettings

FAST = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def fuzz_app(db_url: str, tmp_path_factory: pytest.TempPathFactory):
    return create_app(ApiSettings(storage_url=db_url, control_token=TOKEN, sse_poll_s=0.05, sse_max_s=2,
                                  search_command=[sys.executable, "-c", "pass"],
                                  search_out_dir=tmp_path_factory.mktemp("fuzz-out")))  # fmt: skip


@pytest.fixture(scope="module")
def api_schema(fuzz_app):
    return schemathesis.openapi.from_asgi("/openapi.json", fuzz_app)


schema = schemathesis.pytest.from_fixture("api_schema")


ALL_CHECKS = schemathesis.checks.CHECKS.get_all()
"""Every check schemathesis has (`st run --checks all`): no 5xx, and every status code, media type, header and
body as the OpenAPI description says; schema-valid requests accepted, schema-violating ones refused."""


@pytest.mark.slow  # every route fuzzed (25 s on 2 cores): the README's second test command runs it
@pytest.mark.timeout(600)
@schema.parametrize()
@FAST
def test_schemathesis_all_checks(case) -> None:
    case.call_and_validate(checks=ALL_CHECKS, headers={"Authorization": f"Bearer {TOKEN}"})


HOSTILE = st.one_of(
    st.text(max_size=40),
    st.sampled_from([STUDY, MIXED, "", " ", "..", "../..", "%00", "%2F", "\x00", "'; DROP TABLE tuner_runs;--", "ü" * 300,
                     "x" * 5000, "-1", "1e309", "NaN", "inf", "9" * 40, "<script>alert(1)</script>", "launch.sh"]),
)  # fmt: skip
NUMBER = st.one_of(st.integers(min_value=-(2**70), max_value=2**70).map(str), st.floats().map(str), HOSTILE)
PATHS = [
    "/api/studies/{s}", "/api/studies/{s}/trials", "/api/studies/{s}/trials/{n}", "/api/studies/{s}/best",
    "/api/studies/{s}/importances", "/api/studies/{s}/artifacts", "/api/studies/{s}/artifacts/{s2}",
    "/api/studies/{s}/environment", "/api/studies/{s}/events", "/api/studies/{s}/plots/history",
    "/api/studies/{s}/plots/importances",
]  # fmt: skip
QUERY_KEYS = ["offset", "limit", "state", "outcome", "sort", "order", "after"]


@pytest.mark.timeout(600)
@FAST
@given(
    path=st.sampled_from(PATHS),
    s=HOSTILE,
    s2=HOSTILE,
    n=NUMBER,
    query=st.dictionaries(st.sampled_from(QUERY_KEYS), NUMBER, max_size=4),
    last_event_id=st.one_of(st.none(), NUMBER.filter(lambda v: v.isascii() and "\n" not in v and "\r" not in v)),
)
def test_hostile_values_on_every_path(fuzz_app, path, s, s2, n, query, last_event_id) -> None:
    from urllib.parse import quote

    url = path.format(s=quote(s, safe=""), s2=quote(s2, safe=""), n=quote(n, safe=""))
    headers = {"Last-Event-ID": last_event_id.strip()} if last_event_id and last_event_id.strip() else {}
    with TestClient(fuzz_app, raise_server_exceptions=False) as c:
        r = c.get(url, params=query, headers=headers)
    assert r.status_code < 500, f"GET {url} {query} -> {r.status_code}: {r.text[:500]}"
    assert r.status_code in (200, 404, 422), (url, query, r.status_code)


@pytest.mark.timeout(300)
@FAST
@given(body=st.dictionaries(st.sampled_from(["study", "budget_s", "space", "target", "n_trials", "seed"]),
                            st.one_of(HOSTILE, st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.none(),
                                      st.booleans()), max_size=6),
       auth=st.sampled_from([None, f"Bearer {TOKEN}x", "Bearer", "Basic abc", "Bearer " + "ü" * 3]))  # fmt: skip
def test_hostile_control_requests_are_refused(fuzz_app, body, auth) -> None:
    headers = {"Authorization": auth.encode("utf-8")} if auth else {}
    with TestClient(fuzz_app, raise_server_exceptions=False) as c:
        r = c.post("/api/searches", json=body, headers=headers)
    assert r.status_code in (401, 403), r.text
