"""Tests of attnlab.eval: perplexity, cloze, multiple choice, lm-eval, long contexts."""
