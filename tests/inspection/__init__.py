"""Tests of attnlab.inspection: ``attnlab inspect``'s page, in a browser and in memory."""
