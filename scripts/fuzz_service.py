"""Schemathesis fuzzes the service's OpenAPI document: no request, however malformed, gets a
server error (each answer is a proper status with a JSON error body).

Outside the test suite (about 20 s on a busy machine):

    pip install -e '.[test,fuzz]' && python -m pytest scripts/fuzz_service.py -q
    FUZZ_EXAMPLES=200 python -m pytest scripts/fuzz_service.py -q      # longer
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # server_models

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e '.[test]')")
schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    from cogency import Agent
    from cogency.server import create_app
    from cogency.server.keys import create_key
    from cogency.storage import SQLiteStore
    from server_models import agent as model

    store = SQLiteStore(tmp_path_factory.mktemp("fuzz") / "fuzz.db")
    key = asyncio.run(create_key(store, "fuzzer"))[1]
    app = create_app(Agent(llm=model(), store=store))
    app.state.fuzz_key = key
    return schemathesis.openapi.from_asgi("/openapi.json", app)


schema = schemathesis.pytest.from_fixture("api")


@schema.parametrize()
@settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "20")), deadline=None,
          suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_server_error(case):
    key = case.operation.schema.app.state.fuzz_key
    response = case.call(headers={"Authorization": f"Bearer {key}"})
    assert response.status_code < 500, (case.method, case.path, response.text)
    if response.status_code >= 400:
        assert response.json()["error"]["message"]
