"""Running an experiment's runs: :mod:`.runner` (``run_all``: the checks before anything trains,
then every run not yet over), :mod:`.execute` (one run, wherever it executes), the launchers
(:mod:`.launch`: this process or ``--jobs`` workers, :mod:`.parallel`; :mod:`.launch_submitit`:
submitit jobs), :mod:`.pruning` (a sweep's early stopping), the progress display and ETA
(:mod:`.progress`) and the ``--plan`` time estimate (:mod:`.estimate`). Imports the experiment's
definition (:mod:`~attnlab.experiments.resolve`), never a report."""
