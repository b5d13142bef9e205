"""``airflow-adrq bench``: Airflow 3.3.2's whole ``register_asset_change`` against ours, on a real database.

:mod:`.cli` is the command; the standalone run is :mod:`.config`, :mod:`.runner` (its producers are
pytest-xdist workers: :mod:`.suite`, synchronised by :mod:`.barrier`), :mod:`.engine` (with :mod:`.rawsql`)
and :mod:`.report`; :mod:`.load` is ``--faults`` and ``--soak``, :mod:`.airflow_mode` ``--airflow``,
``--accounting`` and ``--live``. Every mode shares :mod:`.options`, :mod:`.progress`, :mod:`.tables`,
:mod:`.stats`, :mod:`.verdict`. What the tests share with it is :mod:`airflow_adrq_testing`.
"""

__version__ = "0.1.0"
