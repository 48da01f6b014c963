"""The `ray` and `tpu` markers put their tests in one xdist group each (tests/conftest.py), and
under `make test`'s `--dist loadgroup` the group reaches xdist's scheduler: the test's node id
carries `@<group>`, which is how xdist 3.8 sends a group to one worker. pytest 9.2's node ids
dropped that suffix silently (pytest-dev/pytest-xdist#1386; pyproject.toml pins pytest < 9.2)
and every worker ran Ray clusters and libtpu compiles at once."""

import pytest


def _check(request, group: str) -> None:
    marks = [m.args for m in request.node.iter_markers("xdist_group")]
    assert marks == [(group,)], marks
    if request.config.getoption("loadgroup", default=False):  # an xdist worker, loadgroup
        assert request.node.nodeid.endswith(f"@{group}"), request.node.nodeid


@pytest.mark.ray
def test_a_ray_test_is_in_the_ray_group(request):
    _check(request, "ray")


@pytest.mark.tpu
def test_a_tpu_test_is_in_the_tpu_group(request):
    _check(request, "tpu")
