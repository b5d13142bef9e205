"""Which pairs (event, consumer DAG) a run consumed, late or never: pure classification."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# --- classification (pure) ----------------------------------------------------------


@dataclass(frozen=True)
class PairClasses:
    """Every (event, consumer DAG) pair and every event of a cell, each in exactly one class."""

    pairs: int
    consumed_pairs: int
    late_pairs: int
    unconsumed_pairs: int
    #: Pairs consumed by more than one run of the DAG (counted once above).
    duplicate_pairs: int
    events: int
    #: Every pair consumed before the sentinel.
    consumed: int
    #: No pair unconsumed, at least one only by the sentinel's runs.
    late: int
    #: At least one consumer DAG's runs never consumed it.
    unconsumed: int
    #: Consumed by no run of any consumer DAG.
    in_no_run: int
    #: Consumed pairs of the cell's DAGs whose event is neither the cell's nor the sentinel.
    unknown: int
    #: Consumer DAGs that consumed the sentinel.
    sentinel_consumers: int

    @property
    def classes_add_up(self) -> bool:
        return (
            self.consumed_pairs + self.late_pairs + self.unconsumed_pairs == self.pairs
            and self.consumed + self.late + self.unconsumed == self.events
        )


def classify(
    events: Iterable[int],
    dags: Sequence[str],
    consumed: Iterable[tuple[int, str, int]],
    cutoff: int,
    sentinel: int | None,
) -> PairClasses:
    """Classify ``events`` x ``dags`` from ``consumed`` rows ``(dag_run id, dag_id, event id)``.

    Runs with ``id <= cutoff`` were created before the sentinel; the others
    after it. A pair is *consumed* if a run before the sentinel consumed it,
    *late* if only later runs did, *unconsumed* if none did.
    """
    event_ids = sorted(set(events))
    known = set(event_ids)
    dag_set = set(dags)
    runs_of: dict[tuple[int, str], set[int]] = defaultdict(set)
    sentinel_dags: set[str] = set()
    unknown = 0
    for run_id, dag_id, event_id in consumed:
        if dag_id not in dag_set:
            continue
        if event_id in known:
            runs_of[(event_id, dag_id)].add(run_id)
        elif sentinel is not None and event_id == sentinel:
            sentinel_dags.add(dag_id)
        else:
            unknown += 1
    pair_class: dict[tuple[int, str], str] = {}
    for event_id in event_ids:
        for dag_id in dags:
            runs = runs_of.get((event_id, dag_id), set())
            if not runs:
                pair_class[(event_id, dag_id)] = "unconsumed"
            elif min(runs) <= cutoff:
                pair_class[(event_id, dag_id)] = "consumed"
            else:
                pair_class[(event_id, dag_id)] = "late"
    pair_counts = Counter(pair_class.values())
    event_counts: Counter[str] = Counter()
    in_no_run = 0
    for event_id in event_ids:
        classes = {pair_class[(event_id, d)] for d in dags}
        worst = next(c for c in ("unconsumed", "late", "consumed") if c in classes)
        event_counts[worst] += 1
        if classes == {"unconsumed"}:
            in_no_run += 1
    return PairClasses(
        pairs=len(pair_class),
        consumed_pairs=pair_counts["consumed"],
        late_pairs=pair_counts["late"],
        unconsumed_pairs=pair_counts["unconsumed"],
        duplicate_pairs=sum(1 for runs in runs_of.values() if len(runs) > 1),
        events=len(event_ids),
        consumed=event_counts["consumed"],
        late=event_counts["late"],
        unconsumed=event_counts["unconsumed"],
        in_no_run=in_no_run,
        unknown=unknown,
        sentinel_consumers=len(sentinel_dags),
    )
