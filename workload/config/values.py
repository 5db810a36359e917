"""Typed values of the config: what a flag gives as text (`--checkpoint-every 500` or
`10m`), and the Range a number must be in."""

from __future__ import annotations

import re
from dataclasses import dataclass

from workload.errors import UsageError

_UNITS = {"s": 1, "m": 60, "h": 3600}
WEEK = 7 * 24 * 3600.0  # the longest timeout a flag takes (seconds)


@dataclass(frozen=True)
class Every:
    """A period in optimizer steps or in seconds (one of them; both 0 = never)."""

    steps: int = 0
    seconds: float = 0.0

    @classmethod
    def parse(cls, text) -> Every:
        """"500" -> 500 steps; "10m" -> 600 s (also "90s", "1h"); "0" -> never."""
        if isinstance(text, Every):
            return text
        match = re.fullmatch(r"\s*(\d+)\s*([smh]?)\s*", str(text))
        if not match:
            raise UsageError(f"--checkpoint-every {text!r} is neither a step count nor a "
                             "duration; pass e.g. --checkpoint-every 500 (steps) or 10m "
                             "(also 90s, 1h)")
        number = int(match.group(1))
        unit = match.group(2)
        return cls(0, float(number * _UNITS[unit])) if unit else cls(number, 0.0)

    def __str__(self) -> str:
        """The flag's text again ("500", "30m"): what config.json records."""
        if self.steps:
            return str(self.steps)
        seconds = int(self.seconds)
        for unit, size in (("h", 3600), ("m", 60)):
            if seconds and seconds % size == 0:
                return f"{seconds // size}{unit}"
        return f"{seconds}s" if seconds else "0"


@dataclass(frozen=True)
class Range:
    """The numbers a field may take: `low`/`high` are None where unbounded, and an `open`
    end excludes its bound. Past the ends a run only breaks (a zero learning rate, a
    schedule that overflows) or exhausts memory (a width of 10^5)."""
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def problem(self, value) -> str:
        """What `value` must be ("" when it is inside): the violated side, or both ends
        of a closed range."""
        too_low = self.low is not None and (value <= self.low if self.low_open
                                            else value < self.low)
        too_high = self.high is not None and (value >= self.high if self.high_open
                                              else value > self.high)
        if not (too_low or too_high):
            return ""
        if self.low is not None and self.high is not None and not (self.low_open
                                                                   or self.high_open):
            return f"from {self.low!r} to {self.high!r}"
        if too_low:
            return f"greater than {self.low!r}" if self.low_open else f"{self.low!r} or more"
        return f"less than {self.high!r}" if self.high_open else f"at most {self.high!r}"
