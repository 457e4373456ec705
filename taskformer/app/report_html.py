"""report.html: the report's sections as a web page of its own, with real HTML tables.

The console draws tables with box-drawing characters in a fixed-width font, where a Chinese
character takes two cells; a browser lays out ``<table>`` cells instead, so columns line up
whatever the script. Rich's tables and texts become HTML elements, the styles of their text
(colour, bold) inline CSS; any other renderable is kept as the console prints it, in a ``<pre>``.
The page is one self-contained file: its plots are embedded, nothing is loaded from elsewhere.
"""
from __future__ import annotations

import html
import io
from collections.abc import Sequence

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from taskformer.plugins.sections import visible

STYLE = """
  body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Noto Sans", "Noto Sans CJK SC", sans-serif;
         color: #1d2330; background: #f5f7fb; margin: 0; }
  main { max-width: 72rem; margin: 2rem auto; padding: 0 1.25rem; }
  header h1 { font-size: 1.5rem; margin: 0 0 .2rem; }
  header p { margin: 0; color: #5f6b7d; }
  code { font: .9em ui-monospace, Menlo, Consolas, "Noto Sans Mono", monospace; }
  section { background: #fff; border: 1px solid #e2e6ee; border-radius: 12px; padding: 1rem 1.4rem;
            margin-top: 1.25rem; overflow-x: auto; }
  h2 { font-size: 1.05rem; margin: 0 0 .6rem; }
  table { border-collapse: collapse; font-size: .92rem; }
  th { text-align: left; font-weight: 600; color: #5f6b7d; border-bottom: 2px solid #e2e6ee; }
  th, td { padding: .3rem .9rem .3rem 0; vertical-align: top; }
  td { border-bottom: 1px solid #eef1f6; }
  td.number { text-align: right; font-variant-numeric: tabular-nums; }
  pre { margin: 0; font: .85rem ui-monospace, Menlo, Consolas, "Noto Sans Mono", monospace; white-space: pre-wrap; }
  figure { margin: 0 0 1rem; }
  figure img { max-width: 100%; }
  figcaption { color: #5f6b7d; font-size: .85rem; }
"""


def escaped(text) -> str:
    """Text for the page: HTML-escaped, its control characters visible (see :func:`visible`)."""
    return html.escape(visible(text))


def page(title: str, subtitle: str, sections: Sequence[tuple[str, object]], figures: list[tuple[str, str]]) -> str:
    """The whole page: a title, ``sections`` (title, rich renderable) in order, then ``figures``
    (name, PNG as base64)."""
    parts = [f"<section><h2>{escaped(name)}</h2>{element(renderable)}</section>" for name, renderable in sections]
    if figures:
        images = "".join(f'<figure><img alt="{escaped(name.rsplit(".", 1)[0])}" src="data:image/png;base64,{data}">'
                         f"<figcaption>{escaped(name)}</figcaption></figure>" for name, data in figures)
        parts.append(f"<section><h2>Figures</h2>{images}</section>")
    return (f'<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{escaped(title)}</title>\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n<style>{STYLE}</style>\n</head>\n'
            f"<body>\n<main>\n<header><h1>{escaped(title)}</h1><p>{escaped(subtitle)}</p></header>\n"
            + "\n".join(parts) + "\n</main>\n</body>\n</html>\n")


def element(renderable) -> str:
    """One renderable of a section as HTML."""
    if isinstance(renderable, Table):
        return table(renderable)
    if isinstance(renderable, Group):
        return "".join(element(r) for r in renderable.renderables)
    if isinstance(renderable, (str, Text)):
        return f'<p style="white-space: pre-wrap; margin: 0">{inline(renderable)}</p>'
    console = Console(record=True, width=110, markup=False, emoji=False, file=io.StringIO())
    console.print(renderable)
    return f"<pre>{escaped(console.export_text())}</pre>"


def table(t: Table) -> str:
    """A rich Table as an HTML table: its headers (when shown) and its cells, row by row. A column
    of numbers is right-aligned, digits of equal width, so that they compare at a glance."""
    columns = [list(column.cells) for column in t.columns]
    numeric = [all(_numeric(c) for c in column if _plain(c).strip()) and any(_plain(c).strip() for c in column)
               for column in columns]
    head = ("<thead><tr>" + "".join(f"<th>{inline(c.header)}</th>" for c in t.columns) + "</tr></thead>"
            if t.show_header and any(str(c.header) for c in t.columns) else "")
    rows = []
    for i in range(t.row_count):
        cells = [(column[i] if i < len(column) else "", number) for column, number in zip(columns, numeric)]
        rows.append("<tr>" + "".join(f"<td{' class=number' if number else ''}>{inline(c)}</td>" for c, number in cells)
                    + "</tr>")
    return f"<table>{head}<tbody>{''.join(rows)}</tbody></table>"


def inline(cell) -> str:
    """A cell's text with its styles: a string as it is (never read as markup), a Text span by span."""
    if isinstance(cell, str):
        return escaped(cell)
    if not isinstance(cell, Text):
        return element(cell)
    out = []
    for part in cell.render(Console(markup=False, emoji=False, file=io.StringIO()), end=""):
        css = part.style.get_html_style() if part.style else ""
        text = escaped(part.text)
        out.append(f'<span style="{css}">{text}</span>' if css else text)
    return "".join(out)


def _plain(cell) -> str:
    return cell.plain if isinstance(cell, Text) else cell if isinstance(cell, str) else ""


def _numeric(cell) -> bool:
    text = _plain(cell).strip().replace(",", "").lstrip("-")
    return text.replace(".", "", 1).isdigit()
