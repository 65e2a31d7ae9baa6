"""The order in which the two test processes (pytest-xdist, ``--dist loadfile`` in pyproject.toml) take the
test files: files with more ``slow`` tests first, so that a long file (the random 160-op graphs, the docs'
``twill tune`` commands) does not start last while the other process has nothing left to do. The tests of a
file keep their order (the docs' commands read files that earlier commands write)."""

from __future__ import annotations

from collections import Counter


def pytest_collection_modifyitems(items) -> None:
    """Stable sort of ``items`` by file: most ``slow`` tests first, then in collection order."""
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    first: dict = {}
    for index, item in enumerate(items):
        first.setdefault(item.path, index)
    items.sort(key=lambda item: (-slow[item.path], first[item.path]))
