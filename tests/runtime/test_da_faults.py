"""A trainer death is reported in one line naming the checkpoint to resume from."""

from locojax.disagg.faults import last_checkpoint, trainer_lost_message


def test_trainer_lost_message_names_the_last_checkpoint(tmp_path):
    assert last_checkpoint(tmp_path) is None
    msg = trainer_lost_message(2, 7, tmp_path, RuntimeError("worker died\ntraceback..."))
    assert "no checkpoint" in msg and "\n" not in msg
    for step in (4, 6):
        (tmp_path / "checkpoints" / str(step)).mkdir(parents=True)
    (tmp_path / "checkpoints" / "8.orbax-checkpoint-tmp-1").mkdir()  # unfinished save
    msg = trainer_lost_message(2, 7, tmp_path, RuntimeError("worker died"))
    assert last_checkpoint(tmp_path) == 6
    assert "host 2 died during step 7 (worker died)" in msg and "step 6" in msg
    assert "\n" not in msg
