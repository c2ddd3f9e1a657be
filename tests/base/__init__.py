"""Tests of attnlab.base: errors and exit codes, messages, safe paths, failed writes."""
