"""How a scaling curve is fitted and how far it is trusted: :class:`FitSettings`, defined with
the experiment file's ``[ladder]`` table (:mod:`attnlab.experiments.ladder_spec`), whose
``[ladder.fit]`` it is."""

from attnlab.experiments.ladder_spec import FitSettings

__all__ = ["FitSettings"]
