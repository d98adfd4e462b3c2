"""Evidence pages: tables and figures as Markdown and as one self-contained-ish HTML page.

Theory of operation: every command that produces evidence (``report``, ``sweep``, the
demo) describes it once, as a list of :class:`Section` — a heading, a few paragraphs,
tables, and PNG figures — and renders it twice: Markdown (for docs and reviews) and
HTML (``index.html``, which shows the PNGs beside it by relative path, so the output
directory can be copied or served as it is).  Cells are plain strings, formatted by the
caller; rendering only escapes them.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Table:
    headers: Sequence[str]
    rows: Sequence[Sequence[str]]
    caption: str = ""


@dataclass(frozen=True)
class Figure:
    path: str
    """Relative to the page."""
    caption: str


@dataclass(frozen=True)
class Section:
    heading: str
    paragraphs: Sequence[str] = ()
    tables: Sequence[Table] = ()
    figures: Sequence[Figure] = ()
    links: Sequence[tuple[str, str]] = field(default_factory=tuple)
    """(text, relative path) pairs: the data files behind the section."""


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(table: Table) -> str:
    lines = []
    if table.caption:
        lines += [table.caption, ""]
    lines.append("| " + " | ".join(_md_cell(h) for h in table.headers) + " |")
    lines.append("|" + "---|" * len(table.headers))
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in table.rows]
    return "\n".join(lines)


def markdown(title: str, sections: Sequence[Section], *, level: int = 1) -> str:
    out = [f"{'#' * level} {title}", ""]
    for section in sections:
        out += [f"{'#' * (level + 1)} {section.heading}", ""]
        for paragraph in section.paragraphs:
            out += [paragraph, ""]
        for table in section.tables:
            out += [markdown_table(table), ""]
        for figure in section.figures:
            out += [f"![{figure.caption}]({figure.path})", ""]
        if section.links:
            out += [", ".join(f"[{text}]({path})" for text, path in section.links), ""]
    return "\n".join(out)


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 72rem; padding: 0 1rem;
       color: #222; }
table { border-collapse: collapse; margin: 0.5rem 0 1.5rem; font-size: 0.9rem; }
th, td { border: 1px solid #ccc; padding: 0.25rem 0.6rem; text-align: right; }
th { background: #f3f3f3; }
td:first-child, th:first-child { text-align: left; }
figure { margin: 1rem 0 2rem; }
figure img { max-width: 100%; border: 1px solid #eee; }
figcaption, caption { color: #555; font-size: 0.9rem; text-align: left; }
nav a { margin-right: 1rem; }
"""


def _html_table(table: Table) -> str:
    caption = f"<caption>{html.escape(table.caption)}</caption>" if table.caption else ""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in table.headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in table.rows
    )
    return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _anchor(heading: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in heading.lower()).strip("-")


def html_page(title: str, sections: Sequence[Section]) -> str:
    nav = " ".join(
        f'<a href="#{_anchor(s.heading)}">{html.escape(s.heading)}</a>' for s in sections
    )
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1><nav>{nav}</nav>",
    ]
    for section in sections:
        parts.append(f'<h2 id="{_anchor(section.heading)}">{html.escape(section.heading)}</h2>')
        parts += [f"<p>{html.escape(p)}</p>" for p in section.paragraphs]
        parts += [_html_table(t) for t in section.tables]
        parts += [
            f'<figure><img src="{html.escape(f.path)}" alt="{html.escape(f.caption)}">'
            f"<figcaption>{html.escape(f.caption)}</figcaption></figure>"
            for f in section.figures
        ]
        if section.links:
            links = ", ".join(
                f'<a href="{html.escape(path)}">{html.escape(text)}</a>'
                for text, path in section.links
            )
            parts.append(f"<p>Data: {links}</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_page(out: Path, title: str, sections: Sequence[Section]) -> Path:
    """Write ``out/index.html``; return its path."""
    out.mkdir(parents=True, exist_ok=True)
    target = out / "index.html"
    target.write_text(html_page(title, sections))
    return target


# -- cells --------------------------------------------------------------------------------


def ms(value: float | None) -> str:
    """A duration in milliseconds, in the unit that reads best."""
    if value is None:
        return "—"
    if value < 1_000:
        return f"{value:,.0f} ms"
    return f"{value / 1_000:,.3g} s" if value < 100_000 else f"{value / 1_000:,.0f} s"


def size(value: float | None) -> str:
    if value is None:
        return "—"
    for unit, scale in (("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:,.3g} {unit}"
    return f"{value:,.0f} B"


def rate(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}"


def share(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def count(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"
