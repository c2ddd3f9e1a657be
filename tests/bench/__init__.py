"""Tests of attnlab.bench: ``attnlab bench``, its FLOP counts, peers, decoding and targets."""
