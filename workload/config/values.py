"""Typed values that a flag gives as text: `--checkpoint-every 500` or `10m`."""

from __future__ import annotations

import re
from dataclasses import dataclass

from workload.errors import UsageError

_UNITS = {"s": 1, "m": 60, "h": 3600}


@dataclass(frozen=True)
class Every:
    """A period in optimizer steps or in seconds (one of them; both 0 = never)."""

    steps: int = 0
    seconds: float = 0.0

    @classmethod
    def parse(cls, text) -> "Every":
        """"500" -> 500 steps; "10m" -> 600 s (also "90s", "1h"); "0" -> never."""
        if isinstance(text, Every):
            return text
        match = re.fullmatch(r"\s*(\d+)\s*([smh]?)\s*", str(text))
        if not match:
            raise UsageError(f"--checkpoint-every {text!r} is neither a step count nor a "
                             "duration; pass e.g. --checkpoint-every 500 (steps) or 10m "
                             "(also 90s, 1h)")
        number, unit = int(match.group(1)), match.group(2)
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
