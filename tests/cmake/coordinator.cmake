# coordinator/: the pure state machine (with the pure planner's mesh) and the SQLite store compiled
# in (neither needs gRPC), bearer tokens, and the real pcs-coordinator driven by the C client, a
# stock gRPC client, TLS and tokens.
pcs_add_test(NAME test_coord SOURCES unit/test_coord.c ${PROJECT_SOURCE_DIR}/coordinator/coord.c
             LIBS pcs_planner LABELS unit TIMEOUT 60)
pcs_add_test(NAME test_store SOURCES unit/test_store.c ${PROJECT_SOURCE_DIR}/coordinator/store.c
             LIBS pcs_base PkgConfig::SQLITE LABELS unit TIMEOUT 60)
pcs_add_test(NAME test_auth SOURCES unit/test_auth.c LIBS pcs_coord LABELS unit)

pcs_add_test(NAME test_coordinator SOURCES integration/test_coordinator.c
             LIBS pcs_common Threads::Threads LABELS integration TIMEOUT 120)
add_dependencies(test_coordinator pcs-coordinator)
# Wire compatibility with a stock gRPC implementation (Debian python3-grpcio); exits 77 if absent.
add_test(NAME test_coordinator_grpcio
  COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/interop_grpcio.py)
set_tests_properties(test_coordinator_grpcio PROPERTIES LABELS integration TIMEOUT 120
  SKIP_RETURN_CODE 77
  ENVIRONMENT "PCS_BIN_DIR=${CMAKE_BINARY_DIR}/bin;PCS_SOURCE_DIR=${PROJECT_SOURCE_DIR};PCS_LOG_LEVEL=warn")
# TLS / mTLS of the real coordinator with pcsctl as client (needs the openssl CLI).
pcs_add_test(NAME test_tls SOURCES integration/test_tls.c LIBS pcs_base LABELS integration
             TIMEOUT 120)
add_dependencies(test_tls pcs-coordinator pcsctl pcs-worker)
# Bearer tokens by role: the real coordinator with pcsctl and a worker.
pcs_add_test(NAME test_tokens SOURCES integration/test_tokens.c LIBS pcs_base LABELS integration
             TIMEOUT 120)
add_dependencies(test_tokens pcs-coordinator pcsctl pcs-worker)
# Nothing acknowledged is lost: SIGKILL during submit and cancel bursts, a full state disk (a
# tmpfs; root only, skipped otherwise).
pcs_add_test(NAME test_durability SOURCES integration/test_durability.c
             LIBS pcs_common Threads::Threads LABELS integration TIMEOUT 300)
add_dependencies(test_durability pcs-coordinator)
# No healthy job is failed by the control plane: the coordinator killed and restarted (test_outage,
# argument restart) or SIGSTOPped (test_outage_pause) for 30 s and then 60 s while two jobs train;
# both must succeed. About two minutes each, mostly waiting: ctest runs them beside other tests.
pcs_add_test(NAME test_outage SOURCES integration/test_outage.c ${PCS_E2E_UTIL}
             LIBS pcs_worker LABELS integration TIMEOUT 480 ARGS restart)
add_test(NAME test_outage_pause COMMAND test_outage pause)
set_tests_properties(test_outage_pause PROPERTIES LABELS integration TIMEOUT 480
  ENVIRONMENT "PCS_BIN_DIR=${CMAKE_BINARY_DIR}/bin;PCS_SOURCE_DIR=${PROJECT_SOURCE_DIR};PCS_LOG_LEVEL=warn")
set_target_properties(test_outage PROPERTIES LINKER_LANGUAGE CXX)
add_dependencies(test_outage pcs-coordinator pcs-worker)
# Bounded memory: the spec limit, RSS flat under a submit/cancel churn of large specs, the
# bounded history (finished specs in SQLite, older jobs forgotten).
pcs_add_test(NAME test_memory SOURCES integration/test_memory.c LIBS pcs_common LABELS integration
             TIMEOUT 300)
add_dependencies(test_memory pcs-coordinator)
# Worker life cycle: no phantom after SIGTERM, a killed worker costs one job and is named first,
# a SIGSTOPped worker is not scheduled.
pcs_add_test(NAME test_lifecycle SOURCES integration/test_lifecycle.c ${PCS_E2E_UTIL}
             LIBS pcs_worker LABELS integration TIMEOUT 300)
set_target_properties(test_lifecycle PROPERTIES LINKER_LANGUAGE CXX)
add_dependencies(test_lifecycle pcs-coordinator pcs-worker)
# Security: a worker credential acts for one worker only (impersonation attempts with a worker
# token refused while a real job trains and succeeds), and the role x method matrix.
pcs_add_test(NAME test_security SOURCES integration/test_security.c ${PCS_E2E_UTIL}
             LIBS pcs_worker LABELS integration TIMEOUT 300)
set_target_properties(test_security PROPERTIES LINKER_LANGUAGE CXX)
add_dependencies(test_security pcs-coordinator pcs-worker)
# Confined files: spec paths outside the workers' roots (climbing, absolute, symlinks out, a FIFO,
# a foreign file's bytes), a symlinked step dir, two jobs and two coordinators on one checkpoint
# root.
pcs_add_test(NAME test_confine SOURCES integration/test_confine.c ${PCS_E2E_UTIL}
             LIBS pcs_worker LABELS integration TIMEOUT 300)
set_target_properties(test_confine PROPERTIES LINKER_LANGUAGE CXX)
add_dependencies(test_confine pcs-coordinator pcs-worker)
# Elastic restarts: a killed rank with a spare (bit-identical to an uninterrupted run), without
# one (shrinks, bit-identical to a run that switches world size), a stopped rank, the budget.
pcs_add_test(NAME test_elastic SOURCES integration/test_elastic.c ${PCS_E2E_UTIL}
             LIBS pcs_worker LABELS integration TIMEOUT 600)
set_target_properties(test_elastic PROPERTIES LINKER_LANGUAGE CXX)
add_dependencies(test_elastic pcs-coordinator pcs-worker)
# The shipped Prometheus alert rules load in Prometheus's own checker and fire exactly on the
# series of their unit tests (deploy/prometheus/alerts.test.yaml), and the Grafana dashboard
# selects no pcs_ series by `job` (Prometheus's own target label; pcs's per-job label is job_id).
add_test(NAME test_prometheus_rules
         COMMAND sh -c "command -v promtool >/dev/null 2>&1 || { [ \"$PCS_REQUIRE_TOOLS\" = 1 ] && exit 1; exit 77; }; cd \"$0\" && promtool check rules alerts.yaml && promtool test rules alerts.test.yaml"
                 ${PROJECT_SOURCE_DIR}/deploy/prometheus)
set_tests_properties(test_prometheus_rules PROPERTIES LABELS integration TIMEOUT 60
                     SKIP_RETURN_CODE 77)
add_test(NAME test_grafana_dashboard
         COMMAND python3 -c "import json,re,sys; d=json.load(open(sys.argv[1])); e=[t['expr'] for p in d['panels'] for t in p.get('targets',[])]; l=[t.get('legendFormat','') for p in d['panels'] for t in p.get('targets',[])]; bad=[x for x in e if re.search(r'pcs_job_step_ms|pcs_\\w+\\{[^}]*\\bjob=\"', x)]+[x for x in l if '{{job}}' in x]; print('\\n'.join(bad)); sys.exit(1 if bad or not e else 0)"
                 ${PROJECT_SOURCE_DIR}/deploy/grafana/pcs-dashboard.json)
set_tests_properties(test_grafana_dashboard PROPERTIES LABELS integration TIMEOUT 60)
