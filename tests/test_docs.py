"""The README and the docs pages stay true to the code: generated tables are current, examples run, commands parse,
and the docs build as a site with no warning."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from meteor_spark.cli import docs
from meteor_spark.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
#: Every page of the docs site, by file name.
PAGES = {path.name: path.read_text() for path in sorted(DOCS.glob("*.md"))}
#: The README is the front page: what the product is for, two set-up commands, a tour, links. Reference goes to docs/.
README_MAX_LINES = 300


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.DOTALL)


def _bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, re.DOTALL)


def _section(text: str, heading: str) -> str:
    """The body of the Markdown section ``heading`` (a whole heading line), up to the next heading of its level."""
    start = text.index(heading + "\n") + len(heading)
    level = heading.split(" ", 1)[0]
    following = re.search(rf"^{level} ", text[start:], re.MULTILINE)
    return text[start : start + following.start()] if following else text[start:]


def test_generated_sections_are_current() -> None:
    assert "GENERATED:" not in README, "generated sections live in docs/ (meteor_spark.cli.docs.PAGES), not the README"
    for relative in sorted(set(docs.PAGES.values())):
        text = (ROOT / relative).read_text()
        found = docs.sections(text)
        expected = {name for name, page in docs.PAGES.items() if page == relative}
        assert set(found) == expected, f"{relative} lost a generated section marker (has {sorted(found)})"
        for name in expected:
            assert found[name] == docs.GENERATORS[name](), (
                f"{relative}: generated section {name!r} is stale: run `{docs.REGENERATE}`"
            )
    for name, page in PAGES.items():
        if f"docs/{name}" not in docs.PAGES.values():
            assert "GENERATED:" not in page, f"docs/{name}: a generated-section marker nobody renders"


def test_regenerating_reports_stale_pages_and_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--check`` names every stale page and the command that rewrites it; a run without it rewrites the page."""
    for relative in set(docs.PAGES.values()):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text((ROOT / relative).read_text())
    spark_page = tmp_path / docs.PAGES["options"]
    spark_page.write_text(spark_page.read_text().replace("| `stream` |", "| `streem` |"))
    monkeypatch.setattr(docs, "ROOT", tmp_path)
    assert docs.stale_pages() == [docs.PAGES["options"]]
    assert docs.main(["--check"]) == 1
    assert docs.main([]) == 0
    assert docs.stale_pages() == [] and spark_page.read_text() == (ROOT / docs.PAGES["options"]).read_text()


def test_options_table_lists_every_connector_option() -> None:
    from meteor_spark.spark.option_table import OPTION_TABLE

    table = docs.sections(docs.page("options").read_text())["options"]
    for option in OPTION_TABLE:
        assert f"| `{option.name}` |" in table


def test_the_two_setup_commands_are_the_ones_dev_supports() -> None:
    assert "bash .ci/dev demo" in README and "bash .ci/dev test" in README
    dev = (ROOT / ".ci" / "dev").read_text()
    assert 'demo) exec "$VENV/bin/meteor" demo' in dev
    assert 'METEOR_TEST_GRID=$1 "$VENV/bin/python" -m pytest "${@:2}"' in dev
    assert "bash .ci/dev test" in (ROOT / ".ci" / "run").read_text()


def test_readme_is_a_front_page_that_links_every_docs_page() -> None:
    assert len(README.splitlines()) < README_MAX_LINES, "move reference material from README.md into docs/"
    where_next = _section(README, "## Where to go next")
    missing = [name for name in PAGES if f"(docs/{name})" not in where_next and name != "index.md"]
    assert missing == [], f"README's 'Where to go next' does not link {missing}"
    assert "docs/python.md" in README and "docs/spark.md" in README and "docs/cli.md" in README


def test_every_meteor_command_in_the_readme_and_the_docs_parses() -> None:
    parser = build_parser()

    def commands(text: str) -> list[list[str]]:
        found = []
        for block in _bash_blocks(text):
            for line in block.splitlines():
                line = line.split("#", 1)[0].strip()
                if "meteor " not in line or line.startswith(("bash", ".venv")):
                    continue
                found.append(shlex.split(line[line.index("meteor ") :])[1:])
        return found

    readme_commands = commands(README)
    assert len(readme_commands) >= 8
    for words in readme_commands + [words for page in PAGES.values() for words in commands(page)]:
        args, extra = parser.parse_known_args(words)
        assert not extra or getattr(args, "extra_args", False), words


def test_the_spark_example_checkpoints_into_a_fresh_directory() -> None:
    """A fixed checkpoint path resumes an old query's offsets against a new grid on the second run."""
    blocks = _python_blocks(README) + [block for page in PAGES.values() for block in _python_blocks(page)]
    spark_blocks = [block for block in blocks if "checkpointLocation" in block]
    assert spark_blocks
    for block in spark_blocks:
        assert re.search(r'checkpointLocation",\s*checkpoint\)', block) and "tempfile.mkdtemp(" in block, block


def test_the_spark_page_shows_the_readme_tour_from_the_readme_itself() -> None:
    """docs/spark.md includes the README's tour code (one copy, run by the README test) through snippet sections."""
    for name in ("tour-python", "tour-spark"):
        assert f'--8<-- "README.md:{name}"' in PAGES["spark.md"]
        start, end = README.index(f"--8<-- [start:{name}]"), README.index(f"--8<-- [end:{name}]")
        assert len(_python_blocks(README[start:end])) == 1, name


def test_deploying_doc_is_linked_and_its_commands_parse() -> None:
    deploying = PAGES["deploying.md"]
    assert "(docs/deploying.md)" in _section(README, "## Where to go next")
    assert "docs/deploying.md" not in deploying and "## In short: running on a cluster" in deploying
    parser = build_parser()
    commands = [
        shlex.split(line.split("#", 1)[0].strip())
        for block in _bash_blocks(deploying) + _bash_blocks(README)
        for line in block.splitlines()
        if line.strip().startswith("meteor ")
    ]
    assert any(words[:3] == ["meteor", "streams", "create"] for words in commands)
    for words in commands:
        parser.parse_args(words[1:])  # exits (fails the test) on a flag that does not exist


def test_no_help_text_or_message_points_at_a_readme_section() -> None:
    """Reference moved from the README to docs/: the package's help and errors name the page instead."""
    offenders = []
    for path in sorted((ROOT / "meteor_spark").rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\bREADME\b", line) and "Meteor README" not in line:
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []


def test_docs_site_builds_strictly_without_the_network(tmp_path: Path) -> None:
    """``mkdocs build --strict``: no warning (broken link or anchor, a page missing from the nav, a snippet not
    found), and nothing fetched: the proxies point at a closed local port, so a plugin that downloads would fail."""
    closed = "http://127.0.0.1:9"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "HTTP_PROXY": closed, "HTTPS_PROXY": closed, "NO_PROXY": ""}
    env.update({"http_proxy": closed, "https_proxy": closed, "no_proxy": ""})
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    warnings = [line for line in output.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert done.returncode == 0 and warnings == [], output[-6000:]
    for name in PAGES:
        built = site / ("index.html" if name == "index.md" else f"{name.removesuffix('.md')}/index.html")
        assert built.is_file(), f"docs/{name} was not built"
    spark_html = (site / "spark" / "index.html").read_text()
    assert "spark_conf" in spark_html and "--8&lt;--" not in spark_html, "the README's tour was not included"


def _run_as_script(tmp_path: Path, name: str, blocks: list[str], checks: str, timeout: float) -> str:
    """``blocks`` saved as one script and run by a fresh interpreter outside the checkout, as a reader who copies
    them would: nothing imported or set up by the test run can help them (no ``PYSPARK_PYTHON``, no virtualenv on
    the PATH, no active SparkSession)."""
    script = tmp_path / f"{name}.py"
    script.write_text("\n".join(blocks) + checks)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    # a virtualenv that is not activated: the python3 on the PATH is not the one that has meteor-spark
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done.stdout


def test_architecture_doc_names_every_module() -> None:
    architecture = (ROOT / "docs" / "architecture.md").read_text()
    package = ROOT / "meteor_spark"
    missing = []
    for path in sorted(package.glob("*.py")) + sorted((package / "spark").glob("*.py")):
        if path.name != "__init__.py" and path.name not in architecture:
            missing.append(str(path.relative_to(ROOT)))
    for sub in ("server", "spark", "bench", "cli"):
        if f"{sub}/" not in architecture:
            missing.append(sub + "/")
    assert missing == [], f"docs/architecture.md does not mention {missing}"


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_readme_python_examples_run_as_a_script_in_a_fresh_interpreter(tmp_path: Path) -> None:
    """The README's Python blocks, in order, then the metrics page's (which continues them: its grid and its Spark
    query), as one script in a fresh interpreter; the publish/subscribe example starts its own embedded grid and the
    Spark example its own local session."""
    blocks = _python_blocks(README)
    assert len(blocks) >= 2
    metrics_blocks = _python_blocks(PAGES["metrics.md"])
    assert metrics_blocks
    parts = [f"# README.md python block {number + 1}\n{block}" for number, block in enumerate(blocks)]
    parts += [f"# docs/metrics.md python block {number + 1}\n{block}" for number, block in enumerate(metrics_blocks)]
    checks = (
        "\nassert len(seen) == 11, seen\n"
        "assert pages_df.count() >= 11\n"
        "spark.stop()\n"
        "grid.close()\n"
        "print('README examples: ok')\n"
    )
    out = _run_as_script(tmp_path, "readme_examples", parts, checks, timeout=400)
    assert "README examples: ok" in out, out[-3000:]


@pytest.mark.timeout(180)
def test_python_page_examples_run_as_a_script_in_a_fresh_interpreter(tmp_path: Path) -> None:
    """docs/python.md's blocks, in order, as one script: the first starts its own embedded grid, the others use it
    (publish/subscribe, serializers, request/reply, a shared group)."""
    blocks = _python_blocks(PAGES["python.md"])
    assert len(blocks) >= 4
    parts = [f"# docs/python.md python block {number + 1}\n{block}" for number, block in enumerate(blocks)]
    checks = (
        "\nassert len(seen) == 11, seen\n"
        "assert sorted(order.value['id'] for order in orders) == [0, 1, 2, 3], orders\n"
        "assert reply.value == b'SKU-42' and replies == [b'SKU-0', b'SKU-1', b'SKU-2'], (reply, replies)\n"
        "assert sorted(done) == [f'task-{n}'.encode() for n in range(6)], done\n"
        "grid.close()\n"
        "print('python page examples: ok')\n"
    )
    out = _run_as_script(tmp_path, "python_page_examples", parts, checks, timeout=160)
    assert "python page examples: ok" in out, out[-3000:]
