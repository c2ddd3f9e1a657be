"""Tests of attnlab.train: the training loop, objectives, optimizer, distributed and killed runs."""
