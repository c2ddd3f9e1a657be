"""The part and family registries and the plugin loader's records, kept as they were around a block of tests
or a collection: parts registered inside (plugins, faulty parts for the check) leave with it."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def restored() -> Iterator[None]:
    """Restore the registered parts and families, the plugin loader's records, and forget the modules of the
    plugins loaded inside (so the same file loaded again later runs its ``@register`` again
    instead of finding its module imported and registering nothing)."""
    from attnlab.parts import families, plugins, registry

    registry.specs()  # the built-in parts and families, loaded before the snapshot
    families.specs()
    parts = {slot: dict(specs) for slot, specs in registry._parts.items()}
    family_specs = dict(families._families)
    records = [(d, dict(d)) for d in (plugins._loaded, plugins._moved, plugins._recorded)]
    loaded = set(plugins._loaded)
    try:
        yield
    finally:
        modules = {r.module for spec, r in plugins._loaded.items() if spec not in loaded}
        modules = {m for m in modules if m and m.split(".")[0] != "attnlab"}
        for name in [m for m in sys.modules if m in modules or m.split(".")[0] in modules]:
            del sys.modules[name]
        registry._parts.clear()
        registry._parts.update(parts)
        families._families.clear()
        families._families.update(family_specs)
        for d, saved in records:
            d.clear()
            d.update(saved)
