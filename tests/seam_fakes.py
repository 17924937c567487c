"""Fakes of the supervisor's seams (supervisor/seams.py) shared by the unit tests of its parts."""

from __future__ import annotations

from piworkflows.supervisor.leftovers import Leftovers
from piworkflows.supervisor.registry import Identity


class Recorder:
    """host.json as a list: the children recorded and not yet forgotten."""

    def __init__(self) -> None:
        self.recorded: list[Identity] = []
        self.leftovers = Leftovers("test", recorded=lambda: {i.pid for i in self.recorded})

    def record_child(self, identity: Identity) -> None:
        self.recorded.append(identity)

    def forget_child(self, pid: int) -> None:
        self.recorded = [i for i in self.recorded if i.pid != pid]
