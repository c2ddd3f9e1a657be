"""Tests of attnlab.model: the attention, the block, the families and every built-in part's math."""
