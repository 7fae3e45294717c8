#!/usr/bin/env python3
"""Writes each role's variable table into its README.md from meta/argument_specs.yml (name, type, default,
description), between the two marker lines below, so the README says what ansible-doc says.

    scripts/role_variables.py            # rewrite the table of each README that has one
    scripts/role_variables.py --add      # also append one to each README that has none yet
    scripts/role_variables.py --check    # exit 1 naming each README whose table is stale (a unit test)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
BEGIN = "<!-- variables: written by scripts/role_variables.py from meta/argument_specs.yml; do not edit -->"
END = "<!-- end of variables -->"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def variables_table(spec_text: str) -> str:
    """The markdown table of a role's main entry point options."""
    options = yaml.safe_load(spec_text)["argument_specs"]["main"]["options"]
    rows = ["| variable | type | default | description |", "| --- | --- | --- | --- |"]
    for name, option in options.items():
        default = (
            f"`{_cell(json.dumps(option['default'], ensure_ascii=False))}`" if "default" in option else ""
        )
        description = option.get("description", "")
        if isinstance(description, list):
            description = " ".join(description)
        rows.append(f"| `{name}` | {option.get('type', 'str')} | {default} | {_cell(description)} |")
    return "\n".join(rows)


def with_table(readme: str, table: str) -> str:
    """The README with its table replaced (or appended under `## Variables` when it has none yet)."""
    block = f"{BEGIN}\n{table}\n{END}"
    if BEGIN in readme and END in readme:
        head, rest = readme.split(BEGIN, 1)
        return head + block + rest.split(END, 1)[1]
    return readme.rstrip("\n") + f"\n\n## Variables\n\n{block}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a table is stale")
    parser.add_argument("--add", action="store_true", help="append a table to READMEs that have none")
    args = parser.parse_args(argv)
    stale = []
    for role in sorted((ROOT / "roles").iterdir()):
        readme, spec = role / "README.md", role / "meta" / "argument_specs.yml"
        if not (readme.is_file() and spec.is_file()):
            continue
        text = readme.read_text(encoding="utf-8")
        if BEGIN not in text and not args.add:
            continue
        wanted = with_table(text, variables_table(spec.read_text(encoding="utf-8")))
        if wanted != text:
            stale.append(str(readme.relative_to(ROOT)))
            if not args.check:
                readme.write_text(wanted, encoding="utf-8")
    if stale:
        verb = "stale (run scripts/role_variables.py)" if args.check else "rewritten"
        print(f"role_variables: {verb}: {', '.join(stale)}", file=sys.stderr)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
