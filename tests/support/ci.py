"""The one CI switch of the test suite, and the one way a test says it cannot run here."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    """Whether ``CI`` is set (``.ci/run`` sets ``CI=true``): a missing backend then fails, not skips."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def skip_or_fail(message: str) -> NoReturn:
    """Skip with ``message`` (what is missing, how to get it); under CI fail with it.

    For what CI installs (.ci/run): there a skip would be a silent green. Skips by
    design (a backend not selected, another Airflow release line) use ``pytest.skip``.
    """
    if in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)
