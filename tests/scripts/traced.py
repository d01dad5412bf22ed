"""A program under a Python trace hook (sys.settrace) that spends most of
its time in the hook: `hook_work` runs on every line event of `traced`.
The hook is entered from C while `traced` waits on it, so samples taken
inside the hook show the hook above a caller that is not running."""
import sys
import time

deadline = time.time() + float(sys.argv[1]) if len(sys.argv) > 1 else float("inf")


def hook_work():
    total = 0
    for i in range(300):
        total += i
    return total


def hook(frame, event, arg):
    if event == "line" and frame.f_code.co_name == "traced":
        hook_work()
    return hook


def traced(n):
    x = n + 1
    return x * 2


def main():
    print("ready", flush=True)
    sys.settrace(hook)
    while time.time() < deadline:
        traced(1)


main()
