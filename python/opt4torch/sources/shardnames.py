"""Shard names as WebDataset users write them: ``"shard-{000000..000147}.tar"``,
``"a.tar::b.tar"``, ``"shards/*.tar"``. One expansion, used by
:class:`opt4torch.TarShards` (files) and :class:`opt4torch.S3TarShards`
(objects, whose "does it exist" and "what matches" come from a listing).

WebDataset expands a string: it splits it at ``::`` and expands each part
with the ``braceexpand`` package (bash's brace expansion); a list it takes as
it is. Here the same, written out (``braceexpand`` is not a dependency), and
two additions that cannot change what a WebDataset spelling means:

* a name (a part) that exists as it is written is taken as it is (a file
  really named ``a{1,2}.tar``), before any expansion;
* a name that does not exist and holds ``*``, ``?`` or ``[`` is a glob,
  matched in sorted order (what ``sorted(glob.glob(...))`` in a WebDataset
  script gives); elements of a list are expanded the same way.

A pattern that matches nothing, or one of whose names is not there, is an
error naming the pattern and the missing names (WebDataset finds out only
when it reaches that shard).

May touch: nothing but the names and, for globs, the file system's listing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from itertools import product

__all__ = ["expand_braces", "expand_shards", "has_glob"]

# braceexpand's ranges: {1..10}, {-3..3}, {000..147..2}; {a..z}, {A..z..3}.
_INT_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.-?(\d+))?$")
_CHAR_RANGE = re.compile(r"^([A-Za-z])\.\.([A-Za-z])(?:\.\.-?(\d+))?$")
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_ESCAPED = re.compile(r"\\(.)")
_GLOB = re.compile(r"[*?[]")

#: Expansions larger than this are refused: a typo such as {0..99999999}
#: would otherwise build a list of a hundred million names before failing.
MAX_NAMES = 10_000_000


def has_glob(name: str) -> bool:
    """Whether ``name`` holds a glob character (``*``, ``?``, ``[``)."""
    return _GLOB.search(name) is not None


def expand_braces(pattern: str) -> list[str]:
    """``pattern`` expanded as ``braceexpand.braceexpand`` expands it (the
    package WebDataset uses): ``{a,b}`` alternatives, nested; ``{1..3}``,
    ``{3..1}``, ``{0..10..5}`` integer ranges, every number zero-padded to
    the wider bound's width when a bound has a leading zero (``{07..10}``:
    07 08 09 10); ``{a..e}`` letter ranges; a brace with neither a comma nor
    a range is kept as written (``{x}``); a backslash makes the next
    character plain and is dropped. Names come out leftmost group slowest.
    Unbalanced braces raise ``ValueError`` naming the pattern."""
    parts = _parse_pattern(pattern, pattern)
    total = 1
    for options in parts:
        total *= len(options)
        if total > MAX_NAMES:
            raise ValueError(f"the pattern {pattern!r} expands to more than {MAX_NAMES:,} names: "
                             "check its ranges")
    return [_ESCAPED.sub(r"\1", "".join(t)) for t in product(*parts)]


def _parse_pattern(text: str, whole: str) -> list[list[str]]:
    """Literal runs and brace groups at depth 0, each as its list of
    alternatives (escapes kept: they are removed once, at the end)."""
    parts: list[list[str]] = []
    start = pos = depth = 0
    while pos < len(text):
        c = text[pos]
        if c == "\\":
            pos += 2
            continue
        if c == "{":
            if depth == 0 and pos > start:
                parts.append([text[start:pos]])
                start = pos
            depth += 1
        elif c == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                parts.append(_parse_group(text[start + 1:pos], whole))
                start = pos + 1
        elif c == "}":
            raise ValueError(f"unbalanced braces in the shard pattern {whole!r}: a '}}' closes nothing "
                             "(write \\} for a brace in a name)")
        pos += 1
    if depth:
        raise ValueError(f"unbalanced braces in the shard pattern {whole!r}: a '{{' is never closed "
                         "(write \\{ for a brace in a name)")
    if start < len(text):
        parts.append([text[start:]])
    return parts


def _parse_group(body: str, whole: str) -> list[str]:
    m = _INT_RANGE.match(body)
    if m:
        return _int_range(*m.groups())
    m = _CHAR_RANGE.match(body)
    if m:
        return _char_range(*m.groups())
    items: list[str] = []
    start = pos = depth = 0
    while pos < len(body):
        c = body[pos]
        if c == "\\":
            pos += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            items.append(body[start:pos])
            start = pos + 1
        pos += 1
    if not items:
        return ["{" + body + "}"]  # not a list and not a range: braceexpand keeps it as written
    items.append(body[start:])
    out: list[str] = []
    for item in items:
        out.extend("".join(t) for t in product(*_parse_pattern(item, whole)))
    return out


def _int_range(first: str, last: str, step: str | None) -> list[str]:
    padded = any(s.lstrip("-").startswith("0") for s in (first, last) if s.lstrip("-") != "0")
    width = max(len(first), len(last)) if padded else 0
    a, b, k = int(first), int(last), int(step) if step and int(step) else 1
    if abs(b - a) // k + 1 > MAX_NAMES:
        raise ValueError(f"the range {{{first}..{last}}} has more than {MAX_NAMES:,} names")
    numbers = range(a, b + 1, k) if a <= b else range(a, b - 1, -k)
    return [f"{n:0{width}d}" for n in numbers]


def _char_range(first: str, last: str, step: str | None) -> list[str]:
    a, b, k = _ALPHABET.index(first), _ALPHABET.index(last), int(step) if step and int(step) else 1
    return list(_ALPHABET[a:b + 1:k] if a <= b else _ALPHABET[a:(b - 1 if b else None):-k])


def expand_shards(spec: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *,
                  exists: Callable[[str], bool], match: Callable[[str], list[str]],
                  what: str = "tar shard") -> list[str]:
    """The shards ``spec`` names, in order (see the module's docstring for
    the rules). ``exists(name)`` says whether a name is there as written;
    ``match(glob)`` gives what a glob matches, sorted. Raises
    ``FileNotFoundError`` naming a pattern that matches nothing, or the
    names of a pattern that are not there, and ``ValueError`` for
    unbalanced braces. A plain name (no braces, no glob) is returned
    unchecked: the reader that opens it says that it is missing."""
    if isinstance(spec, (str, os.PathLike)):
        parts = os.fspath(spec).split("::")
    else:
        parts = [os.fspath(p) for p in spec]
    names: list[str] = []
    for part in parts:
        if exists(part):
            names.append(part)
            continue
        expanded = expand_braces(part)
        if expanded == [part] and not has_glob(part):
            names.append(part)  # a plain name: the reader says that it is not there, in its own words
            continue
        missing: list[str] = []
        for name in expanded:
            if exists(name):
                names.append(name)
            elif has_glob(name):
                found = match(name)
                if not found:
                    missing.append(name)
                names.extend(found)
            else:
                missing.append(name)
        if missing:
            raise FileNotFoundError(_missing_message(part, expanded, missing, what))
    return names


def _missing_message(pattern: str, expanded: list[str], missing: list[str], what: str) -> str:
    if expanded == [pattern]:
        return f"the {what} pattern {pattern!r} matches nothing"
    shown = ", ".join(repr(m) for m in missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    if len(missing) == len(expanded):
        return (f"the {what} pattern {pattern!r} matches nothing: it expands to {len(expanded)} "
                f"name{'s' if len(expanded) != 1 else ''}, and none is there ({shown})")
    return (f"the {what} pattern {pattern!r} expands to {len(expanded)} names, and {len(missing)} of them "
            f"{'is' if len(missing) == 1 else 'are'} not there: {shown}")
