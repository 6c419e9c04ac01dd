"""The README's set-up and test commands are exactly what CI runs."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bash_blocks(text: str) -> list[str]:
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_ci_runs_the_readme_setup_and_test_commands():
    readme = (ROOT / "README.md").read_text()
    setup_section = readme.split("## Set up", 1)[1]
    test_section = readme.split("## Test", 1)[1]
    setup_command = _bash_blocks(setup_section)[0]
    test_command = _bash_blocks(test_section)[0]
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert setup_command in ci_lines
    assert test_command in ci_lines


def test_readme_names_the_main_experiment_and_every_experiment_config():
    readme = (ROOT / "README.md").read_text()
    assert "python -m kvbench experiment=sharegpt_70b" in readme
    for config in (ROOT / "conf" / "experiment").glob("*.yaml"):
        assert f"`{config.stem}`" in readme, f"README does not list experiment {config.stem}"
