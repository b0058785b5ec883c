"""serve/scheduler.py: each tenant's requests in the order they came, the tenants in turn, one request
each, and a job that raises does not stop the others."""

from __future__ import annotations

import asyncio

from lorarl.serve.scheduler import Job, TenantQueues


def _run(submits: list[tuple[str, str]], fails: frozenset[str] = frozenset()) -> list[str]:
    done: list[str] = []

    def job(name: str) -> Job:
        async def work() -> None:
            done.append(name)
            if name in fails:
                raise RuntimeError(name)

        return work

    async def main() -> None:
        queues = TenantQueues()
        for tenant, name in submits:
            queues.submit(tenant, job(name))
        assert queues.pending("a") == sum(t == "a" for t, _ in submits)
        runner = asyncio.ensure_future(queues.run())
        while len(done) < len(submits):
            await asyncio.sleep(0)
        runner.cancel()

    asyncio.run(main())
    return done


def test_tenants_take_turns_one_request_each_in_their_order() -> None:
    submits = [("a", "a1"), ("a", "a2"), ("a", "a3"), ("b", "b1"), ("c", "c1"), ("b", "b2")]
    assert _run(submits) == ["a1", "b1", "c1", "a2", "b2", "a3"]


def test_a_failing_job_does_not_stop_the_others() -> None:
    assert _run([("a", "a1"), ("a", "a2"), ("b", "b1")], fails=frozenset({"a1"})) == ["a1", "b1", "a2"]


def test_work_submitted_while_running_is_taken_in_turn() -> None:
    done: list[str] = []

    async def main() -> None:
        queues = TenantQueues()

        def job(name: str, then: tuple[str, str] | None = None) -> Job:
            async def work() -> None:
                done.append(name)
                if then is not None:
                    queues.submit(then[0], job(then[1]))

            return work

        queues.submit("a", job("a1", then=("b", "b1")))
        queues.submit("a", job("a2"))
        runner = asyncio.ensure_future(queues.run())
        while len(done) < 3:
            await asyncio.sleep(0)
        runner.cancel()

    asyncio.run(main())
    assert done == ["a1", "a2", "b1"]
