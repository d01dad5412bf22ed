"""A task graph meant to be hard to read: a chain of 3000 tasks each
awaiting the next, two tasks each "awaited" by the other (a cycle, through
done-callbacks and, on 3.14+, the awaited-by links), and a task whose name
pointer was overwritten with garbage. None of them ever runs again. Prints
"ready" once all are in place."""

import asyncio
import ctypes
import sys

N = 3000


async def link(i, nxt):
    if nxt is None:
        await asyncio.Event().wait()  # at: chain-end
    else:
        await nxt  # at: chain


async def forever():
    await asyncio.Event().wait()  # at: forever


def corrupt_name(task, name):
    """Overwrite the task's pointer to its name str with an unmapped address."""
    base = id(task)
    for off in range(16, 256, 8):
        word = ctypes.c_uint64.from_address(base + off)
        if word.value == id(name):
            word.value = 0x10
            return off
    raise SystemExit("name pointer not found")


async def main():
    tasks = [None] * N
    nxt = None
    for i in reversed(range(N)):
        nxt = asyncio.create_task(link(i, nxt), name=f"link-{i}")
        tasks[i] = nxt
    a = asyncio.create_task(forever(), name="cycle-a")
    b = asyncio.create_task(forever(), name="cycle-b")
    a.add_done_callback(b.cancel)
    b.add_done_callback(a.cancel)
    if hasattr(asyncio, "future_add_to_awaited_by"):
        asyncio.future_add_to_awaited_by(a, b)
        asyncio.future_add_to_awaited_by(b, a)
    name = "broken-" + str(len(tasks))
    broken = asyncio.create_task(forever(), name=name)
    await asyncio.sleep(0.2)
    corrupt_name(broken, broken.get_name())
    print("ready", flush=True)
    await asyncio.Event().wait()


asyncio.run(main())
