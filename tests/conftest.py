"""The test folders mirror the packages of ``twill/``; the fixtures they share live here in ``tests/``
(``solved.py``, ``randgraphs.py``, ``graphs.py``, ``data/``, ``golden/``). pytest puts each test
file's own folder on ``sys.path``, so this puts ``tests/`` there too: ``import solved`` works from any folder."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)
