import sys
import time

sys.stdout.write("ready\n")
sys.stdout.flush()
time.sleep(100000)
