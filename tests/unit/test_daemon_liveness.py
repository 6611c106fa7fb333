"""The agent's liveness: work on its worker past its budget, or its mutex held with no work
running, is stuck; anything else is not."""

import asyncio
import functools

from hostagent.daemon.liveness import TimedLock, WorkClock


def test_a_call_past_its_budget_is_stuck_and_one_without_a_budget_never():
    clock = WorkClock(budget=10)
    mutex = TimedLock()
    seen = []

    def work(x):
        seen.append(clock.stuck(mutex, now=clock.busy[1] + 9))
        seen.append(clock.stuck(mutex, now=clock.busy[1] + 11))
        return x

    assert clock.timed(functools.partial(work), budget=None)(1) == 1
    assert seen == [None, None]
    seen.clear()
    assert clock.timed(work)(2) == 2
    assert seen[0] is None and seen[1].startswith("the worker has run test_a_call_past_its_budget") \
        and "its budget is 10 s" in seen[1]
    assert clock.busy is None and clock.stuck(mutex) is None


def test_the_mutex_held_with_no_work_running_is_stuck():
    clock = WorkClock(budget=10)

    async def main():
        mutex = TimedLock()
        async with mutex:
            start = mutex.held_since
            assert clock.stuck(mutex, now=start + 5) is None
            assert "mutex has been held for 11 s with no work running" in clock.stuck(mutex, now=start + 11)
            clock.timed(lambda: None)()          # work ran meanwhile: idle counts from its end
            assert clock.stuck(mutex, now=clock.idle_since + 5) is None
        assert mutex.held_since is None and clock.stuck(mutex, now=start + 1000) is None
    asyncio.run(main())
