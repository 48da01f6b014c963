"""How `locojax-eval` splits the prompts over hosts: disjoint blocks covering every prompt,
the same blocks whatever the number of hosts."""

import pytest

from locojax.eval.share import EVAL_BLOCKS, block_size, host_blocks


@pytest.mark.parametrize("prompts", [1, 5, 12, 16, 17, 500])
@pytest.mark.parametrize("hosts", [1, 2, 3, 8])
def test_blocks_are_disjoint_cover_every_prompt_and_do_not_depend_on_hosts(prompts, hosts):
    shares = [host_blocks(prompts, h, hosts) for h in range(hosts)]
    blocks = sorted(b for share in shares for b in share)
    assert blocks == host_blocks(prompts, 0, 1)  # the one-host blocks, dealt out
    covered = [i for _, a, e in blocks for i in range(a, e)]
    assert covered == list(range(prompts))
    assert len(blocks) <= EVAL_BLOCKS and all(e - a <= block_size(prompts) for _, a, e in blocks)
    if prompts >= hosts * block_size(prompts):
        assert all(shares)  # every host has work
