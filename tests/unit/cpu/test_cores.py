import os
import subprocess
import sys

import pytest

from lorarl.config.run import RLConfig
from lorarl.cpu.cores import omp_threads_bind, trainer_threads, worker_cores
from lorarl.launcher.plan import worker_command


def cfg(**inference) -> RLConfig:
    return RLConfig.model_validate({"model": {"name": "m"}, "inference": inference})


def test_workers_take_the_first_cores_and_leave_the_last_to_the_trainer() -> None:
    cores = list(range(8))
    c = cfg(num_workers=2, cpu_threads=3)
    assert worker_cores(c, 0, cores) == [[0, 1, 2]]
    assert worker_cores(c, 1, cores) == [[3, 4, 5]]
    tp = cfg(num_workers=1, cpu_threads=2, tensor_parallel_size=2)
    assert worker_cores(tp, 0, cores) == [[0, 1], [2, 3]]
    assert omp_threads_bind(worker_cores(tp, 0, cores)) == "0,1|2,3"


def test_workers_that_need_every_core_spread_over_all_and_a_restart_gets_the_same_ones() -> None:
    two = cfg(num_workers=2)
    assert [worker_cores(two, w, [0, 1]) for w in (0, 1, 1)] == [[[0]], [[1]], [[1]]]
    three = cfg(num_workers=3)  # more than the machine has: the third wraps around rather than getting none
    assert [worker_cores(three, w, [0, 1]) for w in (0, 1, 2)] == [[[0]], [[1]], [[0]]]
    assert worker_cores(cfg(), 0, [5]) == [[5]]  # one core: nothing to split


def test_taking_turns_gives_the_workers_every_core_and_the_trainer_too() -> None:
    cores = list(range(8))
    one, two = cfg(time_share=True), cfg(time_share=True, num_workers=2)
    assert worker_cores(one, 0, cores) == [cores] and trainer_threads(one, 8) == 8
    assert [worker_cores(two, w, cores) for w in (0, 1)] == [[[0, 1, 2, 3]], [[4, 5, 6, 7]]]
    assert trainer_threads(two, 8) == 8
    dp = RLConfig.model_validate(
        {"model": {"name": "m"}, "inference": {"time_share": True}, "trainer": {"parallel": {"dp": 2}}}
    )
    assert trainer_threads(dp, 8) == 4  # each rank its share
    # Split: the workers' cores are the trainer's no more.
    assert trainer_threads(cfg(time_share=False), 8) == 7
    assert trainer_threads(cfg(time_share=False, cpu_threads=3, num_workers=2), 8) == 2
    assert trainer_threads(cfg(time_share=False), 1) == 1  # at least one


def test_the_cpu_command_is_pinned_and_on_gpus_it_is_not() -> None:
    cmd = worker_command(cfg(), 0)
    assert cmd[1:5] == ["-m", "lorarl.cpu.cores", omp_threads_bind(worker_cores(cfg(), 0)), "--"]
    assert cmd[5:8] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert worker_command(RLConfig(model={"name": "m"}), 2)[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_the_wrapper_confines_the_command_and_binds_its_threads() -> None:
    core = min(os.sched_getaffinity(0))
    probe = "import os; print(sorted(os.sched_getaffinity(0)), os.environ['VLLM_CPU_OMP_THREADS_BIND'])"
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_OMP_THREADS_BIND"}
    out = subprocess.run(
        [sys.executable, "-m", "lorarl.cpu.cores", str(core), "--", sys.executable, "-c", probe],
        capture_output=True, text=True, check=True, env=env,
    ).stdout  # fmt: skip
    assert out.split() == [f"[{core}]", str(core)]
