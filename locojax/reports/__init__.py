"""What a reader sees of plans and runs: tables, sweep summaries, calibration reports.

    plan_view.py    a plan as rich tables (`python -m locojax.plan`)
    plan_sweep.py   Hydra callback of `python -m locojax.plan -m ...`: plans.csv/png and a table
    run_sweep.py    Hydra callback of `python -m locojax -m ...`: measured vs predicted step
    calibration.py  `python -m locojax.calibrate`: fit, write and compare a hardware entry
"""
