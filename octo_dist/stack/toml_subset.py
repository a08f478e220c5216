"""A reader for the subset of TOML that env/stack.toml is written in, for Pythons without ``tomllib``.

ABCI's login nodes run the host-side steps (``make sif``, ``make docker``, ``octo-dist launch``) on the system
Python 3.9.18, which has no ``tomllib`` (3.11+) and no ``tomli``. Rather than copy the pins into a second
format, the manifest stays TOML and this module reads what it uses:

* tables ``[profiles.cuda11]``, quoted header keys ``[common.by_python."3.10".requirements]`` and arrays of
  tables ``[[profiles.cuda11.overrides]]``;
* ``key = value`` with bare, quoted or dotted keys;
* basic strings ``"==1.24.3"`` (with TOML's escapes) and literal strings ``'...'``, integers, floats,
  ``true``/``false``, and arrays of these, over several lines, with trailing commas and comments.

Anything else (inline tables, multi-line strings, dates) is refused with the line number, never guessed:
``tests/test_toml_subset.py`` checks that this reader and ``tomllib`` give the same dict for the committed
manifest and for fabricated ones, so a construct outside the subset is caught in CI, not on a login node.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List

from octo_dist.problems import Refusal

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_INTEGER = re.compile(r"[+-]?(0|[1-9](_?[0-9])*)(?![0-9A-Za-z_.:+-])")
_FLOAT = re.compile(
    r"[+-]?(0|[1-9](_?[0-9])*)(\.[0-9](_?[0-9])*)?([eE][+-]?[0-9](_?[0-9])*)?(?![0-9A-Za-z_.:+-])"
)
_ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", '"': '"', "\\": "\\"}


class TomlSubsetError(Refusal, ValueError):
    """Malformed TOML, or TOML outside the subset this reader supports; says which line."""

    def __init__(self, message: str, line: int):
        super().__init__(f"line {line}: {message}")
        self.line = line


# One Python frame per level: "a = [[[[...]]]]" 100,000 deep would end in a RecursionError, not a line. The
# manifest's deepest array is 1 level.
MAX_ARRAY_DEPTH = 32


def loads(text: str) -> Dict[str, Any]:
    """Parse ``text`` into the same dict ``tomllib.loads`` returns (for the supported subset).

    Raises:
        TomlSubsetError: with the line number of the first problem.
    """
    return _Reader(text).read()


class _Reader:
    def __init__(self, text: str):
        self.text = text
        self.pos = 0
        self.root: Dict[str, Any] = {}
        self.current: Dict[str, Any] = self.root
        self.headers: set = set()  # ids of tables opened by a [header] (a second one is an error)
        self.static_arrays: set = (
            set()
        )  # ids of arrays written as `key = [...]` ([[key]] may not extend them)

    # -- positions and errors ----------------------------------------------------------------------
    @property
    def line(self) -> int:
        return self.text.count("\n", 0, self.pos) + 1

    def error(self, message: str) -> TomlSubsetError:
        return TomlSubsetError(message, self.line)

    def peek(self, n: int = 1) -> str:
        return self.text[self.pos : self.pos + n]

    def skip_blanks(self) -> None:
        """Spaces and tabs on this line."""
        while self.peek() in (" ", "\t") and self.peek():
            self.pos += 1

    def skip_comment(self) -> None:
        if self.peek() == "#":
            end = self.text.find("\n", self.pos)
            self.pos = len(self.text) if end < 0 else end

    def end_of_line(self) -> None:
        """After a value or header: blanks, an optional comment, then a newline or the end."""
        self.skip_blanks()
        self.skip_comment()
        if self.peek() == "\r" and self.peek(2) == "\r\n":
            self.pos += 1
        if self.peek() not in ("\n", ""):
            raise self.error(
                f"expected the end of the line, found {self.text[self.pos :].splitlines()[0]!r}"
            )
        self.pos += 1

    # -- document --------------------------------------------------------------------------------------
    def read(self) -> Dict[str, Any]:
        while self.pos < len(self.text):
            self.skip_blanks()
            c = self.peek()
            if c in ("\n", "#", "\r") or not c:
                self.end_of_line()
            elif c == "[":
                self.header()
            else:
                self.key_value(self.current)
        return self.root

    def header(self) -> None:
        array = self.peek(2) == "[["
        self.pos += 2 if array else 1
        keys = self.key_path(end="]")
        if array:
            if self.peek(2) != "]]":
                raise self.error("an array-of-tables header must end with ']]'")
            self.pos += 2
        else:
            self.pos += 1
        self.end_of_line()
        parent = self.descend(keys[:-1])
        last = keys[-1]
        if array:
            existing = parent.setdefault(last, [])
            if not isinstance(existing, list) or id(existing) in self.static_arrays:
                raise self.error(
                    f"[[{'.'.join(keys)}]] redefines a key that is not an array of tables"
                )
            table: Dict[str, Any] = {}
            existing.append(table)
        else:
            table = parent.setdefault(last, {})
            if not isinstance(table, dict) or id(table) in self.headers:
                raise self.error(f"[{'.'.join(keys)}] is defined twice")
            self.headers.add(id(table))
        self.current = table

    def descend(self, keys: List[str]) -> Dict[str, Any]:
        """The table at ``keys`` under the root, creating tables; an array of tables means its last one."""
        table = self.root
        for key in keys:
            value = table.setdefault(key, {})
            if isinstance(value, list) and value and id(value) not in self.static_arrays:
                value = value[-1]
            if not isinstance(value, dict):
                raise self.error(f"{key!r} is a value, not a table")
            table = value
        return table

    def key_value(self, table: Dict[str, Any]) -> None:
        keys = self.key_path(end="=")
        self.pos += 1
        self.skip_blanks()
        value = self.value()
        self.end_of_line()
        for key in keys[:-1]:
            sub = table.setdefault(key, {})
            if not isinstance(sub, dict) or id(sub) in self.headers:
                raise self.error(
                    f"dotted key {'.'.join(keys)!r} runs through {key!r}, which is already a value"
                )
            table = sub
        if keys[-1] in table:
            raise self.error(f"key {'.'.join(keys)!r} is defined twice")
        table[keys[-1]] = value
        if isinstance(value, list):
            self.static_arrays.add(id(value))

    def key_path(self, end: str) -> List[str]:
        """``a."b".c`` up to ``end`` (not consumed)."""
        keys = []
        while True:
            self.skip_blanks()
            c = self.peek()
            if c == '"':
                keys.append(self.basic_string())
            elif c == "'":
                keys.append(self.literal_string())
            else:
                m = _BARE_KEY.match(self.text, self.pos)
                if not m:
                    raise self.error(
                        f"expected a key, found {self.text[self.pos :].splitlines()[0][:40]!r}"
                    )
                keys.append(m.group(0))
                self.pos = m.end()
            self.skip_blanks()
            c = self.peek()
            if c == ".":
                self.pos += 1
                continue
            if c == end:
                return keys
            raise self.error(
                f"expected '.' or {end!r} after the key {'.'.join(keys)!r}, found {c or 'the end'!r}"
            )

    # -- values --------------------------------------------------------------------------------------
    def value(self) -> Any:
        c = self.peek()
        if self.peek(3) in ('"""', "'''"):
            raise self.error(
                "multi-line strings are outside the TOML subset octo-dist reads without tomllib "
                "(Python < 3.11); write the string on one line"
            )
        if c == '"':
            return self.basic_string()
        if c == "'":
            return self.literal_string()
        if c == "[":
            return self.array()
        if c == "{":
            raise self.error(
                "inline tables are outside the TOML subset octo-dist reads without tomllib "
                "(Python < 3.11); write a [table] instead"
            )
        for word, value in (("true", True), ("false", False)):
            if self.text.startswith(word, self.pos) and not _BARE_KEY.match(
                self.text, self.pos + len(word)
            ):
                self.pos += len(word)
                return value
        m = _INTEGER.match(self.text, self.pos)
        if m:
            self.pos = m.end()
            return int(m.group(0).replace("_", ""))
        m = _FLOAT.match(self.text, self.pos)
        if m and m.group(0) not in ("+", "-"):
            self.pos = m.end()
            return float(m.group(0).replace("_", ""))
        found = self.text[self.pos :].splitlines()[0][:40] if self.pos < len(self.text) else ""
        raise self.error(
            f"expected a string, number, boolean or array, found {found!r} (dates, inf, nan and "
            f"0x/0o/0b integers are outside the TOML subset octo-dist reads without tomllib)"
        )

    def basic_string(self) -> str:
        self.pos += 1
        out = []
        while True:
            c = self.peek()
            if c in ("", "\n"):
                raise self.error("unterminated string")
            self.pos += 1
            if c == '"':
                return "".join(out)
            if c != "\\":
                out.append(c)
                continue
            e = self.peek()
            self.pos += 1
            if e in _ESCAPES:
                out.append(_ESCAPES[e])
            elif e in ("u", "U"):
                n = 4 if e == "u" else 8
                digits = self.peek(n)
                if not re.fullmatch(r"[0-9A-Fa-f]{%d}" % n, digits):
                    raise self.error(f"bad unicode escape \\{e}{digits}")
                out.append(chr(int(digits, 16)))
                self.pos += n
            else:
                raise self.error(f"unknown escape \\{e} in a string")

    def literal_string(self) -> str:
        end = self.text.find("'", self.pos + 1)
        newline = self.text.find("\n", self.pos + 1)
        if end < 0 or (0 <= newline < end):
            raise self.error("unterminated string")
        value = self.text[self.pos + 1 : end]
        self.pos = end + 1
        return value

    def array(self, depth: int = 1) -> List[Any]:
        if depth > MAX_ARRAY_DEPTH:
            raise self.error(f"arrays nested deeper than {MAX_ARRAY_DEPTH}")
        self.pos += 1
        items: List[Any] = []
        while True:
            self.skip_array_space()
            if self.peek() == "]":
                self.pos += 1
                return items
            items.append(self.array(depth + 1) if self.peek() == "[" else self.value())
            self.skip_array_space()
            c = self.peek()
            if c == ",":
                self.pos += 1
            elif c != "]":
                raise self.error(f"expected ',' or ']' in an array, found {c or 'the end'!r}")

    def skip_array_space(self) -> None:
        """Inside an array: blanks, newlines and comments."""
        while True:
            self.skip_blanks()
            c = self.peek()
            if c == "#":
                self.skip_comment()
            elif c in ("\n", "\r"):
                self.pos += 1
            else:
                return
