"""Spins on two lines for 3:1 of the time, each loop on one line, so every
sample inside it has that line as its innermost Python line."""
import time


def hot(unit):
    t = time.perf_counter()
    while time.perf_counter() - t < 3 * unit: pass  # line A
    t = time.perf_counter()
    while time.perf_counter() - t < unit: pass  # line B
