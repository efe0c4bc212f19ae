"""The pre-registered studies of studies/pretraining_pays/, importable from this room by their module names.

This study reuses their corpora, decontamination, shard sets, training runs, fine-tuning pairings, statistics and
record keeping as they are (protocol.md says which). Their modules import each other by name, with their own folder on
the path (as a script run from there has it), so that folder goes on the path here before any of them is imported.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOM = Path(__file__).resolve().parent
EARLIER_STUDY = ROOM.parent / "pretraining_pays"
if str(EARLIER_STUDY) not in sys.path:
    sys.path.insert(0, str(EARLIER_STUDY))
