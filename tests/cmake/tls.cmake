# TLS / mTLS of the real coordinator with pcsctl as client (needs the openssl CLI).
pcs_add_test(NAME test_tls SOURCES integration/test_tls.c LIBS pcs_base LABELS integration
             TIMEOUT 120)
add_dependencies(test_tls pcs-coordinator pcsctl)

# Bearer tokens by role: the pure check, and the real coordinator with pcsctl and a worker.
pcs_add_test(NAME test_auth SOURCES unit/test_auth.c LIBS pcs_coord LABELS unit)
pcs_add_test(NAME test_tokens SOURCES integration/test_tokens.c LIBS pcs_base LABELS integration
             TIMEOUT 120)
add_dependencies(test_tokens pcs-coordinator pcsctl pcs-worker)
