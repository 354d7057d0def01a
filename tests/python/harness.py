"""The processes of the Python tests: a real pcs-coordinator on 127.0.0.1:0 in a temporary
directory (stopped by pid, its directory kept when a test fails), jobs submitted with pcsctl
(the user story), rank processes started with this build's libpcs_worker."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = None


def set_build(path):
    """The build directory whose bin/ and lib/ the tests use."""
    global BUILD
    BUILD = os.path.abspath(path)


def binary(name):
    return os.path.join(BUILD, "bin", name)


class Cluster:
    """A coordinator on 127.0.0.1:0 in a temporary directory, stopped by pid."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="pcs-py-")
        port_file = os.path.join(self.dir, "coord.port")
        self.log = open(os.path.join(self.dir, "coord.log"), "w")
        self.coord = subprocess.Popen(
            [binary("pcs-coordinator"), "--listen", "127.0.0.1:0", "--port-file", port_file,
             "--db", ":memory:", "--lease-ms", "5000"], stdout=self.log, stderr=subprocess.STDOUT)
        t0 = time.time()
        port = ""
        while not port:
            if time.time() - t0 > 15 or self.coord.poll() is not None:
                raise RuntimeError("pcs-coordinator did not start (log %s)" % self.log.name)
            time.sleep(0.05)
            if os.path.exists(port_file):
                with open(port_file) as f:
                    port = f.read().strip()
        self.addr = "127.0.0.1:%d" % int(port)
        self.ranks = []

    def env(self):
        """The environment of a rank process: this build's libpcs_worker, one BLAS thread."""
        return dict(os.environ, PCS_WORKER_LIBRARY=os.path.join(BUILD, "lib",
                                                                "libpcs_worker.so.0"),
                    OMP_NUM_THREADS="1")

    def pcsctl(self, *args):
        return subprocess.run([binary("pcsctl"), "--coordinator", self.addr] + list(args),
                              capture_output=True, text=True, timeout=30)

    def submit(self, spec):
        path = os.path.join(self.dir, "job.json")
        with open(path, "w") as f:
            json.dump(spec, f, indent=1)
        r = self.pcsctl("--json", "submit", path)
        if r.returncode != 0:
            raise AssertionError("pcsctl submit: %s%s" % (r.stdout, r.stderr))
        return json.loads(r.stdout)["job"]

    def start_ranks(self, case_name, n):
        outs = []
        for i in range(n):
            out = os.path.join(self.dir, "rank%d.pt" % i)
            log = open(os.path.join(self.dir, "rank%d.log" % i), "w")
            env = self.env()
            p = subprocess.Popen([sys.executable, os.path.join(HERE, "rank.py"), "--case",
                                  case_name, "--coordinator", self.addr, "--identity",
                                  "torch-%d-%d" % (os.getpid(), i), "--out", out],
                                 stdout=log, stderr=subprocess.STDOUT, env=env)
            self.ranks.append((p, log))
            outs.append(out)
        return outs

    def wait_ranks(self, timeout=240):
        t0 = time.time()
        codes = []
        for p, log in self.ranks:
            try:
                codes.append(p.wait(timeout=max(1, timeout - (time.time() - t0))))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait())
            log.close()
        return codes

    def logs(self):
        txt = []
        for i in range(len(self.ranks)):
            with open(os.path.join(self.dir, "rank%d.log" % i)) as f:
                txt.append("--- rank %d\n%s" % (i, f.read()[-4000:]))
        return "\n".join(txt)

    def stop(self, keep=False):
        for p, _ in self.ranks:
            if p.poll() is None:
                p.kill()
                p.wait()
        if self.coord.poll() is None:
            self.coord.send_signal(signal.SIGTERM)
            try:
                self.coord.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.coord.kill()
                self.coord.wait()
        self.log.close()
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)
