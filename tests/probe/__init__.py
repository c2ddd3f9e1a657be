"""Tests of attnlab.probe: injection into pretrained models, methods, runs."""
