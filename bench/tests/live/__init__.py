"""The live mode's tests: a package, so that its conftest is ``live.conftest``, not a second ``conftest``."""
