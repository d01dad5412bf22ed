"""check-asyncio.py: prove pyprof's asyncio offsets against a live interpreter.

Runs inside the target: builds a task graph (a task awaited by two tasks,
one by one, a gather, a TaskGroup on 3.11+), lets every task suspend, then
waits for the offsets (JSON, as pyprof loads them: AsyncioOffsets serialized,
plus "frame_code"/"frame_code_tag", the interpreter's own offset of a frame's
code and its tag bits) to appear in the file named by --offsets. Every offset
is then followed in this process's own memory and compared with what Python
itself reports: id(task.get_coro()), task._fut_waiter, the done-callbacks,
cr_frame, cr_await (the top of the suspended value stack), closures, sets...

Memory is read through /proc/self/mem, so a wrong offset that leads to a bad
address is a failed check, not a crash. Prints "READY <pid>" when the graph
is in place, then one JSON line {"checked": [...], "failures": [...]}.

    python3 check-asyncio.py --offsets /tmp/offsets.json
tests/asyncio_offsets.rs runs it on every interpreter of the matrix, with the
offsets pyprof's locator found in the running target.
"""

import asyncio
import gc
import json
import os
import struct
import sys
import time
import weakref

MINOR = sys.version_info[1]
checked, failures, notes = [], [], []


def _reader():
    """A read of this process's memory that fails, rather than crashes, on a
    bad address: /proc/self/mem, or (a chroot without /proc)
    process_vm_readv on ourselves."""
    try:
        fd = os.open("/proc/self/mem", os.O_RDONLY)
        return lambda addr, n: os.pread(fd, n, addr)
    except OSError:
        pass
    import ctypes

    class iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    libc = ctypes.CDLL(None, use_errno=True)
    libc.process_vm_readv.restype = ctypes.c_ssize_t
    pid = os.getpid()

    def read(addr, n):
        buf = ctypes.create_string_buffer(n)
        local, remote = iovec(ctypes.addressof(buf), n), iovec(addr, n)
        got = libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got < 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        return buf.raw[:got]

    return read


_READ = _reader()


def read(addr, n):
    if addr <= 0 or addr >= 1 << 47:
        raise ValueError("address %#x" % addr)
    try:
        data = _READ(addr, n)
    except OSError as e:
        raise ValueError("address %#x: %s" % (addr, e))
    if len(data) != n:
        raise ValueError("short read at %#x" % addr)
    return data


def u64(addr):
    return struct.unpack("<Q", read(addr, 8))[0]


def i64(addr):
    return struct.unpack("<q", read(addr, 8))[0]


def i32(addr):
    return struct.unpack("<i", read(addr, 4))[0]


def i8(addr):
    return struct.unpack("<b", read(addr, 1))[0]


def check(name, fn):
    """One named check: fn returns None (passed) or a failure message."""
    try:
        why = fn()
    except Exception as e:  # a bad pointer, a missing field: a failure all the same
        why = "%s: %s" % (type(e).__name__, e)
    checked.append(name)
    if why:
        failures.append("%s: %s" % (name, why))


def expect(got, want, what):
    return None if got == want else "%s: read %#x, want %#x" % (what, got, want)


# The graph.
async def leaf(ev):
    await ev.wait()


async def child(ev):
    await leaf(ev)


async def awaits(t):
    await t


async def gathers(ev):
    await asyncio.gather(child(ev), child(ev))


async def groups(ev, box):
    async with asyncio.TaskGroup() as tg:
        box.append(tg)
        tg.create_task(child(ev), name="grouped-child")


def task_checks(o, tasks):
    loop = asyncio.get_running_loop()
    import _asyncio

    check("C Task in use", lambda: None if asyncio.Task is _asyncio.Task else "asyncio.Task is %r" % asyncio.Task)
    check("task.size", lambda: expect(o["task_size"], type(tasks["parent"]).__basicsize__, "TaskObj size vs __basicsize__"))
    for label, t in tasks.items():
        check("task_coro[%s]" % label, lambda t=t: expect(u64(id(t) + o["task_coro"]), id(t.get_coro()), "task_coro"))

    # 3.12+ name an unnamed task lazily: task_name holds an int N, and
    # get_name() says "Task-N" (3.13 then keeps the str).
    def name_of(t):
        raw = u64(id(t) + o["task_name"])
        if u64(raw + 8) == id(str):
            return expect(raw, id(t.get_name()), "task_name")
        if u64(raw + 8) != id(int):
            return "task_name %#x is neither a str nor an int" % raw
        # The task's own references include its name: the int at that address.
        n = [r for r in gc.get_referents(t) if id(r) == raw]
        if not n or type(n[0]) is not int:
            return "task_name %#x is not among the task's references" % raw
        return None if t.get_name() == "Task-%d" % n[0] else "int %d, name %r" % (n[0], t.get_name())

    for label, t in tasks.items():
        check("task_name[%s]" % label, lambda t=t: name_of(t))

    parent, shared, solo, lone, fresh = (tasks[k] for k in ("parent", "shared", "solo", "lone", "fresh"))
    if o["awaiter_links"] == "Callbacks":
        for label, t, waits_on in (("parent", parent, shared), ("solo", solo, lone)):
            check("fut_waiter[%s]" % label, lambda t=t, w=waits_on: expect(u64(id(t) + o["task_fut_waiter"]), id(w), "task_fut_waiter"))
        # shared has two awaiters: the first in callback0, the second in the list.
        cbs = shared._callbacks
        check("two callbacks on shared", lambda: None if len(cbs) == 2 else "%d callbacks" % len(cbs))
        check("fut_callback0", lambda: expect(u64(id(shared) + o["fut_callback0"]), id(cbs[0][0]), "callback0"))

        def callbacks_list():
            lst = u64(id(shared) + o["fut_callbacks"])
            if u64(lst + 8) != id(list):
                return "fut_callbacks does not point at a list"
            n = i64(lst + o["list_size"])
            if n != 1:
                return "list of %d callbacks, want 1" % n
            tup = u64(u64(lst + o["list_items"]))
            if u64(tup + 8) != id(tuple) or i64(tup + o["tuple_size"]) != 2:
                return "callback entry is not a (callback, context) pair"
            return expect(u64(tup + o["tuple_items"]), id(cbs[1][0]), "second callback")

        check("fut_callbacks", callbacks_list)
        wake = cbs[0][0]
        if o["wakeup_wrapper_task"] is not None:
            check("wakeup wrapper type", lambda: None if type(wake).__name__ == "TaskWakeupMethWrapper" else type(wake).__name__)
            check("wakeup_wrapper_task", lambda: expect(u64(id(wake) + o["wakeup_wrapper_task"]), id(parent), "ww_task"))
        else:
            check("wakeup is a bound builtin", lambda: None if type(wake).__name__ == "builtin_function_or_method" else type(wake).__name__)
            check("cfunction_self (wakeup)", lambda: expect(u64(id(wake) + o["cfunction_self"]), id(parent), "m_self"))
        # gather: each child's callback is a closure over the outer future.
        gchild = tasks["gathered-child"]
        done = gchild._callbacks[0][0]
        check("gather callback is a closure", lambda: None if done.__closure__ else "no closure")
        outer = tasks["gatherer"]._fut_waiter

        def gather_closure():
            clo = u64(id(done) + o["function_closure"])
            why = expect(clo, id(done.__closure__), "func_closure")
            if why:
                return why
            refs = [u64(u64(clo + o["tuple_items"] + 8 * i) + o["cell_ref"]) for i in range(i64(clo + o["tuple_size"]))]
            return None if id(outer) in refs else "no cell of the closure holds the gathering future"

        check("gather closure reaches the outer future", gather_closure)
        if "grouped-child" in tasks:
            on_done = tasks["grouped-child"]._callbacks[0][0]
            check("taskgroup method_func", lambda: expect(u64(id(on_done) + o["method_func"]), id(on_done.__func__), "im_func"))
            check("taskgroup method_self", lambda: expect(u64(id(on_done) + o["method_self"]), id(on_done.__self__), "im_self"))
        # A task just created waits in the ready queue for its first step.
        steps = [h._callback for h in loop._ready if type(h._callback).__name__ == "TaskStepMethWrapper"]
        if o["step_wrapper_task"] is not None and steps:
            check("step_wrapper_task", lambda: expect(u64(id(steps[-1]) + o["step_wrapper_task"]), id(fresh), "sw_task"))
        elif o["step_wrapper_task"] is not None:
            notes.append("no TaskStepMethWrapper in the ready queue: step_wrapper_task not exercised")
    else:
        awaited_by_checks(o, tasks)


def awaited_by_checks(o, tasks):
    import ctypes

    parent, parent2, shared, solo, lone = (tasks[k] for k in ("parent", "parent2", "shared", "solo", "lone"))
    ab, is_set, is_task = o["task_awaited_by"], o["task_awaited_by_is_set"], o["task_is_task"]
    check("awaited_by (one awaiter)", lambda: expect(u64(id(lone) + ab), id(solo), "task_awaited_by"))
    # gather() records the task that called it as its children's awaiter.
    check("gathered child awaited by the gathering task", lambda: expect(u64(id(tasks["gathered-child"]) + ab), id(tasks["gatherer"]), "awaited_by"))
    check("awaited_by_is_set (one)", lambda: expect(i8(id(lone) + is_set), 0, "is_set"))
    check("awaited_by_is_set (two)", lambda: expect(i8(id(shared) + is_set), 1, "is_set"))
    check("awaited_by (a set of two)", lambda: set_holds(u64(id(shared) + ab), {id(parent), id(parent2)}))
    check("is_task of a task", lambda: expect(i8(id(parent) + is_task), 1, "is_task"))
    outer = tasks["gatherer"]._fut_waiter
    check("is_task of a future", lambda: expect(i8(id(outer) + is_task), 0, "is_task"))

    api = ctypes.pythonapi
    api.PyThreadState_Get.restype = ctypes.c_void_p
    api.PyInterpreterState_Get.restype = ctypes.c_void_p
    tstate, interp = api.PyThreadState_Get(), api.PyInterpreterState_Get()
    check("thread_running_loop", lambda: expect(u64(tstate + o["thread_running_loop"]), id(asyncio.get_running_loop()), "asyncio_running_loop"))
    check("thread_running_task", lambda: expect(u64(tstate + o["thread_running_task"]), id(asyncio.current_task()), "asyncio_running_task"))
    node = o["task_node"]

    def thread_list():
        head = tstate + o["thread_tasks_head"]
        seen, at = set(), u64(head)
        while at != head:
            if len(seen) > 10000:
                return "list does not return to its head"
            seen.add(at - node)
            at = u64(at)
        want = {id(t) for t in asyncio.all_tasks()}
        return None if want <= seen else "tasks missing from the thread's list: %d of %d" % (len(want - seen), len(want))

    check("thread_tasks_head lists every task", thread_list)
    head = interp + o["interp_tasks_head"]
    check("interp_tasks_head is a list head", lambda: None if u64(head) == head or u64(u64(head) + 8) == head else "next's prev is not the head")


def set_holds(addr, want):
    if u64(addr + 8) != id(set):
        return "not a set at %#x" % addr
    mask = i64(addr + O["set_mask"])
    if mask < 7 or mask >= 1 << 20 or (mask + 1) & mask:
        return "mask %d" % mask
    table = u64(addr + O["set_table"])
    keys = {u64(table + i * O["setentry_size"]) for i in range(mask + 1)}
    return None if want <= keys else "%d of %d keys missing" % (len(want - keys), len(want))


def object_checks(o, tasks):
    # Generic objects, on every version (3.14+ fill them from the headers).
    s = set(tasks.values())
    check("set", lambda: set_holds(id(s), {id(t) for t in s}))
    tup = tuple(tasks.values())
    check("tuple_size", lambda: expect(i64(id(tup) + o["tuple_size"]), len(tup), "ob_size"))
    check("tuple_items", lambda: expect(u64(id(tup) + o["tuple_items"] + 8), id(tup[1]), "ob_item[1]"))
    check("tuple_items = tuple.__basicsize__", lambda: expect(o["tuple_items"], tuple.__basicsize__, "ob_item"))
    lst = list(tasks.values())
    check("list_size", lambda: expect(i64(id(lst) + o["list_size"]), len(lst), "ob_size"))
    check("list_items", lambda: expect(u64(u64(id(lst) + o["list_items"]) + 8), id(lst[1]), "ob_item[1]"))
    bound = lst.append
    check("cfunction_self", lambda: expect(u64(id(bound) + o["cfunction_self"]), id(lst), "m_self"))
    meth = tasks["parent"].get_coro  # builtin; a Python method next
    check("cfunction_self (task)", lambda: expect(u64(id(meth) + o["cfunction_self"]), id(tasks["parent"]), "m_self"))

    class K:
        def m(self):
            pass

    k = K()
    pm = k.m
    check("method_func", lambda: expect(u64(id(pm) + o["method_func"]), id(pm.__func__), "im_func"))
    check("method_self", lambda: expect(u64(id(pm) + o["method_self"]), id(k), "im_self"))
    x = object()
    fn = (lambda: lambda: x)()
    check("function_closure", lambda: expect(u64(id(fn) + o["function_closure"]), id(fn.__closure__), "func_closure"))
    check("cell_ref", lambda: expect(u64(id(fn.__closure__[0]) + o["cell_ref"]), id(x), "ob_ref"))
    w = weakref.ref(tasks["parent"])
    check("weakref_object", lambda: expect(u64(id(w) + o["weakref_object"]), id(tasks["parent"]), "wr_object"))


def stack_top(o, frame_addr):
    """Address of the top slot of a suspended frame's value stack, or None if empty/running."""
    vs = o["value_stack"]
    kind, f = next(iter(vs.items()))
    k = o["awaited_slot"]
    if kind == "FrameStacktop":
        top = u64(frame_addr + f["f_stacktop"])
        return top - 8 * k if top else None
    if kind == "FrameDepth":
        depth = i32(frame_addr + f["f_stackdepth"])
        return u64(frame_addr + f["f_valuestack"]) + 8 * (depth - k) if depth >= k else None
    if kind == "LocalsplusTop":
        top = i32(frame_addr + f["stacktop"])
        return frame_addr + f["localsplus"] + 8 * (top - k) if top >= k else None
    if kind == "StackPointer":
        sp = u64(frame_addr + f["stackpointer"])
        return sp - 8 * k if sp else None
    raise ValueError("unknown value stack %s" % kind)


def coroutine_checks(o, tasks, running):
    gf = o["gen_frame"]
    kind, g = next(iter(gf.items()))
    tag = ~(o["value_stack"].get("StackPointer", {}).get("tag_mask", 0))
    ftag = ~o["frame_code_tag"]

    def frame_of(coro):
        if kind == "Pointer":
            return u64(id(coro) + g["gi_frame"])
        return id(coro) + g["gi_iframe"]

    def suspended(coro):
        if kind == "Pointer":
            return None
        st = i8(id(coro) + g["gi_frame_state"])
        return g["suspended_min"] <= st <= g["suspended_max"]

    n = 0
    for label, t in tasks.items():
        if label == "fresh":
            continue
        coro, depth = t.get_coro(), 0
        # Down the await chain: each coroutine suspended, awaiting the next.
        while asyncio.iscoroutine(coro) and coro.cr_await is not None and depth < 16:
            name = "%s/%s" % (label, coro.cr_code.co_name)
            if kind == "Pointer":
                check("gi_frame " + name, lambda c=coro: expect(frame_of(c), id(c.cr_frame), "gi_frame"))
            else:
                check("gi_iframe " + name, lambda c=coro: expect(u64(frame_of(c) + o["frame_code"]) & ftag, id(c.cr_code), "gi_iframe's code"))
                check("gi_frame_state " + name, lambda c=coro: None if suspended(c) else "state %d not suspended" % i8(id(c) + g["gi_frame_state"]))

            def top(c=coro):
                at = stack_top(o, frame_of(c))
                if at is None:
                    return "empty value stack"
                got = u64(at) & tag
                if got == id(c.cr_await):
                    return None
                near = [d for d in (-2, -1, 1, 2) if u64(at + 8 * d) & tag == id(c.cr_await)]
                return "slot %#x is not cr_await %#x%s" % (got, id(c.cr_await), " (the one %d slots up is)" % near[0] if near else "")

            check("value stack top = cr_await " + name, top)
            n += 1
            coro, depth = coro.cr_await, depth + 1
    check("coroutines walked", lambda: None if n >= 10 else "only %d suspended coroutines" % n)
    # The ends of the suspended range: a generator at a bare yield is in its
    # lowest state; one not started, running or finished is outside it.
    def gen():
        yield

    at_yield, unstarted, finished = gen(), gen(), gen()
    next(at_yield)
    for _ in finished:
        pass
    if kind == "Embedded":
        check("running coroutine not suspended", lambda: None if not suspended(running) else "state says suspended")
        check("bare yield is the lowest suspended state", lambda: expect(i8(id(at_yield) + g["gi_frame_state"]), g["suspended_min"], "gi_frame_state"))
        check("unstarted generator not suspended", lambda: None if not suspended(unstarted) else "state says suspended")
        check("finished generator not suspended", lambda: None if not suspended(finished) else "state says suspended")
    else:
        check("finished generator has no frame", lambda: expect(u64(id(finished) + g["gi_frame"]), 0, "gi_frame"))
        check("gi_frame of a generator", lambda: expect(u64(id(at_yield) + g["gi_frame"]), id(at_yield.gi_frame), "gi_frame"))
    # The running coroutine has no saved stack top on <= 3.9.
    if "FrameStacktop" in o["value_stack"]:
        check("running frame has no stacktop", lambda: expect(u64(frame_of(running) + o["value_stack"]["FrameStacktop"]["f_stacktop"]), 0, "f_stacktop"))


async def main(path):
    ev = asyncio.Event()
    tasks = {}
    tasks["lone"] = asyncio.ensure_future(child(ev))
    tasks["lone"].set_name("lone")
    tasks["shared"] = asyncio.ensure_future(child(ev))
    tasks["shared"].set_name("shared")
    await asyncio.sleep(0)
    for name, target in (("solo", "lone"), ("parent", "shared"), ("parent2", "shared")):
        tasks[name] = asyncio.ensure_future(awaits(tasks[target]))
        tasks[name].set_name(name)
    tasks["gatherer"] = asyncio.ensure_future(gathers(ev))
    box = []
    if MINOR >= 11:
        tasks["grouper"] = asyncio.ensure_future(groups(ev, box))
    for _ in range(5):
        await asyncio.sleep(0)
    outer = tasks["gatherer"]._fut_waiter
    tasks["gathered-child"] = next(t for t in asyncio.all_tasks() if t not in tasks.values() and t is not asyncio.current_task()
                                   and t.get_coro().cr_code.co_name == "child" and any(getattr(cb, "__closure__", None) for cb, _ in t._callbacks or ()))
    if box:
        tasks["grouped-child"] = next(t for t in box[0]._tasks)
    print("READY %d" % os.getpid(), flush=True)
    deadline = time.time() + 120
    while not os.path.exists(path):
        if time.time() > deadline:
            raise SystemExit("no offsets in %s" % path)
        time.sleep(0.02)
    time.sleep(0.05)
    with open(path) as f:
        o = json.load(f)
    global O
    O = o
    # Created after the others suspended, so its first step is still queued.
    tasks["fresh"] = asyncio.ensure_future(child(ev))
    gc.disable()
    task_checks(o, tasks)
    object_checks(o, tasks)
    coroutine_checks(o, tasks, asyncio.current_task().get_coro())
    print(json.dumps({"checked": checked, "failures": failures, "notes": notes}), flush=True)
    ev.set()


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--offsets":
        raise SystemExit(__doc__)
    asyncio.run(main(sys.argv[2]))
