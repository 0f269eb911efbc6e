"""Where the app's start is (``StartSteps``): shown by the start screen while the program's
heavy parts load (client/tui/screens/start.py), then by the chat screen's status line.
Light on purpose: the app draws it before anything heavy."""

import time


class StartSteps:
    """Where the start is: the step under way (numbered among the known steps), its time
    so far, its share when it reports one, and an estimate from its own rate. A step whose
    total changes (a new part of it: joining, then unpacking) starts its estimate anew."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.name: str | None = None
        self.began = self.part_began = time.monotonic()
        self.done = self.total = 0
        self.ended = False

    def begin(self, name: str) -> None:
        self.name, self.done, self.total = name, 0, 0
        self.began = self.part_began = time.monotonic()

    def progress(self, done: int, total: int) -> None:
        if total != self.total:
            self.part_began = time.monotonic()
        self.done, self.total = done, total

    def end(self) -> None:
        self.ended = True

    def line(self) -> str | None:
        if self.ended or self.name is None:
            return None
        now = time.monotonic()
        number = (f"step {self.names.index(self.name) + 1} of {len(self.names)}: "
                  if self.name in self.names else "")
        line = f"{number}{self.name}… {now - self.began:.0f} s"
        if self.total:
            share = self.done / self.total
            line += f" · {share:.0%}"
            spent = now - self.part_began
            if 0.05 <= share < 1 and spent >= 1:
                line += f" · about {spent * (1 - share) / share:.0f} s left"
        return line
