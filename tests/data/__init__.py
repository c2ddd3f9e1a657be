"""Tests of attnlab.data: corpora, tokenizers, preparation, token shards, schedules."""
