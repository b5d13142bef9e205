"""Which pairs (event, consumer DAG) a run consumed, late or never: pure classification."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: From worst to best: an event is in the worst class of its pairs.
_CLASSES = ("unconsumed", "late", "consumed")


@dataclass(frozen=True)
class PairClasses:
    """Every (event, consumer DAG) pair and every event of a cell, each in exactly one class."""

    pairs: int
    consumed_pairs: int
    late_pairs: int
    unconsumed_pairs: int
    duplicate_pairs: int  # consumed by more than one run of the DAG (counted once above)
    events: int
    consumed: int  # every pair consumed before the sentinel
    late: int  # no pair unconsumed, at least one only by the sentinel's runs
    unconsumed: int  # at least one consumer DAG's runs never consumed it
    in_no_run: int  # consumed by no run of any consumer DAG
    unknown: int  # consumed pairs of the cell's DAGs whose event is neither the cell's nor the sentinel
    sentinel_consumers: int  # consumer DAGs that consumed the sentinel

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
    """Classify ``events`` x ``dags`` from ``consumed`` rows ``(dag_run id, dag_id, event id)``: a pair is
    *consumed* if a run created before the sentinel (``id <= cutoff``) consumed it, *late* if only later
    runs did, *unconsumed* if none did."""
    event_ids = sorted(set(events))
    known, cell_dags = set(event_ids), set(dags)
    runs_of: dict[tuple[int, str], set[int]] = defaultdict(set)
    sentinel_dags: set[str] = set()
    unknown = 0
    for run_id, dag_id, event_id in consumed:
        if dag_id not in cell_dags:
            continue
        if event_id in known:
            runs_of[(event_id, dag_id)].add(run_id)
        elif sentinel is not None and event_id == sentinel:
            sentinel_dags.add(dag_id)
        else:
            unknown += 1

    def pair_class(runs: set[int]) -> str:
        return "unconsumed" if not runs else "consumed" if min(runs) <= cutoff else "late"

    per_event = {e: {pair_class(runs_of.get((e, d), set())) for d in dags} for e in event_ids}
    pairs = Counter(pair_class(runs_of.get((e, d), set())) for e in event_ids for d in dags)
    worst = Counter(next(c for c in _CLASSES if c in classes) for classes in per_event.values())
    return PairClasses(
        pairs=len(event_ids) * len(dags),
        consumed_pairs=pairs["consumed"],
        late_pairs=pairs["late"],
        unconsumed_pairs=pairs["unconsumed"],
        duplicate_pairs=sum(1 for runs in runs_of.values() if len(runs) > 1),
        events=len(event_ids),
        consumed=worst["consumed"],
        late=worst["late"],
        unconsumed=worst["unconsumed"],
        in_no_run=sum(1 for classes in per_event.values() if classes == {"unconsumed"}),
        unknown=unknown,
        sentinel_consumers=len(sentinel_dags),
    )
