/* The benchmark's control (bench/run.py --profilers sleeper): wakes on an
 * absolute clock_nanosleep schedule at RATE Hz for SECS seconds, exactly as a
 * sampler does between ticks, and reads nothing. Its target-slowdown column is
 * what a sampler's timer alone costs the target on this machine. C rather than
 * Python: a Python loop's own interpreter work on the neighbouring CPU slowed
 * the (also Python) target by 10-28 %, which is not what a sampler's timer does.
 * Writes "<ticks> <seconds>" to FILE at the end or on SIGINT. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>

static volatile sig_atomic_t stop;
static void on_int(int s) { (void)s; stop = 1; }

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: sleeper RATE SECS FILE\n");
        return 2;
    }
    double rate = atof(argv[1]), secs = atof(argv[2]);
    long step = (long)(1e9 / rate);
    struct sigaction sa = {0};
    sa.sa_handler = on_int;
    sigaction(SIGINT, &sa, NULL);
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0); /* as pyprof does */
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    double start = now();
    long ticks = 0;
    while (!stop && now() - start < secs) {
        t.tv_nsec += step;
        while (t.tv_nsec >= 1000000000L) {
            t.tv_sec++;
            t.tv_nsec -= 1000000000L;
        }
        if (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) == EINTR)
            break;
        ticks++;
    }
    FILE *f = fopen(argv[3], "w");
    if (!f)
        return 1;
    fprintf(f, "%ld %f\n", ticks, now() - start);
    return fclose(f) != 0;
}
