"""The README and docs stay true to the code: generated tables are current, examples run, commands parse."""

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


def test_generated_sections_are_current() -> None:
    found = docs.sections(README)
    assert set(found) == set(docs.GENERATORS), "README lost a generated section marker"
    for name, generator in docs.GENERATORS.items():
        assert found[name] == generator(), f"README section {name!r} is stale: run `python -m meteor_spark.cli.docs`"


def test_options_table_lists_every_connector_option() -> None:
    from meteor_spark.spark.options import OPTION_TABLE

    table = docs.sections(README)["options"]
    for option in OPTION_TABLE:
        assert f"| `{option.name}` |" in table


def test_the_two_setup_commands_are_the_ones_dev_supports() -> None:
    assert "bash .ci/dev demo" in README and "bash .ci/dev test" in README
    dev = (ROOT / ".ci" / "dev").read_text()
    assert 'demo) exec "$VENV/bin/meteor" demo' in dev
    assert 'METEOR_TEST_GRID=$grid "$VENV/bin/python" -m pytest "$@"' in dev
    assert "bash .ci/dev test" in (ROOT / ".ci" / "run").read_text()


def _bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, re.DOTALL)


def test_every_meteor_command_in_the_readme_parses() -> None:
    parser = build_parser()
    commands = []
    for block in _bash_blocks(README):
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            if "meteor " not in line or line.startswith(("bash", ".venv")):
                continue
            words = shlex.split(line[line.index("meteor ") :])
            commands.append(words[1:])
    assert len(commands) >= 8
    for words in commands:
        args, extra = parser.parse_known_args(words)
        assert not extra or getattr(args, "extra_args", False), words


def test_the_spark_example_checkpoints_into_a_fresh_directory() -> None:
    """A fixed checkpoint path resumes an old query's offsets against a new grid on the second run."""
    spark_blocks = [b for b in re.findall(r"```python\n(.*?)```", README, re.DOTALL) if "checkpointLocation" in b]
    assert spark_blocks
    for block in spark_blocks:
        assert re.search(r'checkpointLocation",\s*checkpoint\)', block) and "tempfile.mkdtemp(" in block, block


def test_deploying_doc_is_linked_and_its_commands_parse() -> None:
    deploying = (ROOT / "docs" / "deploying.md").read_text()
    section = README[README.index("## Running on a cluster") :]
    assert "docs/deploying.md" in section[: section.index("\n## ", 5)]
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
    """The README's Python blocks, in order, saved as one script and run by a fresh interpreter outside the checkout,
    as a reader who copies them would: nothing imported or set up by the test run can help them (no
    ``PYSPARK_PYTHON``, no virtualenv on the PATH, no active SparkSession); the publish/subscribe example starts its
    own embedded grid and the Spark example its own local session."""
    blocks = re.findall(r"```python\n(.*?)```", README, re.DOTALL)
    assert len(blocks) >= 2
    checks = (
        "\nassert len(seen) == 11, seen\n"
        "assert pages_df.count() >= 11\n"
        "spark.stop()\n"
        "grid.close()\n"
        "print('README examples: ok')\n"
    )
    script = tmp_path / "readme_examples.py"
    parts = [f"# README.md python block {number + 1}\n{block}" for number, block in enumerate(blocks)]
    script.write_text("\n".join(parts) + checks)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    # a virtualenv that is not activated: the python3 on the PATH is not the one that has meteor-spark
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400
    )
    assert done.returncode == 0 and "README examples: ok" in done.stdout, done.stdout[-3000:] + done.stderr[-6000:]
