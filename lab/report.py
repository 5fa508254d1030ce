"""What a scenario hands back: tables for the terminal, figures for --out, data for JSON.

Keeping results in one plain structure lets the CLI print, save and plot every scenario the
same way, and lets `lab demo` print three scenarios' tables one after another.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells) -> None:
        self.rows.append(list(cells))

    def render(self) -> str:
        cells = [[fmt_cell(c) for c in row] for row in self.rows]
        widths = [len(h) for h in self.columns]
        for row in cells:
            for i, c in enumerate(row):
                widths[i] = max(widths[i], len(c))
        numeric = [i > 0 and all(_is_number(r[i]) for r in self.rows
                                 if i < len(r) and r[i] not in (None, "", "-"))
                   for i in range(len(self.columns))]

        def line(row):
            out = []
            for i, c in enumerate(row):
                out.append(c.rjust(widths[i]) if numeric[i] else c.ljust(widths[i]))
            return "  ".join(out).rstrip()
        text = [self.title, line(self.columns), line(["-" * w for w in widths])]
        text += [line(r) for r in cells]
        text += self.notes
        return "\n".join(text)

    def markdown(self) -> str:
        """The same table for docs/lab.md (--out writes it next to the JSON)."""
        def cell(c):
            return fmt_cell(c).replace("|", "\\|")
        lines = [f"**{self.title}**", "", "| " + " | ".join(self.columns) + " |",
                 "|" + "|".join("---" for _ in self.columns) + "|"]
        lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in self.rows]
        if self.notes:
            lines += [""] + [f"- {n}" for n in self.notes]
        return "\n".join(lines)


def _is_number(v) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, (int, float)):
        return True
    return isinstance(v, str) and bool(_NUMERIC.match(v.strip()))


_NUMERIC = re.compile(r"^[+\-~<>]?[\d,.]+\s?(%|ms|s|x)?\*?$")


def fmt_cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if abs(v) >= 100:
            return f"{v:,.0f}"
        if abs(v) >= 10:
            return f"{v:,.1f}"
        return f"{v:,.2f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def pct_change(new, old) -> str | None:
    """'+33 %' style change of new over old (None when either is missing)."""
    if new is None or old in (None, 0):
        return None
    return f"{(new / old - 1) * 100:+.0f} %"


@dataclass
class Report:
    scenario: str
    title: str
    settings: dict
    tables: list[Table] = field(default_factory=list)
    figures: list = field(default_factory=list)   # lab.svg.Figure
    data: dict = field(default_factory=dict)      # everything measured, for JSON
    skipped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    wall_seconds: float | None = None

    def render(self) -> str:
        parts = [f"== {self.scenario}: {self.title}"]
        for t in self.tables:
            parts.append(t.render())
        for name, why in self.skipped.items():
            parts.append(f"skipped {name}: {why}")
        parts.extend(self.notes)
        return "\n\n".join(p for p in parts if p)

    def markdown(self) -> str:
        parts = [f"### {self.scenario}: {self.title}"]
        parts += [t.markdown() for t in self.tables]
        parts += [f"Skipped {name}: {why}" for name, why in self.skipped.items()]
        parts += [n.lstrip("=> ") for n in self.notes if n]
        return "\n\n".join(parts) + "\n"

    def to_json(self) -> dict:
        return {
            "scenario": self.scenario,
            "title": self.title,
            "settings": self.settings,
            "wall_seconds": self.wall_seconds,
            "skipped": self.skipped,
            "notes": self.notes,
            "tables": [{"title": t.title, "columns": t.columns, "rows": t.rows, "notes": t.notes}
                       for t in self.tables],
            "data": self.data,
        }

    @classmethod
    def from_json(cls, doc: dict) -> "Report":
        """The measured part of a saved report; the scenario's render() redraws the rest."""
        return cls(scenario=doc["scenario"], title=doc["title"], settings=doc["settings"],
                   data=doc.get("data", {}), skipped=doc.get("skipped", {}),
                   wall_seconds=doc.get("wall_seconds"))

    def save_json(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=2, default=str) + "\n")
