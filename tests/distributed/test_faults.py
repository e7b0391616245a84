"""Faults and bad input: a rank that dies, a world size the plan does not match, a port in use,
a bad device map: clear DistributedErrors, raised early, no hang."""

import socket

import pytest

from tensoropt.distributed import init_runtime, launch, parse_rank_map, resolve_rank_map
from tensoropt.distributed.jobs import measure_plan
from tensoropt.errors import DistributedError

SPEC = "zoo:vgg16?tiny=1"


@pytest.fixture(scope="module")
def dp_plan():
    import tensoropt
    from tensoropt.distributed.jobs import load_case

    from .conftest import priced

    # the workers build the float32 model: make the plan for its graph
    _, _, graph = load_case(SPEC)
    costs, cluster = priced(graph)
    return tensoropt.place(graph, costs, cluster, "dp", devices=["gpu0", "gpu1"]).to_dict()


def test_a_rank_that_dies_mid_step_stops_its_peer_with_a_clear_error_well_within_the_timeout(dp_plan):
    with pytest.raises(DistributedError) as err:
        launch(measure_plan, 2, {"model_spec": SPEC, "plan": dp_plan, "steps": 1, "warmup": 0, "memory": False,
                                 "fail_rank": 1}, timeout_s=120.0)
    text = str(err.value)
    # rank 0 is exchanging activations with rank 1 in forward: it reports that rank 1 failed
    assert "rank 0 of 2: " in text and "with rank 1 failed: rank 1 failed or died" in text, text
    assert "rank 1 exited with code 3" in text, text
    # ... as soon as it happened, not at the timeout: neither gloo's timeout ("timed out") nor the
    # launcher's own limit ("did not finish within") ended it (asserted by the path, not the clock)
    assert "timed out" not in text.lower() and "did not finish within" not in text, text


def test_a_world_size_that_does_not_match_the_plan_is_refused_before_any_step(dp_plan):
    with pytest.raises(DistributedError, match=r"world size is 3: rank\(s\) \[2\] would have nothing to run"):
        launch(measure_plan, 3, {"model_spec": SPEC, "plan": dp_plan, "steps": 1, "warmup": 0, "memory": False},
               timeout_s=30)


def test_rank_maps():
    assert resolve_rank_map(["gpu0", "gpu1"], 2) == {"gpu0": 0, "gpu1": 1}
    assert resolve_rank_map(["a", "b", "c"], 2, {"a": 0, "b": 1, "c": 1}) == {"a": 0, "b": 1, "c": 1}
    assert parse_rank_map("gpu0=1, gpu1=0") == {"gpu0": 1, "gpu1": 0}
    with pytest.raises(DistributedError, match="names rank\\(s\\) \\[2\\], which do not exist"):
        resolve_rank_map(["a", "b"], 2, {"a": 0, "b": 2})
    with pytest.raises(DistributedError, match="no rank for plan device\\(s\\) b"):
        resolve_rank_map(["a", "b"], 2, {"a": 0})
    with pytest.raises(DistributedError, match="world size is 1"):
        resolve_rank_map(["a", "b"], 1)
    with pytest.raises(DistributedError, match="PLAN_DEVICE=RANK"):
        parse_rank_map("gpu0:0")


def test_a_port_in_use_is_named_with_the_fix():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(DistributedError, match=rf"port {port} on 127.0.0.1 is already in use.*--master-port"):
            init_runtime(rank=0, world_size=1, master_addr="127.0.0.1", master_port=port, backend="gloo",
                         timeout_s=5)
