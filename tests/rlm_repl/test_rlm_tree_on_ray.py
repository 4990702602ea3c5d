"""Generator rlm_tree with its REPLs in env workers on a real local Ray (generator.env_placement=ray):
sub-calls made by code in a remote sandbox are answered by the generator (engine, child episodes) and the
tree is exactly the one local REPLs give."""

from __future__ import annotations

import pytest
from rlm_helpers import CONTEXT_TASK
from skyrl_core import ray_cluster
from test_rlm_tree import coordinator, make_generator

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(num_cpus=2, resources={"bwrap": 4}, include_dashboard=False, log_to_driver=False)
    yield
    ray_cluster.disconnect(True)


def tree(batch):
    return [(t.group_id, t.sample_index, t.depth, t.response_ids, t.reward, t.stop_reason, t.error,
             [turn.observation for turn in t.turns]) for t in batch.trajectories]


async def test_remote_repls_make_the_tree_local_repls_make(tokenizer):
    choose = coordinator("out = rlm_query_batched(['CHILD a', 'CHILD b'])\nprint(out)")
    tasks = [{**CONTEXT_TASK, "id": "t1"}, {**CONTEXT_TASK, "id": "t2"}]
    local = await make_generator(tokenizer, choose).generate(tasks, n_samples=2)
    gen = make_generator(tokenizer, choose, env_placement="ray", envs_per_worker=4)
    try:
        remote = await gen.generate(tasks, n_samples=2)
    finally:
        gen.close()
    assert tree(remote) == tree(local)
    assert len(remote.trajectories) == 12  # 4 roots, 8 children: every child episode ran in a worker too
    node = ray.get_runtime_context().get_node_id()
    assert {t.env_node for t in remote.trajectories} == {node}
    roots = remote.trajectories[:4]
    assert all(r.error is None and r.stop_reason == "terminated" for r in roots)
    assert "[['Notes: the capital of France is Paris.']" in roots[0].turns[0].observation[0]["content"]
    assert remote.metrics["ray/episodes_retried"] == 0.0
