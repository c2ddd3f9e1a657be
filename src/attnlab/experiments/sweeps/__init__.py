"""Sweeps: an experiment's ``[sweep]`` grid (its table: :mod:`~attnlab.experiments.sweep_spec`)
expanded into one resolution per grid point (:mod:`.grid`: arms named ``variant@point``), the run
count and its limits (:mod:`.budget`) and the ``--plan`` text (:mod:`.plan`). Above
:mod:`~attnlab.experiments.resolve`; the sweep's report is :mod:`attnlab.experiments.reports`."""
