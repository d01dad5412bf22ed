"""Heat map workload: heatpkg.spin.hot() spins about three times as long on
its line A as on its line B by its thread's CPU clock, called from caller() (so the
call crosses files). argv[1]: seconds to run (default 3).
Prints "ready" once the package is imported and the loop starts."""
# heat-lines marker: <this comment & its "quotes"> must show in the heat map
import sys
import time

from heatpkg import spin


def caller(seconds):
    end = time.time() + seconds
    while time.time() < end:
        spin.hot(0.002)  # the call line


print("ready", flush=True)
caller(float(sys.argv[1]) if len(sys.argv) > 1 else 3.0)
