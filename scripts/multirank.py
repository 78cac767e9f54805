"""The test harness's name for the course's multi-rank kit, ``lessons/multirank.py``.

The tests, ``make soak`` and the lesson fixtures launch ranks, kill them and look for
leftovers with the very code the lessons use (lesson 09 explains it). The kit lives in
``lessons/`` so that a lesson imports it as ``multirank``; this module puts that folder on
the path and re-exports it, so both names are one module object:

    from scripts.multirank import launch, running
"""

from __future__ import annotations

import sys

from scripts.manifest import LESSONS

if str(LESSONS) not in sys.path:
    sys.path.append(str(LESSONS))

from multirank import *  # noqa: F403
from multirank import __all__  # noqa: F401
