/* Unit tests of the operator endpoint (common/http.c) over a real socket: /healthz follows the
 * published liveness and fails on its own once the publisher stops (a wedged loop), /readyz
 * follows readiness with the reason, /metrics serves the last snapshot, and bad listen addresses
 * are refused naming the option. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "pcs/clock.h"
#include "pcs/http.h"
#include "pcs/status.h"

/* GET path; the status code, the body (after the blank line) into body. */
static int get(int port, const char *path, char *body, size_t n)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    char req[256];
    int l = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\n\r\n", path);
    assert_int_equal(write(fd, req, (size_t)l), l);
    static char buf[65536];
    size_t got = 0;
    ssize_t r;
    while (got + 1 < sizeof buf && (r = read(fd, buf + got, sizeof buf - 1 - got)) > 0)
        got += (size_t)r;
    buf[got] = '\0';
    close(fd);
    const char *b = strstr(buf, "\r\n\r\n");
    snprintf(body, n, "%s", b ? b + 4 : "");
    assert_true(strncmp(buf, "HTTP/1.", 7) == 0);
    return atoi(buf + 9);
}

static void test_health_ready_and_metrics_follow_the_publisher(void **state)
{
    (void)state;
    pcs_http_t *h = NULL;
    assert_int_equal(pcs_http_start("127.0.0.1:0", "metrics-listen", 400, &h), PCS_OK);
    int port = pcs_http_port(h);
    assert_true(port > 0);
    char body[4096];
    /* nothing published yet: starting, not ready */
    assert_int_equal(get(port, "/readyz", body, sizeof body), 503);
    assert_string_equal(body, "not ready: starting\n");

    const char *m = "# TYPE x gauge\nx 1\n";
    pcs_http_publish(h, m, strlen(m), true, true, NULL);
    assert_int_equal(get(port, "/healthz", body, sizeof body), 200);
    assert_string_equal(body, "ok\n");
    assert_int_equal(get(port, "/readyz", body, sizeof body), 200);
    assert_int_equal(get(port, "/metrics", body, sizeof body), 200);
    assert_string_equal(body, m);

    pcs_http_publish(h, m, strlen(m), true, false, "shutting down");
    assert_int_equal(get(port, "/readyz", body, sizeof body), 503);
    assert_string_equal(body, "not ready: shutting down\n");
    assert_int_equal(get(port, "/healthz", body, sizeof body), 200);

    pcs_http_publish(h, m, strlen(m), false, false, "the agent has not gone round");
    assert_int_equal(get(port, "/healthz", body, sizeof body), 503);
    assert_string_equal(body, "not live: the agent has not gone round\n");

    /* live again, then the publisher goes quiet past stale_ms (400): /healthz fails by itself */
    pcs_http_publish(h, m, strlen(m), true, true, NULL);
    assert_int_equal(get(port, "/healthz", body, sizeof body), 200);
    pcs_sleep_ms(600);
    assert_int_equal(get(port, "/healthz", body, sizeof body), 503);
    assert_non_null(strstr(body, "not live: no state published for "));
    assert_int_equal(get(port, "/readyz", body, sizeof body), 200); /* readiness is the owner's */
    assert_int_equal(get(port, "/other", body, sizeof body), 404);
    pcs_http_stop(h);
}

static void test_bad_addresses_name_the_option(void **state)
{
    (void)state;
    pcs_http_t *h = NULL;
    assert_int_equal(pcs_http_start("nocolon", "metrics-listen", 0, &h), PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "metrics-listen 'nocolon'"));
    assert_int_equal(pcs_http_start("127.0.0.1:99999", "metrics-listen", 0, &h),
                     PCS_ERR_INVALID_ARG);
    assert_int_equal(pcs_http_start("example.com:80", "metrics-listen", 0, &h),
                     PCS_ERR_INVALID_ARG);
    assert_non_null(strstr(pcs_last_error(), "IPv4"));
    assert_null(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_health_ready_and_metrics_follow_the_publisher),
        cmocka_unit_test(test_bad_addresses_name_the_option),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
