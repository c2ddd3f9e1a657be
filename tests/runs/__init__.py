"""Tests of attnlab.runs: run directories, checkpoints, determinism, devices, trackers."""
