# TLS / mTLS of the real coordinator with pcsctl as client (needs the openssl CLI).
pcs_add_test(NAME test_tls SOURCES integration/test_tls.c LIBS pcs_base LABELS integration
             TIMEOUT 120)
add_dependencies(test_tls pcs-coordinator pcsctl)
