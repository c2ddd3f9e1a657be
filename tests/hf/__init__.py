"""Tests of attnlab.hf: export to transformers, --init-from, model cards, lm-eval on a folder."""
