r"""A table's page as the server sends it: filtered by the DataTable's query, sorted, cut to one page.

A plan's operator table has a row per operator — Llama-3-8B's 1,728, 292 KB of JSON — and with
the DataTable's own ("native") paging, sorting and filtering every row crossed the wire and the
browser's table ingested them all, though it shows fifteen.  With ``page_action="custom"`` the
page sends its page number, its sort and its filter, and :func:`table_page` answers with that page:

.. math::

    \mathrm{page}(k) = \mathrm{sort}\bigl(\{r : q(r)\}\bigr)[k s : (k + 1) s], \qquad
    \mathrm{pages} = \lceil |\{r : q(r)\}| / s \rceil

The query ``q`` is what the DataTable writes from its filter row (`Dash's filtering syntax
<https://dash.plotly.com/datatable/filtering>`_): clauses ``{column} operator value`` joined by
``&&``.  A term typed alone in a text column's filter cell arrives as ``{column} contains term``.
The operators read: ``contains``, ``=`` / ``eq``, ``!=`` / ``ne``, ``<`` ``<=`` ``>`` ``>=`` (and
``lt`` ``le`` ``gt`` ``ge``), ``datestartswith``; each case-sensitive, as the DataTable's default,
or with an ``i`` / ``s`` prefix case-insensitive / sensitive (the filter row writes ``scontains``).
Values compare as numbers where both sides read as numbers (``10 > 9``), as text otherwise, except
that a cell which is no number never answers ``<`` … ``>=`` against one.  A clause this does not
read keeps no rows (a filter that cannot be applied must not look applied).

Example — two of three rows contain ``mm``, sorted by node descending, two a page::

    >>> rows = [{"node": "a", "op": "aten.mm"}, {"node": "b", "op": "aten.add"}, {"node": "c", "op": "aten.bmm"}]
    >>> table_page(rows, page=0, size=2, sort_by=[{"column_id": "node", "direction": "desc"}],
    ...            query='{op} contains "mm"')
    ([{'node': 'c', 'op': 'aten.bmm'}, {'node': 'a', 'op': 'aten.mm'}], 1)

It owns the query's reading and the page's cut; it must not build the rows (:mod:`.figures` does)
nor wire the table (:mod:`.callbacks` does).
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Row = Mapping[str, Any]

#: ``{column} operator value``: the column in braces, an operator word or symbol, the rest the value
_CLAUSE = re.compile(r"^\s*\{(?P<col>[^}]*)\}\s+(?P<op>[a-z]*[<>!=]+|[a-z]+)\s*(?P<value>.*?)\s*$", re.DOTALL)
_NAMED = {"eq": "=", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
_OPERATORS = frozenset(("contains", "datestartswith", *_COMPARE, *_NAMED))


def _unquoted(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'`":
        return value[1:-1].replace("\\" + value[0], value[0])
    return value


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _clause(text: str) -> Callable[[Row], bool]:
    """One clause of the query as a test of a row; a clause not read keeps no row."""
    m = _CLAUSE.match(text)
    if m is None:
        return lambda row: False
    col, op, value = m["col"], m["op"], _unquoted(m["value"])
    fold = False
    if op[0] in "is" and op[1:] in _OPERATORS:   # icontains, s=, ieq, …: case-insensitive / sensitive
        op, fold = op[1:], op[0] == "i"
    op = _NAMED.get(op, op)

    def cell(row: Row) -> str:
        v = row.get(col)
        return "" if v is None else str(v)

    if op in ("contains", "datestartswith"):
        want = value.lower() if fold else value
        match = str.__contains__ if op == "contains" else str.startswith
        return lambda row: match(cell(row).lower() if fold else cell(row), want)
    if op in _COMPARE:
        compare, want_num = _COMPARE[op], _number(value)

        def test(row: Row) -> bool:
            have = cell(row)
            have_num = _number(have)
            if want_num is not None and op not in ("=", "!="):   # "{n} > 9": a cell not a number is no answer
                return have_num is not None and compare(have_num, want_num)
            if want_num is not None and have_num is not None:
                return compare(have_num, want_num)   # "{n} = 10" holds for "10.0"
            return compare(have.lower(), value.lower()) if fold else compare(have, value)
        return test
    return lambda row: False


def _sort_key(column: str) -> Callable[[Row], tuple[int, float, str]]:
    """Numbers before text, numbers by value; an empty cell last (as the DataTable sorts)."""
    def key(row: Row) -> tuple[int, float, str]:
        v = row.get(column)
        text = "" if v is None else str(v)
        num = _number(text)
        if text == "":
            return (2, 0.0, "")
        return (0, num, "") if num is not None and not math.isnan(num) else (1, 0.0, text)
    return key


def table_page(rows: Sequence[Row], *, page: int | None, size: int,
               sort_by: Sequence[Mapping[str, str]] | None = None,
               query: str | None = None) -> tuple[list[Row], int]:
    """Page ``page`` (from 0) of ``size`` rows of ``rows`` filtered by ``query`` and sorted by
    ``sort_by`` (the DataTable's list, first key first), and how many pages there are.  A page past the
    last is the last (a filter that shrank the table leaves no empty page on show)."""
    kept = list(rows)
    for part in (query or "").split("&&"):
        if part.strip():
            test = _clause(part)
            kept = [r for r in kept if test(r)]
    for key in reversed(list(sort_by or ())):
        empty_last = _sort_key(key["column_id"])
        descending = key.get("direction") == "desc"
        filled = [r for r in kept if empty_last(r)[0] != 2]
        filled.sort(key=empty_last, reverse=descending)
        kept = filled + [r for r in kept if empty_last(r)[0] == 2]
    size = max(int(size), 1)
    pages = max(math.ceil(len(kept) / size), 1)
    first = min(max(int(page or 0), 0), pages - 1) * size
    return kept[first:first + size], pages
