#!/usr/bin/python3
"""Wire compatibility of pcs-coordinator with a stock gRPC stack (Debian python3-grpcio).

Generates Python message classes from proto/ with `protoc --python_out` at test time, starts the
real coordinator on 127.0.0.1:0, and calls it the way any third-party client would: health
Check/Watch, Register, SubmitJob, the WatchAssignment server stream, ListWorkers, plus raw
malformed bytes and an unknown method. Exits 77 (ctest skip) only if grpcio is not installed.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

# a missing tool skips (77), except where PCS_REQUIRE_TOOLS=1 (CI installs them all)
SKIP = 1 if os.environ.get("PCS_REQUIRE_TOOLS") == "1" else 77

try:
    import grpc
except ImportError:  # pragma: no cover - environment without python3-grpcio
    print("SKIP: python3-grpcio is not installed")
    sys.exit(SKIP)

if not shutil.which("protoc"):
    print("SKIP: protoc (protobuf-compiler) is not installed")
    sys.exit(SKIP)

SRC = os.environ.get("PCS_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("PCS_BIN_DIR", os.path.join(os.getcwd(), "bin"))
PROTOS = ["pcs/v1/types.proto", "pcs/v1/job.proto", "pcs/v1/plan.proto", "pcs/v1/worker.proto",
          "pcs/v1/coordinator.proto"]

TMP = tempfile.mkdtemp(prefix="pcs-grpcio-")
subprocess.run(["protoc", "--proto_path=" + os.path.join(SRC, "proto"), "--python_out=" + TMP]
               + PROTOS, check=True)
# health.proto as a top-level module: a generated `grpc` package would shadow grpcio itself
subprocess.run(["protoc", "--proto_path=" + os.path.join(SRC, "proto", "grpc", "health", "v1"),
                "--python_out=" + TMP, "health.proto"], check=True)
sys.path.insert(0, TMP)
from pcs.v1 import coordinator_pb2, job_pb2, plan_pb2, types_pb2, worker_pb2  # noqa: E402
import health_pb2  # noqa: E402
from google.protobuf import descriptor_pb2, descriptor_pool, json_format  # noqa: E402
from google.protobuf import message_factory  # noqa: E402

PENDING, RUNNING, CANCELLED = (types_pb2.JOB_STATE_PENDING, types_pb2.JOB_STATE_RUNNING,
                               types_pb2.JOB_STATE_CANCELLED)
IDLE = types_pb2.WORKER_STATE_IDLE


def read(path):
    with open(path) as f:
        return f.read()


def start_coordinator(tmp):
    port_file = os.path.join(tmp, "port")
    log_path = os.path.join(tmp, "coord.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen([os.path.join(BIN, "pcs-coordinator"), "--listen", "127.0.0.1:0",
                                 "--port-file", port_file, "--lease-ms", "60000"],
                                stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 10
    while time.time() < deadline:
        if os.path.exists(port_file) and read(port_file).strip():
            return proc, int(read(port_file))
        if proc.poll() is not None:
            raise RuntimeError("coordinator exited: " + read(log_path))
        time.sleep(0.02)
    proc.kill()
    raise RuntimeError("coordinator did not write its port file")


def job_spec():
    spec = job_pb2.JobSpec(name="grpcio-job")
    spec.model.mlp.input_dim = 8
    spec.model.mlp.hidden_dims.extend([16, 16])
    spec.model.mlp.output_dim = 4
    spec.mesh.add(dim=types_pb2.MESH_DIM_DP_SHARD, size=2)
    spec.training.steps = 2
    spec.training.micro_batch_size = 2
    spec.training.optimizer.sgd.lr = 0.1
    spec.data.synthetic.seed = 1
    return spec


class CoordinatorInterop(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.proc, port = start_coordinator(TMP)
        cls.addr = "127.0.0.1:%d" % port
        cls.ch = grpc.insecure_channel(cls.addr)
        grpc.channel_ready_future(cls.ch).result(timeout=10)

    @classmethod
    def tearDownClass(cls):
        cls.ch.close()
        if cls.proc.poll() is None:
            cls.proc.send_signal(signal.SIGTERM)
            cls.proc.wait(timeout=10)

    def unary(self, path, req_cls, resp_cls):
        return self.ch.unary_unary(path, request_serializer=req_cls.SerializeToString,
                                   response_deserializer=resp_cls.FromString)

    secrets = {}  # worker id -> its secret; identity -> worker id

    def creds(self, wid):
        """The metadata a worker's calls carry: the secret Register answered it."""
        return (("pcs-worker-secret", self.secrets[wid]),)

    def register(self, identity):
        reg = self.unary("/pcs.v1.WorkerService/Register", worker_pb2.RegisterRequest,
                         worker_pb2.RegisterResponse)
        req = worker_pb2.RegisterRequest(identity=identity, host="py", pid=os.getpid(),
                                         backends=["gloo"])
        req.devices.add(index=0, kind="cpu", name="cpu0", memory_bytes=1 << 30)
        known = self.secrets.get(identity)  # the same process presents what it holds
        resp = reg(req, timeout=5, metadata=self.creds(known) if known else None)
        self.secrets[resp.worker_id] = resp.worker_secret
        self.secrets[identity] = resp.worker_id
        return resp

    def test_01_health_check_serving_and_unknown_service_not_found(self):
        check = self.unary("/grpc.health.v1.Health/Check", health_pb2.HealthCheckRequest,
                           health_pb2.HealthCheckResponse)
        self.assertEqual(check(health_pb2.HealthCheckRequest(service=""), timeout=5).status,
                         health_pb2.HealthCheckResponse.SERVING)
        self.assertEqual(check(health_pb2.HealthCheckRequest(service="pcs.v1.JobService"),
                               timeout=5).status, health_pb2.HealthCheckResponse.SERVING)
        with self.assertRaises(grpc.RpcError) as e:
            check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        # raw bytes: the empty request is service "" -> SERVING (field 1 = 1)
        raw = self.ch.unary_unary("/grpc.health.v1.Health/Check")
        self.assertEqual(raw(b"", timeout=5), b"\x08\x01")

    def test_02_health_watch_streams_current_status(self):
        watch = self.ch.unary_stream("/grpc.health.v1.Health/Watch",
                                     request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                                     response_deserializer=health_pb2.HealthCheckResponse.FromString)
        it = watch(health_pb2.HealthCheckRequest(service=""), timeout=5)
        self.assertEqual(next(it).status, health_pb2.HealthCheckResponse.SERVING)
        it.cancel()

    def test_03_register_is_idempotent_by_identity(self):
        a = self.register("py-0")
        b = self.register("py-0")
        self.assertEqual(a.worker_id, b.worker_id)
        self.assertFalse(a.reregistered)
        self.assertTrue(b.reregistered)
        self.assertEqual(a.lease_ms, 60000)
        self.assertEqual(a.worker_secret, b.worker_secret)  # presented, so kept
        self.assertTrue(a.worker_secret.startswith(a.worker_id + "."))
        # another process claiming the live identity without its secret is refused
        reg = self.unary("/pcs.v1.WorkerService/Register", worker_pb2.RegisterRequest,
                         worker_pb2.RegisterResponse)
        with self.assertRaises(grpc.RpcError) as e:
            reg(worker_pb2.RegisterRequest(identity="py-0", host="py", pid=1), timeout=5)
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("identity py-0 is held by worker", e.exception.details())

    def test_04_submit_gang_start_and_watch_stream_delivers_assignment(self):
        ids = [self.register("py-%d" % i).worker_id for i in range(2)]  # py-0 exists already
        submit = self.unary("/pcs.v1.JobService/SubmitJob", coordinator_pb2.SubmitJobRequest,
                            coordinator_pb2.SubmitJobResponse)
        resp = submit(coordinator_pb2.SubmitJobRequest(request_id="py-req", spec=job_spec()),
                      timeout=5)
        self.assertEqual(resp.job.state, RUNNING)
        self.assertEqual(list(resp.job.workers), ids)
        again = submit(coordinator_pb2.SubmitJobRequest(request_id="py-req", spec=job_spec()),
                       timeout=5)
        self.assertTrue(again.duplicate)
        self.assertEqual(again.job.job_id, resp.job.job_id)
        watch = self.ch.unary_stream(
            "/pcs.v1.WorkerService/WatchAssignment",
            request_serializer=worker_pb2.WatchAssignmentRequest.SerializeToString,
            response_deserializer=worker_pb2.AssignmentEvent.FromString)
        for rank, wid in enumerate(ids):
            it = watch(worker_pb2.WatchAssignmentRequest(worker_id=wid), timeout=5,
                       metadata=self.creds(wid))
            ev = next(it)
            self.assertEqual(ev.WhichOneof("event"), "assignment")
            self.assertEqual(ev.assignment.rank, rank)
            self.assertEqual(ev.assignment.world_size, 2)
            self.assertEqual(ev.assignment.coords.dp_shard, rank)
            self.assertEqual(ev.assignment.spec.name, "grpcio-job")
            self.assertEqual(ev.assignment.plan_hash, resp.job.plan_hash)
            it.cancel()  # client goes away mid-stream
        cancel = self.unary("/pcs.v1.JobService/CancelJob", coordinator_pb2.CancelJobRequest,
                            coordinator_pb2.CancelJobResponse)
        self.assertEqual(cancel(coordinator_pb2.CancelJobRequest(job_id=resp.job.job_id),
                                timeout=5).job.state, CANCELLED)
        # STOPPING until each confirms it left the job: a heartbeat naming no job does
        status = self.unary("/pcs.v1.ClusterService/GetStatus", coordinator_pb2.GetStatusRequest,
                            coordinator_pb2.GetStatusResponse)
        st = status(coordinator_pb2.GetStatusRequest(), timeout=5)
        self.assertEqual((st.workers_stopping, st.workers_idle), (2, 0))
        hb = self.unary("/pcs.v1.WorkerService/Heartbeat", worker_pb2.HeartbeatRequest,
                        worker_pb2.HeartbeatResponse)
        for wid in ids:
            self.assertEqual(hb(worker_pb2.HeartbeatRequest(worker_id=wid), timeout=5,
                                metadata=self.creds(wid)).state, IDLE)
        # one worker's secret does not act for another
        with self.assertRaises(grpc.RpcError) as e:
            hb(worker_pb2.HeartbeatRequest(worker_id=ids[1]), timeout=5,
               metadata=self.creds(ids[0]))
        self.assertEqual(e.exception.code(), grpc.StatusCode.PERMISSION_DENIED)

    def test_05_invalid_spec_names_the_field(self):
        submit = self.unary("/pcs.v1.JobService/SubmitJob", coordinator_pb2.SubmitJobRequest,
                            coordinator_pb2.SubmitJobResponse)
        spec = job_spec()
        spec.training.micro_batch_size = 0
        with self.assertRaises(grpc.RpcError) as e:
            submit(coordinator_pb2.SubmitJobRequest(spec=spec), timeout=5)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("training.micro_batch_size", e.exception.details())

    def test_06_malformed_bytes_and_unknown_method(self):
        raw = self.ch.unary_unary("/pcs.v1.WorkerService/Register")
        with self.assertRaises(grpc.RpcError) as e:
            raw(b"\x0a\xff\xff\xff\xff\x0f", timeout=5)  # string field with an absurd length
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        unknown = self.ch.unary_unary("/pcs.v1.WorkerService/Nope")
        with self.assertRaises(grpc.RpcError) as e:
            unknown(b"", timeout=5)
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNIMPLEMENTED)

    def test_07_list_workers_and_status_after_bad_input(self):
        lw = self.unary("/pcs.v1.ClusterService/ListWorkers", coordinator_pb2.ListWorkersRequest,
                        coordinator_pb2.ListWorkersResponse)
        workers = lw(coordinator_pb2.ListWorkersRequest(), timeout=5).workers
        self.assertEqual(sorted(w.identity for w in workers), ["py-0", "py-1"])
        self.assertEqual(workers[0].devices[0].memory_bytes, 1 << 30)
        st = self.unary("/pcs.v1.ClusterService/GetStatus", coordinator_pb2.GetStatusRequest,
                        coordinator_pb2.GetStatusResponse)(coordinator_pb2.GetStatusRequest(),
                                                           timeout=5)
        self.assertEqual(st.workers_idle, 2)
        self.assertIn("# Coordinator", st.text)

    def test_07b_random_bytes_to_every_method_never_break_the_server(self):
        import random
        rng = random.Random(1234)
        unary = ["Register", "Heartbeat", "KvSet", "KvGet", "ReportStep", "Deregister"]
        paths = ["/pcs.v1.WorkerService/" + m for m in unary]
        paths += ["/pcs.v1.JobService/" + m for m in ["SubmitJob", "GetJob", "ListJobs",
                                                      "CancelJob", "GetPlan", "DryRunPlan"]]
        paths += ["/pcs.v1.ClusterService/ListWorkers", "/pcs.v1.ClusterService/GetStatus",
                  "/grpc.health.v1.Health/Check"]
        streams = ["/pcs.v1.WorkerService/WatchAssignment", "/grpc.health.v1.Health/Watch"]
        # answers a handler may legitimately give to garbage; never UNKNOWN/INTERNAL/UNAVAILABLE
        ok_codes = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                    grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED,
                    grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
                    grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.UNAUTHENTICATED}
        for i in range(40):
            n = rng.choice([0, 1, 2, 5, 17, 64, 300])
            payload = bytes(rng.getrandbits(8) for _ in range(n))
            for path in paths:
                try:
                    self.ch.unary_unary(path)(payload, timeout=1)
                except grpc.RpcError as e:
                    self.assertIn(e.code(), ok_codes, "%s %r: %s" % (path, payload, e.details()))
            for path in streams:
                it = self.ch.unary_stream(path)(payload, timeout=0.3)
                try:
                    next(it)
                except StopIteration:
                    pass
                except grpc.RpcError as e:
                    self.assertIn(e.code(), ok_codes, "%s %r: %s" % (path, payload, e.details()))
                it.cancel()
        check = self.unary("/grpc.health.v1.Health/Check", health_pb2.HealthCheckRequest,
                           health_pb2.HealthCheckResponse)
        self.assertEqual(check(health_pb2.HealthCheckRequest(), timeout=5).status,
                         health_pb2.HealthCheckResponse.SERVING)

    def test_07c_health_proto_is_laid_out_as_upstream(self):
        # one file with the messages and the service, as grpc-proto's grpc/health/v1/health.proto
        svc = health_pb2.DESCRIPTOR.services_by_name["Health"]
        self.assertEqual(health_pb2.DESCRIPTOR.package, "grpc.health.v1")
        self.assertEqual([m.name for m in svc.methods], ["Check", "Watch"])
        self.assertTrue(svc.methods_by_name["Watch"].output_type is
                        health_pb2.HealthCheckResponse.DESCRIPTOR)

    def protoset_pool(self):
        out = subprocess.run([os.path.join(BIN, "pcsctl"), "protoset"], check=True,
                             stdout=subprocess.PIPE).stdout
        fds = descriptor_pb2.FileDescriptorSet.FromString(out)
        pool = descriptor_pool.DescriptorPool()
        for f in fds.file:
            pool.Add(f)
        return pool, message_factory.MessageFactory(pool)

    def test_07d_protoset_lets_a_client_with_no_generated_code_call_every_service(self):
        pool, factory = self.protoset_pool()
        paths = []
        for svc in ("pcs.v1.WorkerService", "pcs.v1.JobService", "pcs.v1.ClusterService",
                    "grpc.health.v1.Health"):
            for m in pool.FindServiceByName(svc).methods:
                paths.append("/%s/%s" % (svc, m.name))
        self.assertIn("/pcs.v1.JobService/SubmitJob", paths)
        self.assertIn("/pcs.v1.WorkerService/WatchAssignment", paths)
        # a dynamic call: message classes from the descriptor set only
        m = pool.FindServiceByName("pcs.v1.ClusterService").methods_by_name["GetStatus"]
        req_cls = factory.GetPrototype(m.input_type)
        resp_cls = factory.GetPrototype(m.output_type)
        call = self.ch.unary_unary("/pcs.v1.ClusterService/GetStatus",
                                   request_serializer=req_cls.SerializeToString,
                                   response_deserializer=resp_cls.FromString)
        st = call(req_cls(), timeout=5)
        self.assertTrue(st.version)
        self.assertGreaterEqual(st.workers_idle + st.workers_stopping, 1)
        # every method in the descriptor set is served (an empty request is refused by the
        # method, never UNIMPLEMENTED), and a method outside it is not
        for path in paths:
            raw = self.ch.unary_unary(path)
            try:
                if "Watch" in path:
                    it = self.ch.unary_stream(path)(b"", timeout=1)
                    next(it, None)
                    it.cancel()
                else:
                    raw(b"", timeout=2)
            except grpc.RpcError as err:
                self.assertNotEqual(err.code(), grpc.StatusCode.UNIMPLEMENTED, path)
        with self.assertRaises(grpc.RpcError) as err:
            self.ch.unary_unary("/pcs.v1.JobService/Nope")(b"", timeout=2)
        self.assertEqual(err.exception.code(), grpc.StatusCode.UNIMPLEMENTED)

    def test_07e_invalid_argument_carries_a_bad_request_detail(self):
        submit = self.unary("/pcs.v1.JobService/SubmitJob", coordinator_pb2.SubmitJobRequest,
                            coordinator_pb2.SubmitJobResponse)
        spec = job_spec()
        spec.training.micro_batch_size = 0
        with self.assertRaises(grpc.RpcError) as e:
            submit(coordinator_pb2.SubmitJobRequest(spec=spec), timeout=5)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        trailer = dict(e.exception.trailing_metadata() or ())
        self.assertIn("grpc-status-details-bin", trailer)
        pool, factory = self.protoset_pool()
        status_cls = factory.GetPrototype(pool.FindMessageTypeByName("google.rpc.Status"))
        bad_cls = factory.GetPrototype(pool.FindMessageTypeByName("google.rpc.BadRequest"))
        status = status_cls.FromString(trailer["grpc-status-details-bin"])
        self.assertEqual(status.code, grpc.StatusCode.INVALID_ARGUMENT.value[0])
        self.assertEqual(status.message, e.exception.details())
        self.assertEqual(len(status.details), 1)
        self.assertEqual(status.details[0].type_url, "type.googleapis.com/google.rpc.BadRequest")
        bad = bad_cls.FromString(status.details[0].value)
        self.assertEqual(len(bad.field_violations), 1)
        # the path from the request message: SubmitJobRequest.spec.training.micro_batch_size
        self.assertEqual(bad.field_violations[0].field, "spec.training.micro_batch_size")
        self.assertTrue(bad.field_violations[0].description)
        self.assertTrue(e.exception.details().startswith(
            "spec.training.micro_batch_size: " + bad.field_violations[0].description))
        # an INVALID_ARGUMENT that names no field (bytes that do not decode) carries no detail
        raw = self.ch.unary_unary("/pcs.v1.JobService/SubmitJob")
        with self.assertRaises(grpc.RpcError) as e:
            raw(b"\xff\xff\xff\xff", timeout=5)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertNotIn("grpc-status-details-bin", dict(e.exception.trailing_metadata() or ()),
                         e.exception.details())

    def test_07f_pcsctl_json_parses_with_protobufs_own_json_parser(self):
        # canonical proto3 JSON: 64-bit values as strings survive any JSON reader exactly
        out = subprocess.run([os.path.join(BIN, "pcsctl"), "--coordinator", self.addr, "--json",
                              "jobs"], check=True, stdout=subprocess.PIPE, text=True).stdout
        jobs = json_format.Parse(out, coordinator_pb2.ListJobsResponse())
        lj = self.unary("/pcs.v1.JobService/ListJobs", coordinator_pb2.ListJobsRequest,
                        coordinator_pb2.ListJobsResponse)
        direct = lj(coordinator_pb2.ListJobsRequest(), timeout=5)
        self.assertGreaterEqual(len(direct.jobs), 1)
        self.assertEqual([j.plan_hash for j in jobs.jobs], [j.plan_hash for j in direct.jobs])
        self.assertEqual([j.state for j in jobs.jobs], [j.state for j in direct.jobs])
        raw = json.loads(out)  # a plain JSON reader sees the hash as an exact string
        self.assertEqual(raw["jobs"][0]["planHash"], str(direct.jobs[0].plan_hash))
        plan_out = subprocess.run([os.path.join(BIN, "pcsctl"), "plan",
                                   os.path.join(SRC, "examples", "hsdp-job.yaml"), "--json"],
                                  check=True, stdout=subprocess.PIPE, text=True).stdout
        plan = json_format.Parse(plan_out, plan_pb2.Plan())
        self.assertEqual(str(plan.hash), json.loads(plan_out)["hash"])
        self.assertEqual(plan.strategy, types_pb2.STRATEGY_HYBRID_SHARD)

    def test_07g_example_json_job_files_parse_with_protobufs_own_json_parser(self):
        ex = os.path.join(SRC, "examples")
        files = [f for f in sorted(os.listdir(ex)) if f.endswith(".json")]
        self.assertTrue(files)
        for f in files:
            spec = json_format.Parse(read(os.path.join(ex, f)), job_pb2.JobSpec())
            self.assertTrue(spec.name, f)

    def test_08_sigterm_exits_zero(self):
        self.proc.send_signal(signal.SIGTERM)
        self.assertEqual(self.proc.wait(timeout=5), 0)


if __name__ == "__main__":
    try:
        result = unittest.main(exit=False, verbosity=2).result
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
    sys.exit(0 if result.wasSuccessful() else 1)
