#!/usr/bin/env python3
"""Validate rendered Kubernetes manifests offline, strictly, and against pcs's deployment rules.

usage: check_k8s.py NAME=FILE... (each FILE a multi-document YAML stream: `kustomize build`
output or a plain manifest)

Schema: every object is checked against the Kubernetes API types of the official Python client
(Debian python3-kubernetes, generated from the Kubernetes OpenAPI spec): an unknown field, a
value of the wrong type, a missing required field or an unknown kind fails, as `kubectl apply
--validate=strict` would. Rules (what a platform team expects of pcs's manifests): non-root pods
with a RuntimeDefault seccomp profile, containers that drop ALL capabilities and cannot escalate,
requests and limits on every container, Guaranteed QoS for workers, probes on long-running
containers, StatefulSets that name an existing headless Service, volumes that name objects the
render holds (Secrets are created by the operator: only the documented ones), images that are
set (no placeholder registry), a NetworkPolicy for every pod, a PodDisruptionBudget for workers.
Exit 0 when all pass; otherwise every problem is printed as FILE: kind/name: path: problem.
"""
import re
import sys

import yaml
from kubernetes import client
from kubernetes.client import models

# apiVersion/kind -> generated model class name (only kinds pcs ships; anything else fails)
KINDS = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Service"): "V1Service",
    ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
    ("v1", "Secret"): "V1Secret",
    ("apps/v1", "StatefulSet"): "V1StatefulSet",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("batch/v1", "Job"): "V1Job",
    ("networking.k8s.io/v1", "NetworkPolicy"): "V1NetworkPolicy",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
}
# Secrets the operator creates before applying (deploy/README.md), with the keys pods may read
OPERATOR_SECRETS = {"pcs-tls": {"tls.crt", "tls.key", "ca.crt"},
                    "pcs-tokens": {"tokens.conf", "worker-token", "submitter-token",
                                   "viewer-token"}}
CFG = client.Configuration()
CFG.client_side_validation = True

problems = []


def bad(where, msg):
    problems.append("%s: %s" % (where, msg))


QUANTITY_MAPS = re.compile(r"\.(requests|limits|hard|capacity)\.[^\[]+$|\.sizeLimit$")


def quantity_path(path):
    """Fields the client types as str that are resource.Quantity (int-or-string) in the API."""
    return QUANTITY_MAPS.search(path) is not None


def check_type(v, t, path, where):
    """v against the client's type string t (str, int, list[X], dict(str, X), V1Foo, object)."""
    if t == "object":
        return
    if t in ("str", "datetime", "date"):
        if quantity_path(path) and isinstance(v, (int, float)) and not isinstance(v, bool):
            return  # a resource.Quantity: the API server takes `cpu: 2` as well as "2"
        if not isinstance(v, str):
            bad(where, "%s: want a string, got %r" % (path, v))
        return
    if t == "int":
        if not isinstance(v, int) or isinstance(v, bool):
            bad(where, "%s: want an integer, got %r" % (path, v))
        return
    if t == "float":
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            bad(where, "%s: want a number, got %r" % (path, v))
        return
    if t == "bool":
        if not isinstance(v, bool):
            bad(where, "%s: want true/false, got %r" % (path, v))
        return
    m = re.match(r"list\[(.*)\]$", t)
    if m:
        if not isinstance(v, list):
            bad(where, "%s: want a list, got %r" % (path, v))
            return
        for i, e in enumerate(v):
            check_type(e, m.group(1), "%s[%d]" % (path, i), where)
        return
    m = re.match(r"dict\(str, (.*)\)$", t)
    if m:
        if not isinstance(v, dict):
            bad(where, "%s: want a map, got %r" % (path, v))
            return
        for k, e in v.items():
            if not isinstance(k, str):
                bad(where, "%s: key %r is not a string" % (path, k))
            check_type(e, m.group(1), "%s.%s" % (path, k), where)
        return
    cls = getattr(models, t, None)
    if cls is None:
        bad(where, "%s: no API type %s" % (path, t))
        return
    check_model(v, cls, path, where)


def check_model(v, cls, path, where):
    if not isinstance(v, dict):
        bad(where, "%s: want an object (%s), got %r" % (path, cls.__name__, v))
        return
    json_to_attr = {j: a for a, j in cls.attribute_map.items()}
    kwargs = {}
    for k, e in v.items():
        if k not in json_to_attr:
            bad(where, "%s: unknown field %r (%s has no such field)" % (path or ".", k,
                                                                      cls.__name__))
            continue
        a = json_to_attr[k]
        check_type(e, cls.openapi_types[a], "%s.%s" % (path, k) if path else k, where)
        kwargs[a] = e
    try:  # the generated setters reject missing required fields and values outside an enum
        cls(local_vars_configuration=CFG, **kwargs)
    except ValueError as ex:
        bad(where, "%s: %s" % (path or ".", ex))


def pod_spec(obj):
    k = obj.get("kind")
    if k in ("StatefulSet", "Deployment", "Job"):
        return obj.get("spec", {}).get("template", {})
    return None


def check_rules(objs, where_of, is_job_only):
    by_kind = {}
    for o in objs:
        by_kind.setdefault(o["kind"], {})[o["metadata"]["name"]] = o
    services = by_kind.get("Service", {})
    configmaps = by_kind.get("ConfigMap", {})
    pvcs = by_kind.get("PersistentVolumeClaim", {})
    policies = list(by_kind.get("NetworkPolicy", {}).values())
    pdbs = list(by_kind.get("PodDisruptionBudget", {}).values())
    for o in objs:
        w = where_of(o)
        tmpl = pod_spec(o)
        if tmpl is None:
            continue
        labels = tmpl.get("metadata", {}).get("labels", {}) or {}
        spec = tmpl.get("spec", {})
        psc = spec.get("securityContext", {}) or {}
        if psc.get("runAsNonRoot") is not True:
            bad(w, "pod securityContext.runAsNonRoot must be true")
        if (psc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
            bad(w, "pod securityContext.seccompProfile.type must be RuntimeDefault")
        if spec.get("automountServiceAccountToken") is not False:
            bad(w, "automountServiceAccountToken must be false (pcs pods call no Kubernetes API)")
        if spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC"):
            bad(w, "no host namespaces")
        long_running = o["kind"] != "Job"
        worker = labels.get("app") == "pcs-worker"
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            cw = "%s: container %s" % (w, c.get("name"))
            sc = c.get("securityContext", {}) or {}
            if sc.get("allowPrivilegeEscalation") is not False:
                bad(cw, "securityContext.allowPrivilegeEscalation must be false")
            if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
                bad(cw, "securityContext.capabilities.drop must hold ALL")
            if sc.get("privileged"):
                bad(cw, "must not be privileged")
            if sc.get("readOnlyRootFilesystem") is not True:
                bad(cw, "securityContext.readOnlyRootFilesystem must be true")
            img = c.get("image", "")
            if not img or "example.invalid" in img or ":" not in img.split("/")[-1]:
                bad(cw, "image %r: an overlay must set a name with a tag" % img)
            res = c.get("resources", {}) or {}
            req, lim = res.get("requests") or {}, res.get("limits") or {}
            for r in ("cpu", "memory"):
                if r not in req or r not in lim:
                    bad(cw, "resources: requests and limits of %s" % r)
            if worker and req != lim:
                bad(cw, "workers are Guaranteed QoS: requests must equal limits (%r vs %r)"
                    % (req, lim))
            if long_running and not (c.get("livenessProbe") and c.get("readinessProbe")):
                bad(cw, "long-running containers need a livenessProbe and a readinessProbe")
            for e in c.get("env", []) or []:
                ref = (e.get("valueFrom") or {}).get("secretKeyRef")
                if ref and (ref["name"] not in OPERATOR_SECRETS
                            or ref["key"] not in OPERATOR_SECRETS[ref["name"]]):
                    bad(cw, "env %s reads secret %s key %s: not one deploy/README.md creates"
                        % (e["name"], ref["name"], ref["key"]))
        for v in spec.get("volumes", []) or []:
            if "configMap" in v and v["configMap"]["name"] not in configmaps:
                bad(w, "volume %s: ConfigMap %s is not in the render" % (v["name"],
                                                                        v["configMap"]["name"]))
            if "secret" in v:
                sname = v["secret"]["secretName"]
                if sname not in OPERATOR_SECRETS:
                    bad(w, "volume %s: Secret %s is not one deploy/README.md creates"
                        % (v["name"], sname))
                for it in v["secret"].get("items", []) or []:
                    if it["key"] not in OPERATOR_SECRETS.get(sname, set()):
                        bad(w, "volume %s: Secret %s has no key %s" % (v["name"], sname,
                                                                      it["key"]))
            if "persistentVolumeClaim" in v and not is_job_only:
                if v["persistentVolumeClaim"]["claimName"] not in pvcs:
                    bad(w, "volume %s: PersistentVolumeClaim %s is not in the render"
                        % (v["name"], v["persistentVolumeClaim"]["claimName"]))
            if v.get("hostPath"):
                bad(w, "volume %s: no hostPath" % v["name"])
        if o["kind"] == "StatefulSet":
            svc = services.get(o["spec"].get("serviceName"))
            if svc is None:
                bad(w, "serviceName %r names no Service in the render" % o["spec"].get(
                    "serviceName"))
            elif svc["spec"].get("clusterIP") != "None":
                bad(w, "serviceName %r must be a headless Service (clusterIP: None)"
                    % svc["metadata"]["name"])
            sel = o["spec"]["selector"].get("matchLabels", {})
            if any(labels.get(k) != v for k, v in sel.items()):
                bad(w, "selector %r does not match the pod labels %r" % (sel, labels))
        if not is_job_only:
            def selects(pol):
                ml = pol["spec"]["podSelector"].get("matchLabels") or {}
                return all(labels.get(k) == v for k, v in ml.items())
            if not any(selects(p) for p in policies):
                bad(w, "no NetworkPolicy selects these pods")
            if worker and not any(all(labels.get(k) == v for k, v in
                                      (p["spec"]["selector"].get("matchLabels") or {}).items())
                                  for p in pdbs):
                bad(w, "no PodDisruptionBudget covers the workers")
    for s in services.values():
        sel = s["spec"].get("selector") or {}
        if sel and not any(all((pod_spec(o).get("metadata", {}).get("labels") or {}).get(k) == v
                               for k, v in sel.items())
                           for o in objs if pod_spec(o) is not None):
            bad(where_of(s), "selector %r selects no pod template in the render" % sel)


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    total = 0
    for arg in argv[1:]:
        name, _, path = arg.partition("=")
        with open(path, encoding="utf-8") as f:
            docs = [d for d in yaml.safe_load_all(f) if d is not None]
        objs = []
        for d in docs:
            kind = (d.get("apiVersion"), d.get("kind"))
            meta = d.get("metadata") or {}
            where = "%s: %s/%s" % (name, d.get("kind"), meta.get("name"))
            if kind not in KINDS:
                bad(where, "unknown apiVersion/kind %s/%s" % kind)
                continue
            check_model(d, getattr(models, KINDS[kind]), "", where)
            objs.append(d)
        job_only = all(o["kind"] in ("Job", "ConfigMap") for o in objs)
        check_rules(objs, lambda o: "%s: %s/%s" % (name, o["kind"], o["metadata"]["name"]),
                    job_only)
        total += len(objs)
        print("%s: %d objects" % (name, len(objs)))
    for p in problems:
        print("FAIL " + p)
    if not problems:
        print("ok: %d objects valid (Kubernetes API types of python3-kubernetes %s) and within "
              "the rules" % (total, getattr(__import__("kubernetes"), "__version__", "?")))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
