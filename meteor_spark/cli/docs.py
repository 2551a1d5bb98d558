"""Generated parts of the documentation: the Spark options table, the environment variables and the CLI reference,
rendered from the code.

``python -m meteor_spark.cli.docs`` rewrites the sections between ``<!-- BEGIN GENERATED: name -->`` and
``<!-- END GENERATED: name -->`` in the pages of ``docs/`` that ``PAGES`` names; ``tests/test_docs.py`` fails when
one is out of date. Each section lives in exactly one page, so a reader never finds two copies that disagree.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The page (relative to the checkout) that holds each generated section.
PAGES: dict[str, str] = {
    "options": "docs/spark.md",
    "environment": "docs/configuration.md",
    "cli": "docs/cli.md",
}
#: The command that rewrites every generated section (named by the tests that fail when one is stale).
REGENERATE = "python -m meteor_spark.cli.docs"
#: Help text is wrapped to this width so the generated reference does not depend on the terminal.
HELP_COLUMNS = 110


def options_table() -> str:
    """The ``format("meteor")`` options as a Markdown table (from ``meteor_spark.spark.options.OPTION_TABLE``)."""
    from meteor_spark.spark.options import describe_options

    lines = ["| option | applies to | type | default | meaning |", "|---|---|---|---|---|"]
    for name, applies_to, kind, default, meaning in describe_options():
        cells = [f"`{name}`", applies_to, kind, default, meaning]
        lines.append("| " + " | ".join(cell.replace("|", "\\|").replace("\n", " ") for cell in cells) + " |")
    return "\n".join(lines)


def environment_table() -> str:
    """The environment variables the tools read, as a Markdown table (from ``meteor_spark.config``)."""
    from meteor_spark.config import CONFIG_ENV, ENV_VARS

    lines = ["| variable | sets |", "|---|---|"]
    lines.append(f"| `{CONFIG_ENV}` | the TOML file to read when `--config` is not given |")
    lines += [f"| `{variable}` | `{option}` |" for variable, option in ENV_VARS.items()]
    return "\n".join(lines)


def cli_reference() -> str:
    """``meteor --help`` and every subcommand's ``--help``, as Markdown (from the real parser)."""
    from meteor_spark.cli.main import build_parser

    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(HELP_COLUMNS)
    try:
        parser = build_parser()
        sections = []
        for path, sub in _walk(parser, ("meteor",)):
            title = " ".join(path)
            text = sub.format_help().rstrip()
            sections.append(f"### `{title}`\n\n```text\n{text}\n```")
        return "\n\n".join(sections)
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous


def _walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...]
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if path[1:] and path[-1] == "bench" and name != "all":
                    continue  # bench areas hand their flags to the area's own parser; documented under `meteor bench`
                yield from _walk(sub, path + (name,))


GENERATORS: dict[str, Callable[[], str]] = {
    "options": options_table,
    "environment": environment_table,
    "cli": cli_reference,
}

_SECTION = re.compile(
    r"(<!-- BEGIN GENERATED: (?P<name>[a-z]+) -->)(?P<body>.*?)(<!-- END GENERATED: (?P=name) -->)", re.DOTALL
)


def render(text: str) -> str:
    """``text`` with every generated section replaced by its current rendering."""

    def replace(match: re.Match[str]) -> str:
        generator = GENERATORS[match.group("name")]
        return f"{match.group(1)}\n{generator()}\n{match.group(4)}"

    return _SECTION.sub(replace, text)


def sections(text: str) -> dict[str, str]:
    """Name -> body of the generated sections found in ``text``."""
    return {m.group("name"): m.group("body").strip("\n") for m in _SECTION.finditer(text)}


def page(name: str) -> Path:
    """The file that holds the generated section ``name``."""
    return ROOT / PAGES[name]


def stale_pages() -> list[str]:
    """The pages (relative paths) whose generated sections differ from what the code renders now."""
    return [relative for relative in sorted(set(PAGES.values())) if render(_read(relative)) != _read(relative)]


def _read(relative: str) -> str:
    return (ROOT / relative).read_text(encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """Rewrite the generated sections of the docs pages in place (``--check``: only report whether they are current)."""
    parser = argparse.ArgumentParser(prog=REGENERATE, description=main.__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 when a page is out of date")
    args = parser.parse_args(argv)
    stale = stale_pages()
    if args.check:
        for relative in stale:
            sys.stderr.write(f"{relative} is out of date: run `{REGENERATE}`\n")
        return 1 if stale else 0
    for relative in stale:
        (ROOT / relative).write_text(render(_read(relative)), encoding="utf-8")
        sys.stdout.write(f"{relative} updated\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
