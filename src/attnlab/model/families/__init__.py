"""The built-in model families, one module each, registered with ``@register_family(name)``:
``decoder`` (a causal LM), ``encoder`` (a masked LM), ``encoder_decoder`` (span corruption,
seq2seq) and ``retrieval`` (a decoder reading retrieved neighbours, RETRO).

Every module of this package is imported when the family registry
(:mod:`attnlab.parts.families`) is first used, so a new built-in family is one new file here.
A researcher's own family lives in their own file and registers the same way (see
:mod:`attnlab.parts.family` for the contract and ``examples/prefix_lm.py`` for one).
"""
