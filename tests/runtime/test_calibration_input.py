"""locojax-calibrate's input: a metrics row whose measured value is not a number is one line
naming the file, the row and the key (issue 41: it was a TypeError traceback)."""

import json
import shutil

import pytest
from paths import FIXTURES

from locojax.reports.calibration import load_run
from locojax.runtime.errors import UserError


@pytest.mark.parametrize("key,value,shown", [("rollout_s", None, "null"),
                                             ("step_s", "fast", '"fast"'),
                                             ("host_dispatches", True, "true")])
def test_a_measured_value_that_is_no_number_is_one_line(tmp_path, key, value, shown):
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "calib_run", run)
    path = run / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert load_run(run)[1] == rows  # the fixture reads as it is
    rows[2][key] = value
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(UserError, match=rf"metrics.jsonl: row 3 \(step {rows[2]['step']}\): "
                                        rf"{key} is {shown}, not a number of seconds"):
        load_run(run)
