"""The built-in parts, one idea per module, each registered with ``@register(slot, kind)``.

Every module of this package is imported when the registry is first used, so a new built-in part
is one new file here. A researcher's own parts live in their own file or package and register
the same way (see :mod:`attnlab.parts`).
"""
