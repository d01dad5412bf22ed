"""Targets that end with the harness that started them.

A harness killed mid-run (a test's time limit, ^C, a crash) used to leave
its target spinning, orphaned, on one of the machine's CPUs; every figure
taken after it was taken beside it. The kernel's parent-death signal ends
the target instead, whatever ends the harness. It is tied to the thread
that started the child: start targets from the main thread.
"""
import ctypes
import signal

PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent(then=None):
    """A preexec_fn: SIGKILL this child when its parent dies; then `then()`."""
    def preexec():
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if then is not None:
            then()
    return preexec
