"""The plan's train-step network bytes against the TPU compiler's collectives.

docs/aot.md's "Network bytes against the compiler's collectives" holds, per recompiled
28-layer case, the bytes a device receives in the compiler's collectives and the plan's
figure. Here each plan figure is recomputed (`train_step_network_bytes` of the case's plan)
and every row held within 25% of the compiler's.
"""

from pathlib import Path

import pytest

from compiler import compile_plan
from compiler.cost.estimate import train_step_network_bytes
from locojax.config.compose import compose_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "aot.md"
SECTION = "### Network bytes against the compiler's collectives"
GIB = 2**30


def _rows() -> list[dict]:
    text = DOC.read_text().split(SECTION, 1)[1]
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 10 or not cells[0].startswith(("gsm8k-", "numina-")):
            if rows:
                break  # the end of the table
            continue
        rows.append({"case": cells[0], "received": float(cells[7]), "plan": float(cells[8])})
    return rows


def test_the_table_has_its_rows():
    assert len(_rows()) == 7


@pytest.mark.parametrize("row", _rows(), ids=lambda r: r["case"])
def test_plan_network_bytes_within_25_percent_of_the_compilers(row):
    experiment, hardware, chips = row["case"].split("-")
    plan = compile_plan(compose_config([f"+experiment={experiment}_co", f"mesh={hardware}",
                                        f"mesh.chips={chips}"]))
    plan_gib = train_step_network_bytes(plan) / GIB
    assert plan_gib == pytest.approx(row["plan"], abs=0.006), row["case"]
    assert 0.75 <= plan_gib / row["received"] <= 1.25, (row["case"], plan_gib, row["received"])
