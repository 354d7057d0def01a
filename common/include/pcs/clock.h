/* Injectable clock: the coordinator's state machine reads time only through this, so unit tests
 * drive leases with a fake clock (STYLE.md B9). */
#ifndef PCS_CLOCK_H
#define PCS_CLOCK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pcs_clock {
    uint64_t (*now_ms)(void *ctx);      /* monotonic milliseconds */
    uint64_t (*wall_ms)(void *ctx);     /* Unix epoch milliseconds, for timestamps shown to users */
    void *ctx;
} pcs_clock_t;

/* The real clocks (CLOCK_MONOTONIC / CLOCK_REALTIME). */
const pcs_clock_t *pcs_clock_real(void);
uint64_t pcs_now_ms(void);
uint64_t pcs_now_us(void);
uint64_t pcs_wall_ms(void);
/* Sleep ms milliseconds (a signal does not cut it short). */
void pcs_sleep_ms(uint32_t ms);

/* A fake clock for tests: both clocks read *ctx (a uint64_t ms counter the test advances). */
typedef struct pcs_fake_clock {
    pcs_clock_t clock;
    uint64_t now;
} pcs_fake_clock_t;
void pcs_fake_clock_init(pcs_fake_clock_t *fc, uint64_t start_ms);

static inline uint64_t pcs_clock_now(const pcs_clock_t *c)
{
    return c->now_ms(c->ctx);
}
static inline uint64_t pcs_clock_wall(const pcs_clock_t *c)
{
    return c->wall_ms(c->ctx);
}

#ifdef __cplusplus
}
#endif
#endif
