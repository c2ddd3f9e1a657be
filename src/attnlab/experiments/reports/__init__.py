"""The report of an experiment directory, rebuilt from its run directories and
``experiment.json`` alone (:mod:`.build`): a comparison (:mod:`.report`) or a sweep
(:mod:`.sweep_report`), each a list of sections (shared ones: :mod:`.sections`; from the parts'
own declarations: :mod:`.part_sections`) in Markdown (:mod:`.markdown`), with plots
(:mod:`.plots`, :mod:`.sweep_plots`), statistics (:mod:`.stats`, :mod:`.student_t`,
:mod:`.curves`, :mod:`.sweep_analysis`) and trained-model analyses (:mod:`.analysis`). Imports
the experiment's definition and :mod:`~attnlab.experiments.sweeps`, never the running."""
