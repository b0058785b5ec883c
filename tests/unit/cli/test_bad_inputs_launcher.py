"""Bad input to what starts and places the processes: [cluster] (the Ray address in its wrong forms,
timeouts, bundle resources, settings that need another backend; `rl`'s and `lorarl-serve`'s) and
`lorarl-inference --worker`. Each is
refused with exit code 2 and one line naming the key or flag at fault, no traceback, nothing written
(see `bad_inputs.assert_refused`); `rl` cases run with `--dry-run`."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.unit.cli.bad_inputs import Case, Workspace, assert_refused, case_ids, rl_args, serve_args

RAY = ("--cluster.backend", "ray", "--inference.api_key", "k")


def ray_args(*args: str) -> Callable[[Workspace], list[str]]:
    return rl_args(*RAY, *args)


def inference_args(*args: str) -> Callable[[Workspace], list[str]]:
    return lambda w: ["--model.name", str(w.model), "--dry-run", *args]


CASES: list[Case] = [
    # cluster.address: "auto", "host:port" or "ray://host:port".
    ("rl", ray_args("--cluster.address", "localhost"), "cluster.address 'localhost'"),
    ("rl", ray_args("--cluster.address", "http://10.0.0.1:6379"), "cluster.address 'http://10.0.0.1:6379'"),
    ("rl", ray_args("--cluster.address", "ray://"), "cluster.address 'ray://'"),
    ("rl", ray_args("--cluster.address", "10.0.0.1:6379x"), "cluster.address '10.0.0.1:6379x'"),
    ("rl", ray_args("--cluster.address", "10.0.0.1:0"), "'10.0.0.1:0': a port is 1-65535"),
    ("rl", ray_args("--cluster.address", "ray://head:99999"), "'ray://head:99999': a port is 1-65535"),
    ("rl", ray_args("--cluster.address", ""), "cluster.address ''"),
    ("rl", ray_args("--cluster.address", "head:6379 --worker"), "cluster.address 'head:6379 --worker'"),
    ("rl", rl_args("--cluster.address", "auto"), "cluster.address is for cluster.backend"),
    # The backend and its timeouts.
    ("rl", rl_args("--cluster.backend", "slurm"), "cluster.backend"),
    ("rl", rl_args("--cluster.backend", "Ray"), "cluster.backend"),
    ("rl", ray_args("--cluster.placement_timeout", "0"), "cluster.placement_timeout"),
    ("rl", ray_args("--cluster.connect_timeout", "-1"), "cluster.connect_timeout"),
    ("rl", ray_args("--cluster.connect_timeout", "soon"), "cluster.connect_timeout"),
    # What a bundle asks of its node.
    ("rl", ray_args("--cluster.trainer_resources", '{"trainer_node": -1}'), "cluster.trainer_resources"),
    ("rl", ray_args("--cluster.inference_resources", '{"gpu_node": 0}'), "cluster.inference_resources"),
    ("rl", ray_args("--cluster.inference_resources", '{"gpu_node": "nan"}'), "cluster.inference_resources"),
    ("rl", rl_args("--cluster.trainer_resources", '{"trainer_node": 1}'), "cluster.trainer_resources is for"),
    # Settings of one machine, or a folder of its own, on a cluster.
    ("rl", rl_args("--cluster.backend", "ray"), "inference.api_key is required"),
    ("rl", ray_args("--inference.colocate_with_trainer"), "inference.colocate_with_trainer"),
    ("rl", ray_args("--trainer.gpu_ids", "[0]"), "trainer.gpu_ids = [0]"),
    ("rl", rl_args("--no-cluster.shared_fs"), "cluster.shared_fs = false is for"),
    # lorarl-serve on Ray: the same [cluster], and a run folder every node mounts.
    ("lorarl-serve", serve_args("--cluster.backend", "ray"), "inference.api_key is required"),
    ("lorarl-serve", serve_args(*RAY, "--no-cluster.shared_fs"), "cluster.shared_fs = false: lorarl-serve on Ray"),
    ("lorarl-serve", serve_args("--cluster.trainer_resources", '{"t": 1}'), "cluster.trainer_resources is for"),
    ("lorarl-serve", serve_args(*RAY, "--cluster.address", "head"), "cluster.address 'head'"),
    # `lorarl-inference --worker i`: which of inference.num_workers to start.
    ("lorarl-inference", inference_args("--worker", "x"), "--worker x: expected a worker number"),
    ("lorarl-inference", inference_args("--worker"), "--worker: expected a worker number"),
    ("lorarl-inference", inference_args("--worker", "-1"), "--worker -1: expected a worker number"),
    ("lorarl-inference", inference_args("--worker", "1.5"), "--worker 1.5: expected a worker number"),
    ("lorarl-inference", inference_args("--worker=\u0663"), "--worker \u0663: expected a worker number"),
    ("lorarl-inference", inference_args("--worker", "1"), "--worker 1: inference.num_workers = 1 has workers 0-0"),
    (
        "lorarl-inference",
        inference_args("--inference.num_workers", "2", "--worker=5"),
        "--worker 5: inference.num_workers",
    ),
    ("lorarl-inference", inference_args("--worker", "0", "--worker", "1"), "--worker: given more than once"),
    ("lorarl-inference", inference_args("--worker", "0", "--inference.port", "70000"), "inference.port"),
    (
        "lorarl-inference",
        inference_args("--inference.port", "65535", "--inference.num_workers", "2", "--worker", "1"),
        "inference: port = 65535: worker 1 would listen on 65536",
    ),
]


@pytest.mark.parametrize(("command", "args", "names"), CASES, ids=case_ids(CASES))
def test_bad_launcher_input_is_refused_in_one_line_and_touches_nothing(
    ws: Workspace, capsys: pytest.CaptureFixture[str], command: str, args: Callable[[Workspace], list[str]], names: str
) -> None:
    assert_refused(ws, capsys, command, args(ws), names)
