#!/usr/bin/env python3
"""Checks deploy/: systemd units, the Slurm batch script, Kubernetes manifests,
the Dockerfile and the install rules, against the binaries actually built.

  check_deploy.py --source SRC --build BUILD --bin ftd=PATH --bin ft-worker=PATH ...

Every check is a function returning a list of problems. They run on the real
files (which must have none) and then on deliberately broken copies (which
must each be caught), so a check that cannot fail fails this test.
Exit 0 when all is well, 1 with the problems listed otherwise.
"""
import argparse
import copy
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import yaml

INSTALLED = ("ftd", "ft-worker", "ft-train", "ftctl")
KILL_SLACK_S = 25  # ft-worker: 15 s past the stop deadline before SIGKILL + 10 s report flush
HELP = {}  # binary name -> its --help text


def flags_of(words):
    """The --flags among command-line words (values after '=' dropped)."""
    return [w.split("=", 1)[0] for w in words if w.startswith("--") and len(w) > 2]


def unknown_flags(binary, words):
    return [f"{binary}: {f} is not in '{binary} --help'" for f in flags_of(words) if f not in HELP[binary]]


def flag_value(words, name):
    for i, w in enumerate(words):
        if w == name and i + 1 < len(words):
            return words[i + 1]
        if w.startswith(name + "="):
            return w.split("=", 1)[1]
    return None


# ---------------------------------------------------------------- systemd

def parse_unit(text):
    """{section: [(key, value)]}, with backslash continuations joined."""
    sections, current = {}, None
    text = re.sub(r"\\\n\s*", " ", text)
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), [])
        elif "=" in line and current is not None:
            k, v = line.split("=", 1)
            current.append((k.strip(), v.strip()))
    return sections


def unit_get(unit, section, key):
    values = [v for k, v in unit.get(section, []) if k == key]
    return values[-1] if values else None


def seconds(text):
    m = re.fullmatch(r"(\d+)\s*(s|min|m)?", text or "")
    if not m:
        return None
    return int(m.group(1)) * (60 if m.group(2) in ("min", "m") else 1)


def check_unit(name, text):
    errors = []
    unit = parse_unit(text)
    need = {
        ("Service", "User"): "ftune",
        ("Service", "Restart"): "on-failure",
        ("Service", "KillSignal"): "SIGTERM",
        ("Service", "NoNewPrivileges"): "yes",
        ("Install", "WantedBy"): "multi-user.target",
    }
    for (section, key), want in need.items():
        got = unit_get(unit, section, key)
        if got != want:
            errors.append(f"{name}: [{section}] {key}={got} (want {want})")
    for key in ("EnvironmentFile", "StateDirectory", "TimeoutStopSec", "ExecStart"):
        if not unit_get(unit, "Service", key):
            errors.append(f"{name}: [Service] {key}= is missing")
    exec_start = (unit_get(unit, "Service", "ExecStart") or "").split()
    if not exec_start:
        return errors
    binary = os.path.basename(exec_start[0])
    if not exec_start[0].startswith("/usr/local/bin/") or binary not in INSTALLED:
        errors.append(f"{name}: ExecStart runs {exec_start[0]}, not one of the installed /usr/local/bin/{INSTALLED}")
        return errors
    errors += [f"{name}: {e}" for e in unknown_flags(binary, exec_start[1:])]
    if any("TOKEN" in w for w in exec_start):
        errors.append(f"{name}: a token on the command line (ps shows it); use EnvironmentFile=")
    stop = seconds(unit_get(unit, "Service", "TimeoutStopSec"))
    if binary == "ft-worker":
        grace = flag_value(exec_start, "--stop-grace")
        if grace is None:
            errors.append(f"{name}: ft-worker without --stop-grace")
        elif stop is None or stop <= float(grace) + KILL_SLACK_S:
            errors.append(f"{name}: TimeoutStopSec={stop} does not exceed --stop-grace {grace} + {KILL_SLACK_S} s")
        if unit_get(unit, "Service", "KillMode") != "mixed":
            errors.append(f"{name}: KillMode must be mixed (SIGTERM to ft-worker alone, which stops its trainer)")
    return errors


def systemd_verify(name, text, binaries, workdir):
    """systemd-analyze verify on a copy whose ExecStart points at the built binary.
    Returns (ran, problems)."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        return False, []
    for b in INSTALLED:
        text = text.replace(f"/usr/local/bin/{b} ", f"{binaries[b]} ")
    with open(os.path.join(workdir, name), "w") as f:
        f.write(text)
    instance = name.replace("@.service", "@0.service")  # a template is verified through an instance
    r = subprocess.run([tool, "verify", "--man=no", instance],
                       capture_output=True, text=True, cwd=workdir, timeout=60)
    out = (r.stdout + r.stderr).strip()
    if r.returncode != 0 or out:
        return True, [f"{name}: systemd-analyze verify: rc {r.returncode}: {out}"]
    return True, []


# ---------------------------------------------------------------- Slurm

def check_sbatch_directives(text, stop_grace):
    errors = []
    sig = re.search(r"^#SBATCH\s+--signal=(B:)?(USR1|TERM)@(\d+)\s*$", text, re.M)
    if not sig:
        errors.append("sbatch: no '#SBATCH --signal=B:USR1@N' (or TERM)")
    else:
        if not sig.group(1):
            errors.append("sbatch: --signal without B: goes to job steps, not to the batch shell (ft-worker)")
        if int(sig.group(3)) <= stop_grace + KILL_SLACK_S:
            errors.append(f"sbatch: signal lead {sig.group(3)} s does not exceed stop grace {stop_grace} + {KILL_SLACK_S} s")
    if not re.search(r"^exec\s+\"?\$FT_WORKER", text, re.M):
        errors.append("sbatch: ft-worker is not exec'd, so Slurm's signal would reach bash instead")
    return errors


STUB = """#!/bin/bash
{ echo "pid=$$"; echo "token=${FTUNE_WORKER_TOKEN:-}"; echo "end=${SLURM_JOB_END_TIME:-}";
  for a in "$@"; do echo "arg=$a"; done; } > "$STUB_OUT"
"""


def run_sbatch(script, workdir, env_extra, squeue_output=None):
    """Runs the script with a stub ft-worker first on PATH; returns (rc, stub record, pid)."""
    stub_dir = os.path.join(workdir, "bin")
    os.makedirs(stub_dir, exist_ok=True)
    with open(os.path.join(stub_dir, "ft-worker"), "w") as f:
        f.write(STUB)
    os.chmod(os.path.join(stub_dir, "ft-worker"), 0o755)
    squeue = os.path.join(stub_dir, "squeue")
    if squeue_output is not None:
        with open(squeue, "w") as f:
            f.write(f"#!/bin/sh\necho '{squeue_output}'\n")
        os.chmod(squeue, 0o755)
    elif os.path.exists(squeue):
        os.remove(squeue)
    out = os.path.join(workdir, "stub.out")
    if os.path.exists(out):
        os.remove(out)
    env = {"PATH": stub_dir + ":/usr/bin:/bin", "HOME": workdir, "STUB_OUT": out, "TZ": "UTC",
           "TMPDIR": workdir}
    env.update(env_extra)
    p = subprocess.Popen(["bash", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log, _ = p.communicate(timeout=60)
    record = {"args": [], "log": log}
    if os.path.exists(out):
        for line in open(out).read().splitlines():
            k, v = line.split("=", 1)
            if k == "arg":
                record["args"].append(v)
            else:
                record[k] = v
    return p.returncode, record, p.pid


def check_sbatch_run(script, workdir):
    errors = []
    os.makedirs(os.path.join(workdir, ".config", "ftune"), exist_ok=True)
    with open(os.path.join(workdir, ".config", "ftune", "worker-token"), "w") as f:
        f.write("tok-from-file")
    base = {"FTUNE_DAEMON": "ftd.example.org:7070", "SLURM_JOB_ID": "4242"}
    # 1. Slurm >= 23.02: SLURM_JOB_END_TIME set; the token from the user's file.
    rc, rec, pid = run_sbatch(script, workdir, dict(base, SLURM_JOB_END_TIME="1767225600"))
    if rc != 0 or "pid" not in rec:
        return [f"sbatch: the stub ft-worker did not run (rc {rc}): {rec['log']}"]
    args = rec["args"]
    if flag_value(args, "--daemon") != "ftd.example.org:7070":
        errors.append(f"sbatch: ft-worker got --daemon {flag_value(args, '--daemon')}, not FTUNE_DAEMON: {args}")
    if rec.get("token") != "tok-from-file":
        errors.append(f"sbatch: ft-worker's FTUNE_WORKER_TOKEN is '{rec.get('token')}', not the token file's")
    if any("tok-from-file" in a for a in args):
        errors.append("sbatch: the token is on ft-worker's command line")
    if rec.get("end") != "1767225600":
        errors.append(f"sbatch: SLURM_JOB_END_TIME reached ft-worker as '{rec.get('end')}'")
    if rec.get("pid") != str(pid):
        errors.append(f"sbatch: ft-worker runs as pid {rec.get('pid')}, not as the batch shell {pid} (exec it)")
    errors += [f"sbatch: {e}" for e in unknown_flags("ft-worker", args)]
    # 2. Older Slurm: the end time comes from squeue; the token from the environment wins.
    rc, rec, _ = run_sbatch(script, workdir, dict(base, FTUNE_WORKER_TOKEN="tok-env"),
                            squeue_output="2026-01-01T00:00:00")
    if rec.get("end") != "1767225600":
        errors.append(f"sbatch: without SLURM_JOB_END_TIME the squeue end time gave '{rec.get('end')}' (rc {rc}): {rec['log']}")
    if rec.get("token") != "tok-env":
        errors.append(f"sbatch: FTUNE_WORKER_TOKEN from the environment became '{rec.get('token')}'")
    # 3. No daemon address: a clear error, no worker.
    rc, rec, _ = run_sbatch(script, workdir, {"SLURM_JOB_ID": "4242"})
    if rc == 0 or "pid" in rec or "FTUNE_DAEMON" not in rec["log"]:
        errors.append(f"sbatch: without FTUNE_DAEMON it should fail naming it (rc {rc}): {rec['log']}")
    return errors


def check_sbatch_signal_reaches_real_worker(script, workdir, ft_worker, ft_train):
    """The real ft-worker started by the script exits 0 on SIGUSR1 sent to the batch shell's pid."""
    env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "FT_WORKER": ft_worker, "TMPDIR": workdir,
           "FTUNE_DAEMON": "127.0.0.1:9", "FTUNE_WORKER_TOKEN": "t", "SLURM_JOB_ID": "7",
           "SLURM_JOB_END_TIME": str(int(time.time()) + 3600),
           "FT_WORKER_EXTRA": f"--cpu-memory 1GiB --ft-train {ft_train}"}
    log_path = os.path.join(workdir, "real-worker.log")
    with open(log_path, "w") as log:
        p = subprocess.Popen(["bash", script], env=env, stdout=log, stderr=subprocess.STDOUT)
    time.sleep(2)  # past flag parsing and into its loop
    if p.poll() is not None:
        return [f"sbatch: the real ft-worker exited early ({p.returncode}): {open(log_path).read()}"]
    p.send_signal(signal.SIGUSR1)
    try:
        rc = p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        return [f"sbatch: ft-worker did not stop on SIGUSR1 to the batch shell: {open(log_path).read()[-2000:]}"]
    if rc != 0:
        return [f"sbatch: ft-worker exited {rc} on SIGUSR1 (want 0): {open(log_path).read()[-2000:]}"]
    return []


# ---------------------------------------------------------------- Kubernetes

def k8s_docs(k8s_dir):
    docs = {}
    for name in sorted(os.listdir(k8s_dir)):
        if name.endswith((".yaml", ".yml")):
            with open(os.path.join(k8s_dir, name)) as f:
                docs[name] = [d for d in yaml.safe_load_all(f) if d]
    return docs


def check_k8s(docs, stop_grace_default=30):
    errors = []
    objs = [(f, d) for f, ds in docs.items() for d in ds]
    for f, d in objs:
        for key in ("apiVersion", "kind"):
            if key not in d:
                errors.append(f"{f}: an object without {key}")
    by_kind = {}
    for f, d in objs:
        by_kind.setdefault(d.get("kind"), []).append(d)
    kust = by_kind.get("Kustomization", [])
    if not kust:
        errors.append("k8s: no kustomization.yaml")
    for k in kust:
        for r in k.get("resources", []):
            if r not in docs:
                errors.append(f"kustomization: resource {r} does not exist")
    pvcs = {d["metadata"]["name"] for d in by_kind.get("PersistentVolumeClaim", [])}
    secrets = {(d["metadata"]["name"], key) for d in by_kind.get("Secret", [])
               for key in list(d.get("stringData", {})) + list(d.get("data", {}))}
    services = {d["metadata"]["name"]: d for d in by_kind.get("Service", [])}
    workloads = {d["metadata"]["name"]: d for kind in ("Deployment", "DaemonSet", "StatefulSet")
                 for d in by_kind.get(kind, [])}
    for name in ("ftd", "ft-worker"):
        if name not in workloads:
            errors.append(f"k8s: no workload named {name}")
    if "ftd" not in services:
        errors.append("k8s: no Service named ftd")
    images = set()
    for wname, w in workloads.items():
        spec = w["spec"]["template"]["spec"]
        labels = w["spec"]["template"]["metadata"].get("labels", {})
        if w["spec"].get("selector", {}).get("matchLabels", {}).items() - labels.items():
            errors.append(f"{wname}: selector does not match the pod labels")
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for v in volumes.values():
            claim = v.get("persistentVolumeClaim", {}).get("claimName")
            if claim and claim not in pvcs:
                errors.append(f"{wname}: volume {v['name']} claims {claim}, which no PVC defines")
        for c in spec["containers"]:
            image = c.get("image", "")
            images.add(image)
            if not image or image.endswith(":latest") or ":" not in image:
                errors.append(f"{wname}: container {c['name']} image '{image}' (want a pinned tag)")
            for m in c.get("volumeMounts", []):
                if m["name"] not in volumes:
                    errors.append(f"{wname}: mount {m['name']} has no volume")
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref and (ref["name"], ref["key"]) not in secrets:
                    errors.append(f"{wname}: env {e['name']} reads secret {ref['name']}/{ref['key']}, defined nowhere")
                if "TOKEN" in e["name"] and "value" in e:
                    errors.append(f"{wname}: {e['name']} is a literal; read it from a Secret")
            words = [w for w in c.get("command", []) if w != "--"] + c.get("args", [])
            binary = next((os.path.basename(w) for w in words if os.path.basename(w) in INSTALLED), None)
            if binary is None:
                errors.append(f"{wname}: the container runs none of {INSTALLED}: {words}")
                continue
            errors += [f"{wname}: {e}" for e in unknown_flags(binary, words[words.index(next(
                w for w in words if os.path.basename(w) == binary)) + 1:])]
            ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
            for probe in ("readinessProbe", "livenessProbe"):
                port = c.get(probe, {}).get("httpGet", {}).get("port")
                if port is not None and port not in ports and port not in ports.values():
                    errors.append(f"{wname}: {probe} port {port} is not a container port")
            if binary == "ftd":
                if w["spec"].get("replicas") != 1 or w["spec"].get("strategy", {}).get("type") != "Recreate":
                    errors.append("ftd: must run one replica with strategy Recreate (SQLite has one writer)")
                for flag, pname in (("--listen", "grpc"), ("--http", "http")):
                    value = flag_value(words, flag) or ""
                    if pname not in ports or not value.endswith(f":{ports[pname]}"):
                        errors.append(f"ftd: {flag} {value} does not serve container port {pname} {ports.get(pname)}")
                ann = w["spec"]["template"]["metadata"].get("annotations", {})
                if str(ann.get("prometheus.io/port")) != str(ports.get("http")):
                    errors.append("ftd: the prometheus.io/port annotation is not the HTTP port")
                mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
                if (flag_value(words, "--data-dir") or "") not in mounts:
                    errors.append("ftd: --data-dir is not on a mounted volume (the database would be lost)")
                svc = services.get("ftd")
                if svc:
                    if svc["spec"].get("selector", {}).items() - labels.items():
                        errors.append("Service ftd: selector does not select ftd's pods")
                    for p in svc["spec"]["ports"]:
                        if p["targetPort"] not in ports and p["targetPort"] not in ports.values():
                            errors.append(f"Service ftd: targetPort {p['targetPort']} is not an ftd port")
            if binary == "ft-worker":
                grace = float(flag_value(words, "--stop-grace") or stop_grace_default)
                period = spec.get("terminationGracePeriodSeconds", 30)
                if period <= grace + KILL_SLACK_S:
                    errors.append(f"ft-worker: terminationGracePeriodSeconds {period} does not exceed "
                                  f"--stop-grace {grace} + {KILL_SLACK_S} s")
                gpus = c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
                if not gpus or int(gpus) < 1:
                    errors.append("ft-worker: no nvidia.com/gpu limit")
                daemon = flag_value(words, "--daemon") or ""
                host, _, port = daemon.rpartition(":")
                svc = services.get(host.split(".")[0])
                if not svc or not any(str(p["port"]) == port for p in svc["spec"]["ports"]):
                    errors.append(f"ft-worker: --daemon {daemon} is not a Service port")
                if "lifecycle" in c and "preStop" in c["lifecycle"]:
                    errors.append("ft-worker: a preStop hook delays SIGTERM, which already means 'checkpoint and stop'")
    if len(images) > 1:
        errors.append(f"k8s: ftd and ft-worker use different images {sorted(images)}")
    return errors


# ---------------------------------------------------------------- Dockerfile, install

def check_dockerfile(text):
    errors = []
    if not re.search(r"^FROM\s+\$\{DEBIAN\}|^FROM\s+debian:bookworm", text, re.M) or "bookworm" not in text:
        errors.append("Dockerfile: not based on Debian bookworm")
    for needle, why in (("deploy/install-deps.sh", "dependencies from the project's script"),
                        ("cmake --install", "the install rules"), ("tini", "an init that forwards SIGTERM"),
                        ("USER ", "a non-root user")):
        if needle not in text:
            errors.append(f"Dockerfile: no '{needle}' ({why})")
    return errors


def check_install(build, workdir):
    prefix = os.path.join(workdir, "prefix")
    r = subprocess.run(["cmake", "--install", build, "--prefix", prefix], capture_output=True, text=True)
    if r.returncode != 0:
        return [f"cmake --install failed: {r.stdout[-2000:]}{r.stderr[-2000:]}"]
    errors = []
    for b in INSTALLED:
        if not os.access(os.path.join(prefix, "bin", b), os.X_OK):
            errors.append(f"install: no executable bin/{b} (the units run /usr/local/bin/{b})")
    for f in ("share/ftune/web/index.html", "share/doc/ftune/OPERATIONS.md"):
        if not os.path.exists(os.path.join(prefix, f)):
            errors.append(f"install: no {f}")
    return errors


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--bin", action="append", default=[], help="NAME=PATH of a built binary")
    a = ap.parse_args()
    binaries = dict(b.split("=", 1) for b in a.bin)
    for b in INSTALLED:
        if b not in binaries:
            sys.exit(f"check_deploy: --bin {b}=PATH missing")
        HELP[b] = subprocess.run([binaries[b], "--help"], capture_output=True, text=True).stdout
        if "--" not in HELP[b]:
            sys.exit(f"check_deploy: '{binaries[b]} --help' printed no flags")
    deploy = os.path.join(a.source, "deploy")
    work = tempfile.mkdtemp(prefix="ftune-deploy-")
    problems, caught = [], []

    def expect_caught(what, errors):
        (caught.append(what) if errors else problems.append(f"self-check: a broken {what} was NOT caught"))

    # systemd
    units = {n: open(os.path.join(deploy, "systemd", n)).read()
             for n in sorted(os.listdir(os.path.join(deploy, "systemd"))) if n.endswith(".service")}
    if {"ftd.service"} - units.keys() or not any(n.startswith("ft-worker") for n in units):
        problems.append(f"systemd: want ftd.service and ft-worker[@].service, have {sorted(units)}")
    verified = False
    for n, text in units.items():
        problems += check_unit(n, text)
        d = tempfile.mkdtemp(dir=work)
        ran, errs = systemd_verify(n, text, binaries, d)
        verified |= ran
        problems += errs
    worker_unit = next(n for n in units if n.startswith("ft-worker"))
    expect_caught("unit (bogus flag)", check_unit("x", units["ftd.service"].replace("--log-json", "--no-such-flag")))
    expect_caught("unit (short stop timeout)", check_unit("x", units[worker_unit].replace("TimeoutStopSec=", "TimeoutStopSec=1#")))
    expect_caught("unit (no User=)", check_unit("x", units["ftd.service"].replace("User=ftune", "")))
    if verified:
        _, errs = systemd_verify("bad.service", units["ftd.service"].replace("[Service]", "[Service]\nBogusKey=1"),
                                 binaries, tempfile.mkdtemp(dir=work))
        expect_caught("unit (systemd-analyze: unknown key)", errs)
    else:
        print("check_deploy: systemd-analyze not found; units checked structurally only")

    # Slurm
    script = os.path.join(deploy, "slurm", "ftune-worker.sbatch")
    sbatch = open(script).read()
    problems += check_sbatch_directives(sbatch, 120)
    problems += check_sbatch_run(script, tempfile.mkdtemp(dir=work))
    problems += check_sbatch_signal_reaches_real_worker(script, tempfile.mkdtemp(dir=work), binaries["ft-worker"],
                                                       binaries["ft-train"])
    expect_caught("sbatch (no exec)", check_sbatch_directives(sbatch.replace('exec "$FT_WORKER"', '"$FT_WORKER"'), 120))
    expect_caught("sbatch (signal too late)", check_sbatch_directives(re.sub(r"USR1@\d+", "USR1@60", sbatch), 120))
    no_exec = os.path.join(work, "no-exec.sbatch")
    with open(no_exec, "w") as f:
        f.write(sbatch.replace('exec "$FT_WORKER"', '"$FT_WORKER"'))
    expect_caught("sbatch run (no exec)", check_sbatch_run(no_exec, tempfile.mkdtemp(dir=work)))

    # Kubernetes
    docs = k8s_docs(os.path.join(deploy, "k8s"))
    problems += check_k8s(docs)
    broken = copy.deepcopy(docs)
    broken["ft-worker.yaml"][0]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 60
    expect_caught("k8s (grace period below the stop grace)", check_k8s(broken))
    broken = copy.deepcopy(docs)
    broken["ftd.yaml"][1]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]["name"] = "nope"
    expect_caught("k8s (mount without volume)", check_k8s(broken))
    broken = copy.deepcopy(docs)
    broken["ftd.yaml"][2]["spec"]["ports"][0]["targetPort"] = 9999
    expect_caught("k8s (service port)", check_k8s(broken))

    # Dockerfile and install rules
    dockerfile = open(os.path.join(deploy, "docker", "Dockerfile")).read()
    problems += check_dockerfile(dockerfile)
    expect_caught("Dockerfile (no install-deps)", check_dockerfile(dockerfile.replace("deploy/install-deps.sh", "x")))
    problems += check_install(a.build, work)

    print(f"check_deploy: {len(units)} units{' (systemd-analyze verify)' if verified else ''}, sbatch, "
          f"{sum(len(d) for d in docs.values())} k8s objects, Dockerfile, install; "
          f"{len(caught)} broken copies caught")
    shutil.rmtree(work, ignore_errors=True)
    if problems:
        print("\n".join("FAIL " + p for p in problems))
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
