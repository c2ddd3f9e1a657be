"""Import a module from the very bytes that were checked, never from its file read again.

Checking a file's SHA-256 and then importing it by path reads the file twice: a file swapped in
between runs unchecked. So code that came with a model folder (an export's ``plugins/``, a
received run's plugin file, an export's copied helper modules) and every plugin file are
imported from the bytes read once: :class:`CheckedLoader` is an importlib source loader whose
``get_data`` returns those bytes for the module's own path and reads nothing else (no bytecode
cache is read or written), so the code object is compiled from exactly what was hashed.

- :func:`import_checked` imports one module under a name, from a :class:`CheckedSource`;
- :func:`serving` puts a meta-path finder first on ``sys.meta_path`` for the duration of a block,
  so that the ``import`` statements of the checked modules themselves (a plugin importing its
  helper) find the checked bytes of the other names too.

The module's ``__file__`` is still its path (tracebacks and ``inspect`` point at the file), and a
package's ``__path__`` is empty unless the source names its locations, so no unchecked submodule
is found beside it.

This module is copied into exported folders (their remote code imports plugins through it), so
it imports nothing but the standard library. Cost: one compile per module, as a normal import.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class CheckedSource:
    """One module's source as checked: its module name, its file and the bytes read from it."""

    name: str
    path: str
    data: bytes
    package: bool = False
    #: where a package's submodules are looked for (none: only checked ones are served)
    locations: tuple[str, ...] = ()


class CheckedLoader(importlib.abc.SourceLoader):
    """Serves one module's checked bytes; reads no file (``path_stats`` is not given, so the
    import system neither reads nor writes a bytecode cache)."""

    def __init__(self, source: CheckedSource) -> None:
        self.source = source
        self.path = source.path  # what importlib.readers.FileReader reads a package's data from

    def get_filename(self, fullname: str) -> str:
        return self.source.path

    def get_data(self, path: str) -> bytes:
        if path == self.source.path:
            return self.source.data
        raise OSError(f"{path}: only the checked source of {self.source.name} is read")

    def is_package(self, fullname: str) -> bool:
        return self.source.package

    def get_resource_reader(self, fullname: str):
        """A package's data files (``importlib.resources``), read beside its file as usual."""
        from importlib.readers import FileReader

        return FileReader(self) if self.source.package and self.source.locations else None


def spec_of(source: CheckedSource):
    """The module spec that imports ``source`` from its checked bytes."""
    return importlib.util.spec_from_file_location(
        source.name,
        source.path,
        loader=CheckedLoader(source),
        submodule_search_locations=list(source.locations) if source.package else None,
    )


def import_checked(source: CheckedSource) -> ModuleType:
    """Import ``source`` as module ``source.name`` (put in ``sys.modules``; taken out again if
    its code raises)."""
    module = importlib.util.module_from_spec(spec_of(source))
    sys.modules[source.name] = module
    try:
        module.__spec__.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(source.name, None)
        raise
    return module


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, sources: Mapping[str, CheckedSource]) -> None:
        self.sources = dict(sources)

    def find_spec(self, fullname, path=None, target=None):
        source = self.sources.get(fullname)
        return spec_of(source) if source is not None else None


def served(fullname: str) -> bool:
    """Whether a :func:`serving` block now serves module ``fullname`` from checked bytes."""
    return any(isinstance(f, _Finder) and fullname in f.sources for f in sys.meta_path)


@contextlib.contextmanager
def serving(sources: Mapping[str, CheckedSource]) -> Iterator[None]:
    """Inside this block, ``import NAME`` of a name in ``sources`` (module name -> source) not
    yet in ``sys.modules`` is served from its checked bytes, before any other finder."""
    finder = _Finder(sources)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)


__all__ = ["CheckedLoader", "CheckedSource", "import_checked", "served", "serving", "spec_of"]
