/* Real and fake clocks behind pcs_clock_t. */
#include "pcs/clock.h"

#include <errno.h>
#include <time.h>

void pcs_sleep_ms(uint32_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

uint64_t pcs_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t pcs_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

uint64_t pcs_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static uint64_t real_now(void *ctx)
{
    (void)ctx;
    return pcs_now_ms();
}

static uint64_t real_wall(void *ctx)
{
    (void)ctx;
    return pcs_wall_ms();
}

const pcs_clock_t *pcs_clock_real(void)
{
    static const pcs_clock_t c = {real_now, real_wall, 0};
    return &c;
}

static uint64_t fake_now(void *ctx)
{
    return *(const uint64_t *)ctx;
}

void pcs_fake_clock_init(pcs_fake_clock_t *fc, uint64_t start_ms)
{
    fc->now = start_ms;
    fc->clock.now_ms = fake_now;
    fc->clock.wall_ms = fake_now;
    fc->clock.ctx = &fc->now;
}
