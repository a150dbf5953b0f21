"""The CPU suites: `make test` and `make test-slow` split the CPU tests between them, `make
test-all` runs both, and CI (.ci/run) runs the command README.md names for it."""

import itertools
import re

from tests.conftest import REPO_ROOT

MAKEFILE = (REPO_ROOT / "Makefile").read_text()


def marker_expression(name: str) -> str:
    return re.search(rf"^{name} = (.+)$", MAKEFILE, flags=re.MULTILINE).group(1).strip()


def test_the_fast_and_slow_halves_split_every_cpu_test_once():
    """Every combination of the markers: a CPU test is in exactly one half, a GPU test in none."""
    fast, slow = marker_expression("FAST_TESTS"), marker_expression("SLOW_TESTS")
    for gpu, slow_mark, integration in itertools.product((False, True), repeat=3):
        marks = {"gpu": gpu, "slow": slow_mark, "integration": integration}
        halves = [eval(expression, {}, marks) for expression in (fast, slow)]  # noqa: S307
        assert halves.count(True) == (0 if gpu else 1), (marks, halves)


def test_test_all_runs_both_halves_and_ci_runs_the_readme_s_command():
    recipe = MAKEFILE.split("\ntest-all:", 1)[1].split("\n\n", 1)[0]
    assert "$(MAKE) --no-print-directory test ||" in recipe and "test-slow" in recipe
    readme = (REPO_ROOT / "README.md").read_text()
    assert "| `make test-all` | what CI runs" in readme
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test-all\b", ci, flags=re.MULTILINE), ci
