"""``airflow-adrq bench``: Airflow 3.3.2's whole ``register_asset_change`` against ours, on a real database.

The standalone run: :mod:`.cli` (the command and its modes), :mod:`.config` (sizes, plan),
:mod:`.runner` (scratch databases, one process per party, the one-caller measurements),
:mod:`.engine` (the parties' loops, the fan-out sweep, the raw-SQL ratio against :mod:`.rawsql`),
:mod:`.report` and :mod:`.verdict` (tables, the verdict every mode prints last), :mod:`.load`
(``--faults``, ``--soak``), :mod:`.residual` (the timing race between producers of different
assets). Shared by every mode: :mod:`.options`, :mod:`.progress`, :mod:`.tables`, :mod:`.plots`,
:mod:`.stats`, :mod:`.errors`. :mod:`.airflow_mode`: ``--airflow`` and ``--live``, through
Apache Airflow's own code. What the tests share with the benchmark (the loop versions airflow-adrq
replaces, the data set, the scheduler model) is the test support, :mod:`airflow_adrq_testing`.
"""

__version__ = "0.1.0"
