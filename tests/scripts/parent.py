"""Starts a child Python process after a moment; the child's work is what a
--subprocesses recording must see."""
import subprocess
import sys
import time


def parent_wait():
    print("ready", flush=True)
    time.sleep(0.5)
    child = [sys.executable, "-c", "import time\ndef child_work():\n    end = time.time() + 2\n    while time.time() < end: pass\nchild_work()"]
    subprocess.run(child, check=True)


parent_wait()
