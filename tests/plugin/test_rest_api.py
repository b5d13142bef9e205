"""``POST /api/v2/assets/events`` through Airflow's own REST app: the response is what is stored.

Airflow's route (``airflow.api_fastapi.core_api.routes.public.assets.create_asset_event``)
calls ``asset_manager.register_asset_change(...)`` and builds its response
(``AssetEventResponse.model_validate(event)``) before the request's session
commits. The plug-in stamps an event's ``timestamp`` (and its queue rows'
``created_at``) when it queues it, so for this route it queues at once
instead of at COMMIT; otherwise the response would carry an earlier
timestamp than the one stored.

Each backend's database (migrated by ``airflow db migrate``, conftest.py) gets
one subprocess, because Airflow configures its engine and its asset manager at
import: there Airflow's FastAPI app is built by ``airflow.api_fastapi.app.create_app``
with ``[core] asset_manager_class`` set to the plug-in and the simple auth
manager letting everyone in as admin (``[core] simple_auth_manager_all_admins``;
the client takes its token from ``GET /auth/token``), and Starlette's
``TestClient`` sends the requests in-process. One asset per
manager, so the requests do not share queue rows:

* ``adrq``: the manager Airflow built from ``[core] asset_manager_class`` (the plug-in);
* ``stock``: Airflow's own ``AssetManager`` (control: stock stores what it returns);
* ``no_flush``: a subclass of the plug-in that strips what marks the call as the
  REST route's (``source_is_api``, ``timestamp=``), so it queues at COMMIT as for
  any other caller (negative control: its response's timestamp is not the stored one).

The route reads the module-level ``asset_manager`` it imported; the script puts
the control managers there for their requests, as ``[core] asset_manager_class``
would have at import. If the installed Airflow cannot build the app (e.g. a
missing module on an ``apache-airflow-core``-only install), the tests skip and
the reason names what is missing; under CI they fail instead.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
import subprocess
import sys
import textwrap

import pytest
import sqlalchemy as sa
from airflow.models.asset import AssetDagRunQueue, AssetEvent
from sqlalchemy.orm import Session

from tests.plugin import adrq_af_scenario as scenario
from tests.plugin.adrq_af_scenario import LINE
from tests.support.ci import skip_or_fail

PLUGIN = "airflow_adrq.airflow.AdrqAssetManager"
MANAGERS = ("adrq", "stock", "no_flush")
#: Consumers of every posted asset: two direct, one by name; ``off`` is paused (not queued).
CONSUMERS = ["c1", "c2", "off"]
NAME_REF_CONSUMERS = ["c3"]
QUEUED = ["c1", "c2", "c3"]

CLIENT = textwrap.dedent(
    """
    import json
    import sys

    # The configured asset manager (the plug-in) is resolved here, outside the
    # skip guard below: a plug-in that fails to load fails the test.
    from airflow.assets.manager import AssetManager

    from airflow_adrq.airflow import AdrqAssetManager


    def skip(what, exc):
        print("ADRQ-SKIP " + json.dumps(f"{what}: {type(exc).__name__}: {exc}"), flush=True)
        sys.exit(0)


    try:
        from fastapi.testclient import TestClient
    except ImportError as exc:
        skip("Starlette's TestClient (fastapi.testclient, needs httpx) is not importable", exc)
    try:
        import airflow.api_fastapi.core_api.routes.public.assets as route
        from airflow.api_fastapi.app import create_app
    except ImportError as exc:
        skip("Airflow's REST app (airflow.api_fastapi) is not importable", exc)


    class NoFlushAdrqAssetManager(AdrqAssetManager):
        # The plug-in as for any other caller: queued (and stamped) at COMMIT.
        @classmethod
        def register_asset_change(cls, **kwargs):
            kwargs.pop("source_is_api", None)
            kwargs.pop("timestamp", None)
            return super().register_asset_change(**kwargs)


    configured = route.asset_manager
    managers = {"adrq": configured, "stock": AssetManager(), "no_flush": NoFlushAdrqAssetManager()}
    try:
        app = create_app("core")
    except ImportError as exc:
        skip("Airflow's REST app cannot be built (create_app('core'))", exc)

    out = {"configured": type(configured).__module__ + "." + type(configured).__qualname__, "posts": {}}
    with TestClient(app) as client:
        # The all-admins token, as a client of such a deployment gets it (3.3+ also adds one
        # to every request itself; 3.1 and 3.2 do not).
        token = client.get("/auth/token")
        if token.status_code not in (200, 201):
            raise SystemExit(f"GET /auth/token: {token.status_code} {token.text}")
        headers = {"Authorization": "Bearer " + token.json()["access_token"]}
        for label, asset_id in json.loads(sys.argv[1]).items():
            route.asset_manager = managers[label]
            response = client.post(
                "/api/v2/assets/events",
                json={"asset_id": asset_id, "extra": {"via": label}},
                headers=headers,
            )
            out["posts"][label] = {"status": response.status_code, "body": response.json()}
    route.asset_manager = configured
    print("ADRQ-RESULT " + json.dumps(out), flush=True)
    """
)


def _asset(label: str) -> str:
    return f"rest_{label}"


def _post(airflow_db, asset_ids: dict[str, int], home) -> dict:
    env = airflow_db.airflow_env()
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__ASSET_MANAGER_CLASS=PLUGIN,
        AIRFLOW__CORE__AUTH_MANAGER="airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True",
        AIRFLOW__API_AUTH__JWT_SECRET=secrets.token_hex(64),
    )
    result = subprocess.run(
        [sys.executable, "-c", CLIENT, json.dumps(asset_ids)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = result.stdout.splitlines()
    skips = [line.removeprefix("ADRQ-SKIP ") for line in lines if line.startswith("ADRQ-SKIP ")]
    if skips:
        import airflow

        # apache-airflow-core ships the REST app and its test client's httpx: CI has them.
        skip_or_fail(f"Airflow {airflow.__version__}: {json.loads(skips[-1])}")
    results = [line.removeprefix("ADRQ-RESULT ") for line in lines if line.startswith("ADRQ-RESULT ")]
    assert result.returncode == 0 and results, (
        f"the REST client failed (exit {result.returncode}):\n"
        f"{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    )
    return json.loads(results[-1])


@pytest.fixture(scope="module")
def posted(airflow_db, tmp_path_factory):
    """One POST per manager on this backend's migrated database; what came back and what is stored."""
    engine = airflow_db.engine()
    try:
        with Session(engine) as session:
            seeded = scenario.seed(
                session,
                assets=[_asset(label) for label in MANAGERS],
                consumers={_asset(label): CONSUMERS for label in MANAGERS},
                name_ref_consumers={_asset(label): NAME_REF_CONSUMERS for label in MANAGERS},
                paused={"off"},
            )
        asset_ids = {label: seeded.asset_ids[_asset(label)] for label in MANAGERS}
        result = _post(airflow_db, asset_ids, tmp_path_factory.mktemp("rest-home"))
        with Session(engine) as session:
            events = session.execute(
                sa.select(AssetEvent.id, AssetEvent.asset_id, AssetEvent.timestamp, AssetEvent.extra)
            ).all()
            queue_columns = [AssetDagRunQueue.asset_id, AssetDagRunQueue.target_dag_id]
            queue_columns.append(AssetDagRunQueue.created_at)
            if LINE.shape.event_keyed:
                queue_columns.append(AssetDagRunQueue.asset_event_id)
            rows = session.execute(sa.select(*queue_columns)).all()
        yield Posted(result, asset_ids, events, rows)
    finally:
        with engine.begin() as conn:
            scenario.empty(conn)
        engine.dispose()


class Posted:
    """The responses (by manager label) and the rows stored for them."""

    def __init__(self, result, asset_ids, events, rows):
        self.configured = result["configured"]
        self.posts = result["posts"]
        self.asset_ids = asset_ids
        self.events = events
        self.rows = rows

    def response(self, label):
        post = self.posts[label]
        assert post["status"] == 200, post
        return post["body"]

    def stored_event(self, label):
        """The one asset_event row of ``label``'s asset."""
        (event,) = [e for e in self.events if e.asset_id == self.asset_ids[label]]
        return event

    def queue_rows(self, label):
        return sorted((r for r in self.rows if r.asset_id == self.asset_ids[label]), key=lambda r: r[1])


def _timestamp(body) -> dt.datetime:
    stamp = dt.datetime.fromisoformat(body["timestamp"].replace("Z", "+00:00"))
    assert stamp.tzinfo is not None, body["timestamp"]
    return stamp


def test_the_route_uses_the_configured_plugin(posted):
    # [core] asset_manager_class reached the route's module-level asset_manager.
    assert posted.configured.rsplit(".", 1)[-1] == "AdrqAssetManager", posted.configured
    assert posted.configured.startswith("airflow_adrq.airflow"), posted.configured


@pytest.mark.parametrize("label", ["adrq", "stock"])
def test_response_timestamp_is_the_stored_one(posted, label):
    body = posted.response(label)
    event = posted.stored_event(label)
    assert (body["id"], body["asset_id"], body["extra"]) == (event.id, event.asset_id, event.extra)
    assert event.extra["via"] == label
    # Exactly, to the microsecond.
    assert _timestamp(body) == event.timestamp, (body["timestamp"], event.timestamp)

    rows = posted.queue_rows(label)
    assert [r.target_dag_id for r in rows] == QUEUED
    if LINE.shape.event_keyed:
        assert {r.asset_event_id for r in rows} == {event.id}
    if label == "adrq":
        # Stamped together: the rows' created_at is the event's timestamp.
        assert {r.created_at for r in rows} == {event.timestamp}
    else:
        # Stock stamps each row when it inserts it, after the event.
        assert all(r.created_at >= event.timestamp for r in rows)


def test_negative_control_queued_at_commit_returns_an_earlier_timestamp(posted):
    """The plug-in without the REST route's flush: stored and queued at COMMIT, after the response."""
    body = posted.response("no_flush")
    event = posted.stored_event("no_flush")
    assert body["id"] == event.id
    rows = posted.queue_rows("no_flush")
    assert [r.target_dag_id for r in rows] == QUEUED
    assert {r.created_at for r in rows} == {event.timestamp}
    # The response was built before COMMIT restamped the event.
    assert _timestamp(body) < event.timestamp, (body["timestamp"], event.timestamp)
