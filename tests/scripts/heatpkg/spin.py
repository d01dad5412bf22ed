"""Spins on two lines for 3:1 of the thread's CPU time, each loop on one
line, so every sample inside it has that line as its innermost Python line.
The thread's own CPU clock, not the wall's: a preemption (another test's
Chromium on a 2-CPU machine) then lengthens neither loop, and a recording in
--mode cpu sees the 3:1 whatever else runs."""
import time


def hot(unit):
    t = time.thread_time()
    while time.thread_time() - t < 3 * unit: pass  # line A
    t = time.thread_time()
    while time.thread_time() - t < unit: pass  # line B
