"""Tests of attnlab.parts: slots, the registry, plugins and part statistics."""
