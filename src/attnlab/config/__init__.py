"""The typed configuration tree: ``model``, ``data``, ``train``, ``eval``, ``experiment``.

A config comes from a named preset (``attnlab/presets/NAME.toml``), from a TOML file, or both (a file
may say ``extends = "NAME"``), plus ``--set dotted.key=value`` overrides. Everything is validated at
load time: an unknown key names the nearest valid spelling, a wrong value names the allowed ones, and
an impossible combination is refused with its reason, never deep inside a forward pass.

The pieces, one concern each (import the names from here):

- :mod:`~attnlab.config.schema` the tree (:class:`Config`, its sections) and :func:`validate`;
  :mod:`~attnlab.config.model_schema` the ``[model]`` table
- :mod:`~attnlab.config.checks` the impossible combinations (masks' in
  :mod:`~attnlab.config.mask_checks`; each family's own ``check`` in its family file,
  :mod:`attnlab.model.families`)
- :mod:`~attnlab.config.loading` presets, TOML files, ``extends``; :mod:`~attnlab.config.overrides`
  ``--set``; :mod:`~attnlab.config.merge` merging raw tables; :mod:`~attnlab.config.carried` a
  slot table whose kind changes
- :mod:`~attnlab.config.legacy` the keys of earlier versions (the one migration table)
- :mod:`~attnlab.config.explain` validation errors as readable lines
- :mod:`~attnlab.config.writing` TOML out; :mod:`~attnlab.config.plugins` a config's plugins
"""

from __future__ import annotations

from attnlab.config.carried import (
    CARRIED,
    SLOT_FIELDS,
    DroppedOptionWarning,
    settle_carried,
    switch_kind,
)
from attnlab.config.errors import ConfigError, cut_repr
from attnlab.config.explain import explain, fields_at, raw_kind, schema_at
from attnlab.config.legacy import (
    LEGACY_POSITION_KEYS,
    OLD_PROBE_PARTS,
    PROBE_RENAMED,
    RENAMED,
    moved_probe_parts,
)
from attnlab.config.loading import load_config, preset_names, read_toml_file, source_dict
from attnlab.config.merge import deep_merge, flatten
from attnlab.config.model_schema import AttentionConfig, ModelConfig, RetrievalConfig
from attnlab.config.overrides import apply_overrides, check_distinct, parse_override
from attnlab.config.plugins import load_config_plugins, resolve_plugin_paths, with_plugins
from attnlab.config.schema import (
    Config,
    DataConfig,
    EvalConfig,
    ExperimentConfig,
    TrainConfig,
    validate,
)
from attnlab.config.writing import dump_toml, to_toml

#: the old name of :func:`~attnlab.config.writing.to_toml` (tests and other branches import it)
_to_toml = to_toml

__all__ = [
    "CARRIED",
    "LEGACY_POSITION_KEYS",
    "OLD_PROBE_PARTS",
    "PROBE_RENAMED",
    "RENAMED",
    "SLOT_FIELDS",
    "AttentionConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "DroppedOptionWarning",
    "EvalConfig",
    "ExperimentConfig",
    "ModelConfig",
    "RetrievalConfig",
    "TrainConfig",
    "apply_overrides",
    "check_distinct",
    "cut_repr",
    "deep_merge",
    "dump_toml",
    "explain",
    "fields_at",
    "flatten",
    "load_config",
    "load_config_plugins",
    "moved_probe_parts",
    "parse_override",
    "preset_names",
    "raw_kind",
    "read_toml_file",
    "resolve_plugin_paths",
    "schema_at",
    "settle_carried",
    "source_dict",
    "switch_kind",
    "to_toml",
    "validate",
    "with_plugins",
]
