"""scripts/hooks/commit-msg refuses what CONTRIBUTING.md's commit rules rule out."""

import subprocess
import sys

import pytest
from paths import ROOT

HOOK = ROOT / "scripts" / "hooks" / "commit-msg"


def _hook(tmp_path, message: str) -> subprocess.CompletedProcess:
    (tmp_path / "MSG").write_text(message)
    return subprocess.run([sys.executable, str(HOOK), str(tmp_path / "MSG")],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("message", [
    "x" * 72, "Split Host into its model layout and its data\n\nWhy.\n",
    "Fix a thing\n# Please enter the commit message (git's comment)\n"])
def test_a_subject_of_at_most_72_characters_passes(tmp_path, message):
    out = _hook(tmp_path, message)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(("message", "line"), [
    ("x" * 73, "the subject is 73 characters (at most 72)"),
    ("Fix the thing.", "the subject ends with a period"),
    ("Fix the thing\nbody at once", "no blank line between the subject and the body"),
    ("", "the subject is empty")])
def test_a_broken_rule_is_one_line_and_exit_1(tmp_path, message, line):
    out = _hook(tmp_path, message)
    assert out.returncode == 1
    assert out.stderr == f"commit-msg: {line} (CONTRIBUTING.md, Commits)\n"
