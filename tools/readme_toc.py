"""Write the README's table of contents (its ``##`` sections) between its toc markers.

Run ``python tools/readme_toc.py`` after adding or renaming a section;
``tests/test_readme.py`` fails while the table and the sections disagree.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
START, END = "<!-- toc -->", "<!-- /toc -->"


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return "#" + text.replace(" ", "-")


def headings(text: str) -> list[tuple[int, str]]:
    """The ``##`` and ``###`` headings outside code blocks, in order, with their depth."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith(("## ", "### ")):
            marks, title = line.split(" ", 1)
            out.append((len(marks) - 2, title.strip()))
    return out


def table(text: str) -> str:
    """The table of contents of ``text``: its sections after the table, subsections indented."""
    after = text.split(END, 1)[1] if END in text else text
    lines = [f"{'  ' * depth}- [{h}]({anchor(h)})" for depth, h in headings(after)]
    return "\n".join([START, *lines, END])


def current(text: str) -> str | None:
    """The table between the markers, or None without them."""
    match = re.search(re.escape(START) + r".*?" + re.escape(END), text, flags=re.S)
    return match.group(0) if match else None


def main() -> int:
    text = README.read_text()
    old = current(text)
    if old is None:
        print(f"{README}: no {START} ... {END} markers", file=sys.stderr)
        return 1
    README.write_text(text.replace(old, table(text)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
