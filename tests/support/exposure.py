"""The world both doctor suites seed, and the exposure ``airflow-adrq doctor`` must report on it.

tests/integration/test_doctor.py writes it into the library's tables,
tests/plugin/test_doctor.py through the installed Airflow's models: one
description, so the two suites check the same counts.
"""

from __future__ import annotations

#: Asset -> the DAGs scheduled on it directly. ``off`` is paused, ``old`` inactive:
#: neither is counted. ``lonely`` has no consumer.
CONSUMERS = {
    "a": ["c1", "c2", "off"],
    "b": ["c4"],
    "e": ["c1"],
    "lonely": [],
    "old": ["c1", "c2", "c3", "c4"],
}
PAUSED = {"off"}
INACTIVE = {"old"}
#: Asset -> DAGs scheduled on ``Asset.ref(name=...)`` / ``Asset.ref(uri=...)`` (c2 again).
NAME_REF_CONSUMERS = {"a": ["c3"]}
URI_REF_CONSUMERS = {"a": ["c2"]}
#: Alias -> its consumer DAGs; ``y`` is linked to ``b`` (consumer c4): two rows per event.
ALIAS_CONSUMERS = {"x": ["c1", "c2"], "y": ["c3"], "z": []}
ALIAS_LINKS = [("y", "b")]
#: task_outlet_asset_reference rows (asset, dag, task). ``a`` is produced by two DAGs
#: (races: three consumers); producer.t1 writes a and b (4 rows, no consumer shared);
#: producer.t2 writes a and e (c1 under both: shared).
OUTLETS = [
    ("a", "producer", "t1"),
    ("a", "c4", "t9"),
    ("b", "producer", "t1"),
    ("a", "producer", "t2"),
    ("e", "producer", "t2"),
]
#: Every DAG of the world.
_SCHEDULES = (CONSUMERS, NAME_REF_CONSUMERS, URI_REF_CONSUMERS, ALIAS_CONSUMERS)
DAGS = sorted({"producer"} | {d for table in _SCHEDULES for dag_ids in table.values() for d in dag_ids})

#: The world as the keyword arguments of tests/plugin/adrq_af_scenario.py's ``seed``.
SCENARIO = {
    "assets": list(CONSUMERS),
    "consumers": CONSUMERS,
    "name_ref_consumers": NAME_REF_CONSUMERS,
    "uri_ref_consumers": URI_REF_CONSUMERS,
    "alias_consumers": ALIAS_CONSUMERS,
    "paused": PAUSED,
    "inactive": INACTIVE,
}

#: doctor's ``Exposure`` fields on this world.
EXPOSURE = {
    "assets": 4,
    "assets_with_consumers": 3,
    "fanout_max": 3,
    "fanout_p50": 1,
    "fanout_p99": 3,
    "fanout_over": {64: 0, 1024: 0},
    "multi_consumer_assets": 1,
    "several_producers": 1,
    "several_producer_dags": 1,
    "racing": 1,
    "multi_outlet_tasks": 2,
    "multi_outlet_multirow": 2,
    "multi_outlet_shared": 1,
    "aliases": 3,
    "alias_references": 3,
    "alias_links": 1,
    "alias_multirow": 2,
}


def exposure_fields(exposure: object) -> dict[str, object]:
    """The :data:`EXPOSURE` fields of a report's exposure, to compare with it."""
    return {name: getattr(exposure, name) for name in EXPOSURE}
