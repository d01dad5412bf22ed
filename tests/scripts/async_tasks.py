"""An asyncio program whose task graph and CPU split are known.

Tasks (root first):
  main ── gather ──┬── gatherer ── gather ── worker-a   (spins 20 ms slices)
                   ├── grouper ── TaskGroup ── worker-b (spins 10 ms slices;
                   │              3.8-3.10: awaits the task directly)
                   └── sleeper ── nap ── asyncio.sleep  (never wakes)

worker-a and worker-b take turns on the one thread, so by the clock A gets
about two thirds of their CPU time; each accounts its own spin time and
SIGUSR1 prints "split A B" (seconds so far). Lines the tests look for carry
a "# at: NAME" comment. Prints "ready" once every task is in place.
With --pure, asyncio runs without its C accelerator (pure-Python tasks).
"""

import signal
import sys
import time

if "--pure" in sys.argv:
    sys.modules["_asyncio"] = None
import asyncio  # noqa: E402

spent = {"a": 0.0, "b": 0.0}


def spin(which, seconds):
    start = time.perf_counter()
    end = start + seconds
    while time.perf_counter() < end:  # at: spin
        pass
    spent[which] += time.perf_counter() - start


async def work(which, seconds):
    while True:
        spin(which, seconds)  # at: work
        await asyncio.sleep(0)  # at: work-await


async def nap():
    await asyncio.sleep(3600)  # at: nap


async def sleeper():
    await nap()  # at: sleeper


async def gatherer():
    a = asyncio.create_task(work("a", 0.020), name="worker-a")
    await asyncio.gather(a)  # at: gatherer


async def grouper():
    if sys.version_info >= (3, 11):
        async with asyncio.TaskGroup() as tg:  # at: grouper
            tg.create_task(work("b", 0.010), name="worker-b")
    else:
        b = asyncio.create_task(work("b", 0.010), name="worker-b")
        await b  # at: grouper-old


def report(*_):
    print(f"split {spent['a']:.6f} {spent['b']:.6f}", flush=True)


async def announce():
    await asyncio.sleep(0.2)
    print("ready", flush=True)


async def main():
    signal.signal(signal.SIGUSR1, report)
    if "--pure" in sys.argv:
        assert type(asyncio.current_task()).__module__ == "asyncio.tasks", "the C accelerator is still in use"
    g = asyncio.create_task(gatherer(), name="gatherer")
    r = asyncio.create_task(grouper(), name="grouper")
    s = asyncio.create_task(sleeper(), name="sleeper")
    asyncio.create_task(announce(), name="announce")
    await asyncio.gather(g, r, s)  # at: main


asyncio.run(main())
