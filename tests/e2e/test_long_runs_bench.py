"""benchmarks/long_runs.py (issue 62, item 8) at CI size: a 6-step multi-turn CO run with a
flaky environment leaves no process and no zombie and writes every row; a 6-step DA run whose
rollout actor is killed at every step loses no row (each death is one restart; the run gave up
after 3 restarts of one actor before). The 200-step and 50-step figures: docs/bad-inputs.md."""

import json
import subprocess
import sys

import pytest
from paths import BENCHMARKS
from shared_runs import run_env

SCRIPT = BENCHMARKS / "long_runs.py"


def _report(*args: str) -> dict:
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=1500, env=run_env(), cwd=BENCHMARKS)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_short_flaky_co_run_leaves_nothing_and_keeps_every_row(tmp_path):
    co = _report("co", "--steps", "6", "--from-step", "3", "--keep", str(tmp_path))["co"]
    assert co["rc"] == 0 and co["rows"] == 6 and co["rows_in_order"], co
    assert co["processes_left"] == 0 and co["zombies_lasting"] == 0 and co["tracebacks"] == 0
    assert co["env_warning_lines_max_a_step"] <= 1 and co["rss_mb_step3"] > 0, co


@pytest.mark.slow
@pytest.mark.ray
def test_a_da_run_whose_rollout_actor_dies_every_step_loses_no_row(tmp_path):
    da = _report("da", "--steps", "6", "--kill-every", "1", "--keep", str(tmp_path))["da"]
    assert da["ok"] and da["kills_at"] == [1, 2, 3, 4, 5] and da["rollout_restarts"] == 5, da
