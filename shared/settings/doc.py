"""The README's configuration table, rendered from the settings' declarations.

    python -m splatq.shared.settings.doc           # rewrite README.md's table in place
    python -m splatq.shared.settings.doc --check   # exit 1 when README.md's table is stale

tests/shared/test_settings_declared.py fails while README.md differs from `render()`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from splatq.shared.settings.declare import Declaration, declared, default_of
from splatq.shared.settings.model import Settings

BEGIN = (
    "<!-- settings table: generated from shared/settings/ by"
    " `python -m splatq.shared.settings.doc`; edit the declarations, not this table -->"
)
END = "<!-- end of the generated settings table -->"
README = Path(__file__).resolve().parents[2] / "README.md"


def shown_default(decl: Declaration, value: Any) -> str:
    """A default as the table shows it."""
    if decl.shown:
        return decl.shown
    if isinstance(value, bool):
        return "1 (on)" if value else "0 (off)"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Mapping):
        text = ",".join(f"{k}={v}" for k, v in value.items())
    elif isinstance(value, frozenset):
        text = ",".join(sorted(value))
    elif isinstance(value, tuple):
        text = ",".join(str(v) for v in value)
    else:
        text = str(value)
    return f"`{text}`" if text else "—"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    """The markdown between the markers: a sub-table per group, in declaration order."""
    groups: dict[str, list[str]] = {}
    for f, decl in declared(Settings):
        default = _cell(shown_default(decl, default_of(f)))
        groups.setdefault(decl.group.title, []).append(
            f"| `{decl.env}` | {default} | {_cell(decl.doc)} |"
        )
    lines: list[str] = []
    for title, rows in groups.items():
        lines += [f"### {title}", "", "| variable | default | meaning |", "|---|---|---|"]
        lines += [*rows, ""]
    return "\n".join(lines)


def with_table(readme: str) -> str:
    """`readme` with the text between its markers replaced by `render()`."""
    head, begin, rest = readme.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"README.md lacks the markers {BEGIN!r} ... {END!r}")
    return f"{head}{BEGIN}\n\n{render()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if the table is stale")
    parser.add_argument("--readme", type=Path, default=README)
    args = parser.parse_args(argv)
    text = args.readme.read_text(encoding="utf-8")
    wanted = with_table(text)
    if args.check:
        if wanted != text:
            stale = f"{args.readme}: the settings table is stale;"
            print(f"{stale} run python -m splatq.shared.settings.doc", file=sys.stderr)
            return 1
        return 0
    if wanted != text:
        args.readme.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
