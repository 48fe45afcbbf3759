/* A preload for private test servers: CLOCK_REALTIME (clock_gettime,
 * gettimeofday, time) shifted by the microseconds written in the file
 * CLOCK_SHIFT_FILE names, read on every call, so that a test can step the
 * server's wall clock back or forth while it runs (testenv.ClockShift).
 * Monotonic clocks are left alone, as an NTP step leaves them. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
static long long shift_us(void) {
	const char *f = getenv("CLOCK_SHIFT_FILE");
	if (!f) return 0;
	FILE *fp = fopen(f, "r");
	if (!fp) return 0;
	long long v = 0;
	if (fscanf(fp, "%lld", &v) != 1) v = 0;
	fclose(fp);
	return v;
}
int clock_gettime(clockid_t clk, struct timespec *ts) {
	int r = syscall(SYS_clock_gettime, clk, ts);
	if (r == 0 && (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE)) {
		long long ns = ts->tv_sec * 1000000000LL + ts->tv_nsec + shift_us() * 1000LL;
		ts->tv_sec = ns / 1000000000LL;
		ts->tv_nsec = ns % 1000000000LL;
	}
	return r;
}
int gettimeofday(struct timeval *tv, void *tz) {
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	tv->tv_sec = ts.tv_sec;
	tv->tv_usec = ts.tv_nsec / 1000;
	return 0;
}
time_t time(time_t *t) {
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	if (t) *t = ts.tv_sec;
	return ts.tv_sec;
}
