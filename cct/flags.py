"""gflags-style command-line flags, as Caffe's tools take them.

Every gflags spelling is accepted: ``-model x``, ``-model=x``, ``--model=x``, ``--model x``;
boolean flags also as ``-shuffle`` / ``--noshuffle`` / ``-shuffle=false``. Arguments that are
not flags are positional (Caffe's tools take e.g. ``ROOTFOLDER/ LISTFILE DB_NAME``).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from .errors import CCTError

_TRUE = {"true", "1", "yes", "t", "y"}
_FALSE = {"false", "0", "no", "f", "n"}


class Flags:
    """Parse ``argv`` against ``known`` ({name: default string}); ``booleans`` name the flags
    that take no value. Unknown flags are errors naming the command and the known flags."""

    def __init__(self, command: str, argv: Sequence[str], known: Dict[str, str],
                 booleans: Sequence[str] = (), positional: Sequence[str] = ()):
        self.command = command
        self.values: Dict[str, str] = dict(known)
        self.booleans = set(booleans)
        for b in self.booleans:
            self.values.setdefault(b, "false")
        self.positional: List[str] = []
        argv = list(argv)
        i = 0
        while i < len(argv):
            arg = argv[i]
            if not arg.startswith("-") or arg in ("-", "--") or _is_number(arg):
                self.positional.append(arg)
                i += 1
                continue
            name = arg.lstrip("-")
            value: Optional[str] = None
            if "=" in name:
                name, value = name.split("=", 1)
            if name not in self.values and name.startswith("no") and name[2:] in self.booleans:
                name, value = name[2:], "false"
            if name not in self.values:
                raise CCTError(f"{command}: unknown flag -{name}; known flags: "
                               + ", ".join(f"-{k}" for k in sorted(self.values)))
            if value is None:
                if name in self.booleans:
                    value = "true"
                elif i + 1 < len(argv):
                    value = argv[i + 1]
                    i += 1
                else:
                    raise CCTError(f"{command}: flag -{name} needs a value")
            self.values[name] = value
            i += 1
        if positional and len(self.positional) != len(positional):
            raise CCTError(f"{command}: expected {len(positional)} argument(s) "
                           f"({' '.join(positional)}), got {len(self.positional)}"
                           + (f": {' '.join(self.positional)}" if self.positional else ""))

    def get(self, name: str) -> str:
        return self.values[name]

    def int(self, name: str) -> int:
        try:
            return int(self.values[name])
        except ValueError:
            raise CCTError(f"{self.command}: -{name} must be an integer, got "
                           f"'{self.values[name]}'") from None

    def float(self, name: str) -> float:
        try:
            return float(self.values[name])
        except ValueError:
            raise CCTError(f"{self.command}: -{name} must be a number, got "
                           f"'{self.values[name]}'") from None

    def bool(self, name: str) -> bool:
        v = self.values[name].lower()
        if v in _TRUE:
            return True
        if v in _FALSE:
            return False
        raise CCTError(f"{self.command}: -{name} must be true or false, got '{v}'")

    def list(self, name: str) -> List[str]:
        """A comma-separated flag (``-stage a,b``, ``-weights x,y``) as a list."""
        return [x for x in self.values[name].split(",") if x]


def _is_number(arg: str) -> bool:
    try:
        float(arg)
        return True
    except ValueError:
        return False
