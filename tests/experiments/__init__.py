"""Tests of attnlab.experiments: compare, sweeps, statistics, matching, reports."""
