"""Tests of attnlab.commands and cli.py: command lines, their output and their refusals."""
