#!/usr/bin/python3
"""Checks that deploy/'s Kubernetes manifests, compose file and Dockerfile fit together and fit
the server: every document parses and is of a known kind; selectors match the pods' labels;
the StatefulSet's headless Service, volume, ports, probes (the health service names the server
sets), preStop drain, non-root read-only security context and grace period are consistent;
every SLUICE_FLAG_* variable and flag argument names a flag sluice-server defines.
Exits 1 naming each problem. Usage: check_manifests.py REPO_ROOT"""
import json
import os
import re
import sys

import yaml

ROOT = sys.argv[1] if len(sys.argv) > 1 else "."
problems = []


def check(cond, what):
    if not cond:
        problems.append(what)
    return cond


def load(path):
    with open(os.path.join(ROOT, path)) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def server_flags():
    with open(os.path.join(ROOT, "server/server_main.cc")) as f:
        return set(re.findall(r"ABSL_FLAG\(\s*[\w:]+,\s*(\w+),", f.read()))


FLAGS = server_flags()
check(len(FLAGS) > 20, "could not read sluice-server's flags from server/server_main.cc")
with open(os.path.join(ROOT, "server/service/grpc_server.h")) as f:
    READINESS = re.search(r'kReadinessService\[\] = "([^"]+)"', f.read()).group(1)
with open(os.path.join(ROOT, "deploy/Dockerfile")) as f:
    DOCKERFILE = f.read()
USER = re.search(r"^USER (\d+)", DOCKERFILE, re.M)
check(USER is not None, "Dockerfile: no numeric USER (the image must not run as root)")
USER = int(USER.group(1)) if USER else -1
check('VOLUME ["/data"]' in DOCKERFILE, "Dockerfile: no /data volume")
check("sluice-entrypoint" in DOCKERFILE, "Dockerfile: the entrypoint is not deploy/entrypoint.sh")


def check_flag_args(args, where):
    for a in args:
        m = re.match(r"--(\w+)(=|$)", a)
        if m:
            check(m.group(1) in FLAGS, f"{where}: --{m.group(1)} is not a sluice-server flag")


def check_env_flags(env, where):
    for name in env:
        if name.startswith("SLUICE_FLAG_"):
            flag = name[len("SLUICE_FLAG_"):].lower()
            check(flag in FLAGS, f"{where}: {name} names no sluice-server flag (--{flag})")


KNOWN = {("v1", "Namespace"), ("v1", "Service"), ("v1", "ConfigMap"), ("apps/v1", "StatefulSet"),
         ("policy/v1", "PodDisruptionBudget"), ("batch/v1", "Job")}
kust = load("deploy/kubernetes/kustomization.yaml")[0]
docs = []
for r in kust["resources"] + ["../kubernetes/bench-job.yaml"]:
    path = os.path.normpath(os.path.join("deploy/kubernetes", r))
    if check(os.path.exists(os.path.join(ROOT, path)), f"kustomization: {r} is missing"):
        for d in load(path):
            ok = check((d.get("apiVersion"), d.get("kind")) in KNOWN,
                       f"{path}: unknown {d.get('apiVersion')}/{d.get('kind')}")
            check(d.get("metadata", {}).get("name"), f"{path}: a {d.get('kind')} without a name")
            if ok:
                docs.append(d)


def one(kind, name):
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    check(len(found) == 1, f"expected one {kind} {name}, found {len(found)}")
    return found[0] if found else {}


def matches(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


sts = one("StatefulSet", "sluice")
pod = sts.get("spec", {}).get("template", {})
labels = pod.get("metadata", {}).get("labels", {})
spec = pod.get("spec", {})
check(matches(sts["spec"]["selector"]["matchLabels"], labels), "StatefulSet: selector misses its pods")
headless = one("Service", sts["spec"].get("serviceName", ""))
check(headless.get("spec", {}).get("clusterIP") == "None", "StatefulSet's service is not headless")
for svc in [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"].startswith("sluice")
            and "etcd" not in d["metadata"]["name"]]:
    check(matches(svc["spec"]["selector"], labels), f"Service {svc['metadata']['name']} selects no pod")
pdb = one("PodDisruptionBudget", "sluice")
check(matches(pdb.get("spec", {}).get("selector", {}).get("matchLabels", {"x": "y"}), labels),
      "PodDisruptionBudget selects no pod")
sec = spec.get("securityContext", {})
check(sec.get("runAsNonRoot") is True, "pods must run as non-root")
check(sec.get("runAsUser") == USER, f"runAsUser {sec.get('runAsUser')} is not the image's {USER}")
c = spec.get("containers", [{}])[0]
csec = c.get("securityContext", {})
check(csec.get("readOnlyRootFilesystem") is True, "the root filesystem must be read-only")
check(csec.get("allowPrivilegeEscalation") is False, "privilege escalation must be off")
ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
check(ports.get("grpc") == 7070, "the container must expose grpc: 7070 (the image listens there)")
for svc in [d for d in docs if d["kind"] == "Service" and "etcd" not in d["metadata"]["name"]]:
    for p in svc["spec"]["ports"]:
        check(p.get("targetPort") in ports or p.get("targetPort") in ports.values(),
              f"Service {svc['metadata']['name']}: targetPort {p.get('targetPort')} is no container port")
live, ready = c.get("livenessProbe", {}).get("grpc", {}), c.get("readinessProbe", {}).get("grpc", {})
check(live.get("port") == 7070 and not live.get("service"), "liveness: gRPC health, empty service")
check(ready.get("port") == 7070 and ready.get("service") == READINESS,
      f"readiness: gRPC health of service {READINESS!r} (what the server turns NOT_SERVING to drain)")
pre = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
check(len(pre) >= 2 and pre[0].endswith("/sluice") and pre[1] == "drain", "preStop must run sluice drain")
mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
claims = [t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])]
check("data" in claims and mounts.get("data") == "/data", "the data claim must be mounted at /data")
check(mounts.get("tmp") == "/tmp", "/tmp must be writable (KEY merges spill there; the root is read-only)")
check_flag_args(c.get("args", []), "StatefulSet args")
env = {e["name"]: e for e in c.get("env", [])}
check(env.get("SLUICE_FLAG_NODE_ID", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
      == "metadata.name", "the node id must be the pod's name (stable across restarts)")
check_env_flags(env, "StatefulSet env")
cm_names = [e["configMapRef"]["name"] for e in c.get("envFrom", []) if "configMapRef" in e]
for name in cm_names:
    cm = one("ConfigMap", name)
    check_env_flags(cm.get("data", {}), f"ConfigMap {name}")
    grace = int(cm.get("data", {}).get("SLUICE_FLAG_DRAIN_GRACE_S", 30))
    check(spec.get("terminationGracePeriodSeconds", 30) > grace + 5,
          "terminationGracePeriodSeconds must exceed the drain's grace and its 5 s of shutdown")
    etcd = cm.get("data", {}).get("SLUICE_FLAG_ETCD", "")
    check(etcd.split(":")[0].split(".")[-1] in [d["metadata"]["name"] for d in docs
                                                 if d["kind"] == "Service"],
          f"SLUICE_FLAG_ETCD {etcd} names no Service")
    metrics = cm.get("data", {}).get("SLUICE_FLAG_METRICS_LISTEN", "")
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
    check(metrics.endswith(":" + str(ports.get("metrics"))),
          f"the ConfigMap's --metrics_listen ({metrics}) is not the container's metrics port")
    annotations = sts["spec"]["template"]["metadata"].get("annotations", {})
    check(annotations.get("prometheus.io/port") == str(ports.get("metrics")),
          "the prometheus.io/port annotation is not the metrics port")
check(spec.get("enableServiceLinks") is False, "service links would put SLUICE_* variables in the pod")
job = one("Job", "sluice-bench")
jargs = job.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [{}])[0].get("args", [])
check(jargs[:2] == ["sluice", "bench"] and "--servers" in jargs, "the Job must run sluice bench --servers")
if "--servers" in jargs:
    check(jargs[jargs.index("--servers") + 1].startswith(headless["metadata"]["name"] + "."),
          "the Job's --servers must be the headless Service (every server's address)")

compose = load("deploy/compose.yaml")[0]
servers = {n: s for n, s in compose["services"].items() if n.startswith("sluice-")}
check(len(servers) == 3, "compose: three servers")
ids = set()
for n, s in servers.items():
    check_env_flags(s.get("environment", {}), f"compose {n}")
    check_flag_args(s.get("command", []), f"compose {n}")
    ids.add(s.get("environment", {}).get("SLUICE_FLAG_NODE_ID"))
    check(s.get("environment", {}).get("SLUICE_FLAG_ETCD", "").startswith("etcd:"), f"compose {n}: etcd")
check(ids == set(servers), "compose: each server's node id is its service name")
check(os.path.exists(os.path.join(ROOT, "deploy", compose["x-sluice"]["build"]["context"],
                                  compose["x-sluice"]["build"]["dockerfile"])),
      "compose: the build's Dockerfile is missing")

# Metrics: the dashboard and the docs name only what the server exports, and the docs all of it.
with open(os.path.join(ROOT, "server/metrics_scrape.cc")) as f:
    source = f.read()
METRICS = set(re.findall(r'"(sluice_\w+)"', source))
HISTOGRAMS = set(re.findall(r'Histo\(\s*"(sluice_\w+)"', source))
check(len(METRICS) > 20, "could not read the metric names from server/metrics_scrape.cc")
exported = METRICS | {h + s for h in HISTOGRAMS for s in ("_bucket", "_sum", "_count")}
with open(os.path.join(ROOT, "deploy/grafana/sluice-dashboard.json")) as f:
    dashboard = json.load(f)
for panel in dashboard["panels"]:
    for t in panel.get("targets", []):
        for name in re.findall(r"\b(sluice_\w+)", t["expr"]):
            check(name in exported, f"dashboard panel '{panel['title']}': {name} is not exported")
with open(os.path.join(ROOT, "docs/operations.md")) as f:
    ops = f.read()
for name in sorted(METRICS):
    check(f"`{name}`" in ops, f"docs/operations.md does not describe the metric {name}")

for p in problems:
    print("deploy check:", p)
print(f"deploy check: {len(docs)} Kubernetes documents, compose, Dockerfile:",
      "OK" if not problems else f"{len(problems)} problems")
sys.exit(1 if problems else 0)
