"""Per-transaction bookkeeping on a SQLAlchemy ``Session``, SAVEPOINT-aware.

Commit-time queueing and post-commit callbacks (the standalone manager's listeners, MariaDB's refresh
after COMMIT) share it: remember an item until the outermost COMMIT; forget it if the (nested)
transaction it was recorded in is rolled back. SQLAlchemy reports
a SAVEPOINT's end (``after_transaction_end``) *before* its rollback (``after_soft_rollback``), so
there a released and a rolled-back SAVEPOINT look alike: items stay keyed by their transaction
until the outermost one ends, and a rollback drops those of the rolled-back transaction and of
every transaction nested inside it.

Three listeners on the ``Session`` class, installed once per process when a scope first records an
item, not on import nor per session (listeners per session cost more than the rest of a one-event
transaction's bookkeeping); a session without scopes returns at once. ``after_commit`` also fires
when a SAVEPOINT is released: only the outermost COMMIT counts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction

__all__ = ["TransactionScoped", "current_transaction", "descends_from"]

T = TypeVar("T")

_SCOPES_KEY = "airflow_adrq.scopes"


def current_transaction(session: Session) -> SessionTransaction:
    """The innermost open transaction of ``session`` (beginning one if needed)."""
    session.connection()  # autobegin, so there is a transaction to attach to
    trans = session.get_nested_transaction() or session.get_transaction()
    assert trans is not None
    return trans


def descends_from(trans: SessionTransaction | None, ancestor: SessionTransaction) -> bool:
    """Whether ``trans`` is ``ancestor`` or nested (at any depth) inside it."""
    while trans is not None and trans is not ancestor:
        trans = trans.parent
    return trans is ancestor


@dataclass
class TransactionScoped(Generic[T]):
    """Items recorded on a session, each with the transaction it was recorded in.

    Once the scope is used on a session, ``after_commit(session, items)`` runs after every outermost
    COMMIT that succeeded, with items only; ``on_rollback(session, rolled_back, items)`` after a
    rollback dropped the rolled-back transaction's items. All are forgotten when the outermost
    transaction ends. (What runs *before* the COMMIT is a listener of its owner's:
    :func:`airflow_adrq.deferral.write_at_commit`.)
    """

    name: str
    after_commit: Callable[[Session, list[T]], None] | None = None
    on_rollback: Callable[[Session, SessionTransaction, list[T]], None] | None = None

    #: The ``session.info`` key of this scope's items: present once the session recorded one.
    name_key: str = field(init=False)

    def __post_init__(self) -> None:
        self.name_key = f"airflow_adrq.scoped.{self.name}"

    def add(self, session: Session, item: T) -> None:
        """Record ``item`` in the session's current (innermost) transaction."""
        global _installed
        if not _installed:  # the Session class listeners, once per process; then one flag read per item
            with _listening:
                for name, listener in _LISTENERS:
                    if not event.contains(Session, name, listener):
                        event.listen(Session, name, listener)
                _installed = True
        scopes: list[TransactionScoped[object]] = session.info.setdefault(_SCOPES_KEY, [])
        if self not in scopes:
            scopes.append(self)  # type: ignore[arg-type]
        by_transaction: dict[SessionTransaction, list[T]] = session.info.setdefault(self.name_key, {})
        by_transaction.setdefault(current_transaction(session), []).append(item)

    def items(self, session: Session) -> list[T]:
        """The items still alive in ``session``'s open transaction, in recording order."""
        items: list[T] = []
        for recorded in session.info.get(self.name_key, {}).values():
            items += recorded
        return items


def _on_after_commit(session: Session) -> None:
    if _SCOPES_KEY in session.info and session.get_nested_transaction() is None:
        for scope in list(session.info[_SCOPES_KEY]):
            if scope.after_commit is None:
                continue  # its items go at the transaction's end
            items = scope.items(session)
            session.info[scope.name_key] = {}
            if items:
                scope.after_commit(session, items)


def _on_soft_rollback(session: Session, rolled_back: SessionTransaction) -> None:
    for scope in list(session.info.get(_SCOPES_KEY, ())):
        by_transaction = session.info[scope.name_key]
        for trans in [trans for trans in by_transaction if descends_from(trans, rolled_back)]:
            del by_transaction[trans]
        if scope.on_rollback is not None:
            scope.on_rollback(session, rolled_back, scope.items(session))


def _on_transaction_end(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is None and _SCOPES_KEY in session.info:
        # Outermost transaction over: committed (handled) or rolled back.
        for scope in session.info[_SCOPES_KEY]:
            session.info[scope.name_key] = {}


_LISTENERS = (
    ("after_commit", _on_after_commit),
    ("after_soft_rollback", _on_soft_rollback),
    ("after_transaction_end", _on_transaction_end),
)
_listening = threading.Lock()
_installed = False
