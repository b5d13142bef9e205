"""Per-transaction bookkeeping on a SQLAlchemy ``Session``, SAVEPOINT-aware.

The one mechanism commit-time queueing and post-commit callbacks share:
remember an item until the outermost COMMIT; forget it if the (nested)
transaction it was recorded in is rolled back. SQLAlchemy reports a
SAVEPOINT's end (``after_transaction_end``) *before* its rollback
(``after_soft_rollback``), so at its end a released and a rolled-back
SAVEPOINT look alike: items stay keyed by their transaction until the
outermost one ends, and a rollback drops the items of the rolled-back
transaction and of every transaction nested inside it.

Installs four listeners on the ``Session`` class (``before_commit``,
``after_commit``, ``after_soft_rollback``, ``after_transaction_end``), once
per process, when a scope first records an item; importing the module
installs nothing.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction

from airflow_adrq.errors import DeferredTooLateError

__all__ = ["DeferredWrites", "TransactionScoped", "current_transaction", "descends_from"]

T = TypeVar("T")

_SCOPES_KEY = "airflow_adrq.scopes"


def current_transaction(session: Session) -> SessionTransaction:
    """The innermost open transaction of ``session`` (beginning one if needed)."""
    session.connection()  # autobegin, so there is a transaction to attach to
    trans = session.get_nested_transaction() or session.get_transaction()
    assert trans is not None
    return trans


def descends_from(trans: SessionTransaction, ancestor: SessionTransaction) -> bool:
    """Whether ``trans`` is ``ancestor`` or nested (at any depth) inside it."""
    node: SessionTransaction | None = trans
    while node is not None:
        if node is ancestor:
            return True
        node = node.parent
    return False


@dataclass
class TransactionScoped(Generic[T]):
    """Items recorded on a session, each with the transaction it was recorded in.

    Once the scope is used on a session, ``before_commit(session, items)`` runs
    just before every outermost COMMIT, with or without items (inside the
    transaction: it may execute SQL; an exception aborts the commit);
    ``after_commit(session, items)`` runs after it succeeded, with items only;
    ``on_rollback(session, rolled_back, items)`` after a rollback has dropped
    the rolled-back transaction's items. All are forgotten when the outermost
    transaction ends.
    """

    name: str
    before_commit: Callable[[Session, list[T]], None] | None = None
    after_commit: Callable[[Session, list[T]], None] | None = None
    on_rollback: Callable[[Session, SessionTransaction, list[T]], None] | None = None
    _key: str = field(init=False)

    def __post_init__(self) -> None:
        self._key = f"airflow_adrq.scoped.{self.name}"

    def add(self, session: Session, item: T) -> None:
        """Record ``item`` in the session's current (innermost) transaction."""
        _install(session, self)
        self._map(session).setdefault(current_transaction(session), []).append(item)

    def items(self, session: Session) -> list[T]:
        """The items still alive in ``session``'s open transaction, in recording order."""
        return [item for items in self._map(session).values() for item in items]

    def clear(self, session: Session) -> None:
        """Forget every item in ``session``."""
        self._map(session).clear()

    def _map(self, session: Session) -> dict[SessionTransaction, list[T]]:
        found: dict[SessionTransaction, list[T]] = session.info.setdefault(self._key, {})
        return found

    # -- event dispatch (see _install) --------------------------------------

    def _before_commit(self, session: Session) -> None:
        # Called even without items: an owner may need to know the commit began.
        if self.before_commit is not None:
            self.before_commit(session, self.items(session))

    def _after_commit(self, session: Session) -> None:
        items = self.items(session)
        self.clear(session)
        if self.after_commit is not None and items:
            self.after_commit(session, items)

    def _rolled_back(self, session: Session, rolled_back: SessionTransaction) -> None:
        mapping = self._map(session)
        for trans in list(mapping):
            if descends_from(trans, rolled_back):
                del mapping[trans]
        if self.on_rollback is not None:
            self.on_rollback(session, rolled_back, self.items(session))


def _install(session: Session, scope: TransactionScoped[T]) -> None:
    _listen()
    scopes: list[TransactionScoped[object]] = session.info.setdefault(_SCOPES_KEY, [])
    if scope not in scopes:
        scopes.append(scope)  # type: ignore[arg-type]


def _scopes(session: Session) -> list[TransactionScoped[object]]:
    return list(session.info.get(_SCOPES_KEY, ()))


# Registered once, on the Session class (so for every session and subclass),
# the first time a scope records an item (_listen): four listeners per session
# cost more than the rest of a one-event transaction's bookkeeping, and a
# process that imports the package without using a scope gets none. A session
# without scopes returns at once. before_commit and after_commit also fire
# when a SAVEPOINT is released; only the outermost COMMIT counts (a released
# SAVEPOINT's items stay until then).


def _on_before_commit(session: Session) -> None:
    if _SCOPES_KEY in session.info and session.get_nested_transaction() is None:
        for scope in _scopes(session):
            scope._before_commit(session)


def _on_after_commit(session: Session) -> None:
    if _SCOPES_KEY in session.info and session.get_nested_transaction() is None:
        for scope in _scopes(session):
            scope._after_commit(session)


def _on_soft_rollback(session: Session, previous_transaction: SessionTransaction) -> None:
    for scope in _scopes(session):
        scope._rolled_back(session, previous_transaction)


def _on_transaction_end(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is None and _SCOPES_KEY in session.info:
        # Outermost transaction over: committed (handled) or rolled back.
        for scope in _scopes(session):
            scope.clear(session)


_LISTENERS = (
    ("before_commit", _on_before_commit),
    ("after_commit", _on_after_commit),
    ("after_soft_rollback", _on_soft_rollback),
    ("after_transaction_end", _on_transaction_end),
)
_listening = threading.Lock()
_installed = False


def _listen() -> None:
    """The four ``Session`` class listeners above, installed once per process."""
    global _installed
    if _installed:  # the common case: one flag read per recorded item
        return
    with _listening:
        for name, listener in _LISTENERS:
            if not event.contains(Session, name, listener):
                event.listen(Session, name, listener)
        _installed = True


@dataclass
class _Write(Generic[T]):
    item: T
    # The transaction whose statement wrote the item (a flush or the commit);
    # None while it still has to be written.
    written_in: SessionTransaction | None = None


class DeferredWrites(Generic[T]):
    """Items written by one ``write(session, items)`` call just before the outermost COMMIT.

    :meth:`flush` writes the unwritten items earlier, in the current (maybe
    nested) transaction; if that SAVEPOINT is rolled back, its rows are gone
    and the items are written again at COMMIT (items *recorded* in it are
    dropped, as in :class:`TransactionScoped`). At COMMIT the session is
    flushed first, so items recorded by flush hooks are written too; an
    exception from ``write`` makes ``Session.commit()`` raise. An item
    recorded after the commit-time write (by a later ``before_commit``
    listener) can no longer be written: :meth:`add` raises
    :class:`DeferredTooLateError` rather than drop it.
    """

    def __init__(self, name: str, write: Callable[[Session, list[T]], None]) -> None:
        self._write = write
        self._written_key = f"airflow_adrq.written_at_commit.{name}"
        self._scope: TransactionScoped[_Write[T]] = TransactionScoped(
            name, before_commit=self._before_commit, on_rollback=self._rolled_back
        )

    def add(self, session: Session, item: T) -> None:
        """Record ``item`` in the session's current transaction; emits no SQL."""
        written: weakref.ref[SessionTransaction] | None = session.info.get(self._written_key)
        if written is not None and written() is not None and written() is session.get_transaction():
            raise DeferredTooLateError(
                f"{self._scope.name}: recorded after this transaction's commit-time write had run "
                "(from a before_commit listener registered after airflow-adrq's?). Register it "
                "before committing, or call the flush function from that listener first."
            )
        self._scope.add(session, _Write(item))

    def pending(self, session: Session) -> list[T]:
        """Items recorded and not written yet, in recording order."""
        return [entry.item for entry in self._unwritten(session)]

    def flush(self, session: Session) -> list[T]:
        """Write the pending items now with one ``write`` call; return them."""
        entries = self._unwritten(session)
        if not entries:
            return []
        items = [entry.item for entry in entries]
        self._write(session, items)
        current = current_transaction(session)
        for entry in entries:
            entry.written_in = current
        return items

    def _unwritten(self, session: Session) -> list[_Write[T]]:
        return [entry for entry in self._scope.items(session) if entry.written_in is None]

    def _before_commit(self, session: Session, _entries: list[_Write[T]]) -> None:
        # Flush hooks may record more; flush now so they are written too.
        session.flush()
        self.flush(session)
        root = session.get_transaction()
        if root is not None:
            session.info[self._written_key] = weakref.ref(root)

    def _rolled_back(
        self, _session: Session, rolled_back: SessionTransaction, entries: list[_Write[T]]
    ) -> None:
        for entry in entries:
            if entry.written_in is not None and descends_from(entry.written_in, rolled_back):
                entry.written_in = None
