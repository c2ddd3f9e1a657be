"""Tests of attnlab.config and attnlab.recipe: the config tree, presets, shipped configs."""
