#!/usr/bin/env bash
# The user's job through the control plane on a GPU machine, with a SIGTERM
# mid-run and a resume: ftd + one ft-worker run a LoRA job with
# `resources.device: cuda` (submitted with ftctl); once it is RUNNING past a
# few dozen steps the worker gets SIGTERM (a spot node's shutdown); the job
# must record a preemption with steps_lost 0 (a checkpoint on the signal), a
# second ft-worker picks it up from that checkpoint and finishes it; then the
# same job runs uninterrupted with `ft-train run` on the same device and the
# two final adapters are compared (byte-identical, or the max abs / relative
# difference).
#
# The binaries are not built here: they come prebuilt (Debian 12, CUDA 13,
# sm_90) in .carry/cluster.tar.xz with every library they need except glibc's
# and CUDA's (bench/gpu/cluster-carry.sh makes it); the machine needs glibc
# >= the version printed from the archive's glibc.txt, libcudart.so.13 and
# libcublasLt.so.13 (/usr/local/cuda, or Python's nvidia wheels), python3.
#
# Run (from the repository root on the GPU machine; the device tool):
#   carry   [".carry/cluster.tar.xz"]
#   command "bench/gpu/cluster_sigterm.sh"
# Before, on the development machine: bench/gpu/cluster-carry.sh [BIN_DIR].
#
# Writes $OUT/cluster.md (device, checks, job timeline, preemption record,
# tokens/s, peak memory, adapter comparison) and $OUT/cluster-logs.tar.gz
# (every log, the job's status/events/metrics JSON). Everything is
# time-bounded: the whole run stops itself after FT_CLUSTER_BUDGET_S (225 s).
# Exit status: 0 only when every check passed; 1 otherwise (also on a missing
# library, no GPU, or the budget running out).
#
# Environment (all optional):
#   FT_CLUSTER_DEVICE  cuda (default) | cpu: a dry run on a machine without a
#                      GPU (resources.device: cpu, no nvidia-smi, a smaller
#                      model; where a GPU is visible, ft-worker offers only it)
#   FT_CLUSTER_STEPS   the job's steps (default: calibrated so the job takes
#                      about FT_CLUSTER_TARGET_S: 35 s on cuda, 10 s on cpu)
#   FT_CLUSTER_SHAPE   medium (default on cuda: 8 layers, hidden 1024, seq 512,
#                      ~100M parameters) | small (bench/gpu/small-llama, seq 128)
#   FT_CLUSTER_WORK    scratch directory (default /tmp/ftcluster-run)
#   FT_CLUSTER_UNPACK  where the archive is unpacked (default /tmp/ftcluster)
#   FT_CLUSTER_PORT / FT_CLUSTER_HTTP_PORT  ftd's ports (default 0: any free)
#   FT_CLUSTER_BUDGET_S  wall-clock budget of the whole run (default 225)
#   FT_CLUSTER_FORCE_COMPAT=1  use the carried libstdc++ even where the machine's would do
set -uo pipefail
t0=$EPOCHREALTIME
root=$(cd "$(dirname "$0")/../.." && pwd)
device=${FT_CLUSTER_DEVICE:-cuda}
case "$device" in cuda | cpu) ;; *) echo "FT_CLUSTER_DEVICE must be cuda or cpu" >&2 && exit 1 ;; esac
if [ "$device" = cuda ]; then shape=${FT_CLUSTER_SHAPE:-medium}; else shape=${FT_CLUSTER_SHAPE:-small}; fi
if [ "$device" = cuda ]; then target_s=${FT_CLUSTER_TARGET_S:-35}; else target_s=${FT_CLUSTER_TARGET_S:-10}; fi
out=${OUT:-$root/runs/cluster-sigterm}
work=${FT_CLUSTER_WORK:-/tmp/ftcluster-run}
unpack=${FT_CLUSTER_UNPACK:-/tmp/ftcluster}
carry=${FT_CLUSTER_CARRY:-$root/.carry/cluster.tar.xz}
budget=${FT_CLUSTER_BUDGET_S:-225}
# Loopback only: a proxy from the environment must not catch gRPC or urllib.
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY grpc_proxy all_proxy ALL_PROXY no_proxy NO_PROXY

rm -rf "$work"
mkdir -p "$out" "$work/logs" "$work/job"
logs=$work/logs
exec > >(tee -a "$logs/script.log") 2>&1

# ---- bookkeeping ---------------------------------------------------------------
failed=0
completed=0
now_ms() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }
elapsed() { awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME - $t0}"; }
say() { echo "== [$(elapsed) s] $*"; }
# check NAME OK(1/0) DETAIL: one line of the summary's checks table.
check() {
  local status=PASS
  if [ "$2" != 1 ]; then status=FAIL && failed=1; fi
  printf '%s\t%s\t%s\n' "$status" "$1" "$3" >> "$work/checks.tsv"
  say "$status $1: $3"
}
# mark TEXT: a moment of this script on the job's timeline.
mark() { printf '%s\t%s\n' "$(now_ms)" "$1" >> "$work/marks.tsv"; }
# phase NAME SECONDS
phase() { printf '%s\t%s\n' "$1" "$2" >> "$work/phases.tsv"; }
left() { awk "BEGIN{printf \"%d\", $budget - ($EPOCHREALTIME - $t0)}"; }
# cap SECONDS: SECONDS, or what is left of the budget less a margin for the summary.
cap() {
  local l
  l=$(($(left) - 12))
  [ "$l" -lt 1 ] && l=1
  [ "$1" -lt "$l" ] && echo "$1" || echo "$l"
}
touch "$work/checks.tsv" "$work/marks.tsv" "$work/phases.tsv"
: > "$work/env.tsv"
kv() { printf '%s\t%s\n' "$1" "$2" >> "$work/env.tsv"; }

pids=()
# Every ft-train this run started (their command lines name $work), by pid.
our_trainers() {
  local p cmd
  for p in /proc/[0-9]*; do
    { cmd=$(tr '\0' ' ' < "$p/cmdline"); } 2> /dev/null || continue
    case "$cmd" in *ft-train*"$work/"*) echo "${p#/proc/}" ;; esac
  done
}
stop_all() {
  local p
  for p in "${pids[@]}" $(our_trainers); do kill -9 "$p" 2> /dev/null; done
  [ ${#pids[@]} -gt 0 ] && wait "${pids[@]}" 2> /dev/null
  pids=()
  stop_smi
}
# The nvidia-smi memory sampler (cuda only): stop it and keep its peak.
smi_pid=""
stop_smi() {
  [ -n "$smi_pid" ] || return 0
  kill "$smi_pid" 2> /dev/null
  wait "$smi_pid" 2> /dev/null
  smi_pid=""
  local peak
  peak=$(awk '$1 + 0 > m {m = $1 + 0} END {print m + 0}' "$logs/smi-memory-used-mib.txt" 2> /dev/null)
  [ -n "$peak" ] && [ "$peak" != 0 ] && kv smi_peak_mib "$peak"
}
# is CMD...: 1 when CMD succeeds, else 0.
is() { "$@" && echo 1 || echo 0; }
finish() {
  trap - EXIT TERM INT
  [ -n "${watchdog:-}" ] && kill "$watchdog" 2> /dev/null
  stop_all
  kv total_wall_s "$(elapsed)"
  [ $completed = 1 ] || check "run completed" 0 "stopped early (see script.log)"
  if ! python3 "$work/ftc.py" report "$work" "$out/cluster.md"; then
    { echo "# cluster_sigterm.sh: the report failed (see script.log); checks:" && cat "$work/checks.tsv"; } > "$out/cluster.md"
  fi
  cp "$out/cluster.md" "$logs/" 2> /dev/null
  cp "$work"/*.tsv "$work"/job/*.yaml "$work"/job/config.json "$logs/" 2> /dev/null
  tar -czf "$out/cluster-logs.tar.gz" -C "$work" logs 2> /dev/null
  say "wrote $out/cluster.md and $out/cluster-logs.tar.gz; $( [ $failed = 0 ] && echo 'all checks passed' || echo 'SOME CHECKS FAILED')"
  [ $failed = 0 ] && exit 0
  exit 1
}
trap finish EXIT
trap 'say "budget of $budget s spent or signal: stopping"; check "within budget" 0 "stopped after $(elapsed) s"; exit 1' TERM INT
# The watchdog holds no pipe open and leaves at most a 0.5 s sleep behind when killed.
(
  exec > /dev/null 2>&1
  for ((i = 0; i < budget * 2; i++)); do sleep 0.5; done
  kill -TERM $$
) &
watchdog=$!

# ---- Python helpers (JSON polling, HTTP, comparison, report) --------------------
cat > "$work/ftc.py" << 'PY'
import json, math, os, statistics, struct, subprocess, sys, time, urllib.request

def I(d, k):
    """An int64 field of proto JSON (a string, absent when 0)."""
    return int(d.get(k, 0) or 0)

def load(path, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default

def jsonl(path):
    rows = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass
    except OSError:
        pass
    return rows

def poll(argv):
    """poll TIMEOUT_S SAVE PRED [kill=PID marks=FILE] -- CMD...: runs CMD (JSON on stdout; or
    GETs it when CMD is a URL) until PRED(j) holds; then sends SIGTERM to PID at once (and notes
    it in FILE, with ftd's step at that moment)."""
    timeout, save, pred = float(argv[0]), argv[1], argv[2]
    opts = dict(a.split("=", 1) for a in argv[3:argv.index("--")])
    cmd = argv[argv.index("--") + 1:]
    env = dict(os.environ, LD_LIBRARY_PATH=os.environ.get("FTC_LD", ""))
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    end, last, shown = time.time() + timeout, None, None
    while time.time() < end:
        if cmd[0].startswith("http"):  # ftd's JSON API: no process to start per poll
            try:
                with opener.open(cmd[0], timeout=5) as r:
                    text, rc = r.read().decode(), 0
            except Exception:
                text, rc = "", 1
        else:
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, timeout=20)
            text, rc = r.stdout, r.returncode
        if rc == 0:
            try:
                j = json.loads(text)
            except ValueError:
                j = None
            if j is not None:
                last = j
                with open(save, "w") as f:
                    json.dump(j, f, indent=1)
                if "state" in j:
                    now = (j.get("state"), I(j, "steps_done") // 10, j.get("worker_id", ""))
                    if now != shown:
                        shown = now
                        print(f"   {j.get('state').upper()} step {I(j, 'steps_done')}/{I(j, 'total_steps')} "
                              f"on {j.get('worker_id', '-')}, committed {I(j, 'committed_step')}, "
                              f"preemptions {I(j, 'preemptions')}, {j.get('tokens_per_s', 0):.0f} tokens/s",
                              flush=True)
                if eval(pred, {"I": I, "j": j}):
                    if "kill" in opts:
                        import signal
                        os.kill(int(opts["kill"]), signal.SIGTERM)
                        with open(opts["marks"], "a") as f:
                            f.write(f"{int(time.time() * 1000)}\tSIGTERM to ft-worker (pid {opts['kill']}); "
                                    f"ftd's progress: step {I(j, 'steps_done')}\n")
                    return 0
        time.sleep(0.1)
    print(f"   timed out after {timeout:.0f} s waiting for: {pred}", flush=True)
    return 1

def get(argv):
    """get FILE EXPR: prints EXPR evaluated on the JSON in FILE."""
    j = load(argv[0], {})
    print(eval(argv[1], {"I": I, "j": j}))
    return 0

def http(argv):
    """http URL OUTFILE"""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(argv[0], timeout=10) as r:
            data = r.read()
    except Exception as e:
        print(f"   GET {argv[0]}: {e}")
        return 1
    with open(argv[1], "wb") as f:
        f.write(data)
    return 0

def data(argv):
    """data PATH ROWS SEQ VOCAB SEED: random token rows."""
    import random
    path, rows, seq, vocab, seed = argv[0], int(argv[1]), int(argv[2]), int(argv[3]), int(argv[4])
    r = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(rows):
            f.write(json.dumps({"input_ids": [r.randrange(3, vocab) for _ in range(seq)]}) + "\n")
    return 0

def steptime(argv):
    """steptime METRICS_JSONL: median step_seconds after the first two steps."""
    rows = [r for r in jsonl(argv[0]) if "step_seconds" in r]
    t = [r["step_seconds"] for r in rows[2:]] or [r["step_seconds"] for r in rows]
    if not t:
        return 1
    print(f"{statistics.median(t):.6f}")
    return 0

def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        blob = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        raw = blob[a:b]
        if t["dtype"] == "F32":
            out[name] = struct.unpack(f"<{len(raw) // 4}f", raw)
        elif t["dtype"] == "BF16":
            out[name] = [struct.unpack("<f", b"\0\0" + raw[i:i + 2])[0] for i in range(0, len(raw), 2)]
        elif t["dtype"] == "F16":
            out[name] = struct.unpack(f"<{len(raw) // 2}e", raw)
        else:
            raise SystemExit(f"{path}: {name}: dtype {t['dtype']}")
    return out

def losses(path):
    got = {}
    for r in jsonl(path):
        if "loss" in r and "step" in r and "event" not in r:
            got[int(r["step"])] = r["loss"]  # the newest line of a step (a resumed run may repeat one)
    return got

def compare(argv):
    """compare OUT_A OUT_B RESULT_JSON: the two runs' adapters and per-step losses."""
    a_dir, b_dir, result = argv
    fa = os.path.join(a_dir, "adapter", "adapter_model.safetensors")
    fb = os.path.join(b_dir, "adapter", "adapter_model.safetensors")
    res = {"a": fa, "b": fb}
    try:
        ba, bb = open(fa, "rb").read(), open(fb, "rb").read()
    except OSError as e:
        res["error"] = str(e)
        json.dump(res, open(result, "w"), indent=1)
        print(f"   adapter comparison: {e}")
        return 1
    res["bytes"] = [len(ba), len(bb)]
    res["identical"] = ba == bb
    ta, tb = read_safetensors(fa), read_safetensors(fb)
    res["tensors"] = len(tb)
    res["same_names"] = sorted(ta) == sorted(tb)
    max_abs, diff2, norm2, n = 0.0, 0.0, 0.0, 0
    for k in tb:
        for x, y in zip(ta.get(k, ()), tb[k]):
            d = abs(x - y)
            max_abs = max(max_abs, d)
            diff2 += d * d
            norm2 += y * y
            n += 1
    res["values"] = n
    res["max_abs"] = max_abs
    res["rel_norm"] = math.sqrt(diff2 / norm2) if norm2 > 0 else 0.0
    la, lb = losses(os.path.join(a_dir, "metrics.jsonl")), losses(os.path.join(b_dir, "metrics.jsonl"))
    common = sorted(set(la) & set(lb))
    res["loss_steps"] = [len(la), len(lb), len(common)]
    res["loss_max_abs"] = max((abs(la[s] - lb[s]) for s in common), default=None)
    res["loss_identical"] = all(la[s] == lb[s] for s in common) and len(common) == len(lb)
    if common:
        res["loss_first_last"] = [lb[common[0]], lb[common[-1]]]
    json.dump(res, open(result, "w"), indent=1)
    print(f"   adapters: {'byte-identical' if res['identical'] else 'differ'} ({len(bb)} bytes, {n} values, "
          f"max abs {max_abs:.3e}, rel {res['rel_norm']:.3e}); losses over {len(common)} steps: "
          f"{'identical' if res['loss_identical'] else 'max abs %s' % res['loss_max_abs']}", flush=True)
    return 0

def tsv(path):
    try:
        with open(path) as f:
            return [line.rstrip("\n").split("\t") for line in f if line.strip()]
    except OSError:
        return []

def gib(b):
    if not b:
        return "—"
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"

def report(argv):
    work, dest = argv
    logs = os.path.join(work, "logs")
    env = dict((r[0], r[1]) for r in tsv(os.path.join(work, "env.tsv")) if len(r) > 1)
    checks = tsv(os.path.join(work, "checks.tsv"))
    ok = checks and all(c[0] == "PASS" for c in checks)
    job = load(os.path.join(logs, "job-status.json"), {}) or {}
    events = (load(os.path.join(logs, "job-events.json"), {}) or {}).get("events", [])
    metrics = (load(os.path.join(logs, "job-metrics.json"), {}) or {}).get("points", [])
    memory = load(os.path.join(logs, "job-memory.json"), {}) or {}
    cmp = load(os.path.join(work, "compare.json"), {}) or {}
    cmp2 = load(os.path.join(work, "compare-ref2.json"), None)
    L = []
    w = L.append
    w("# The user's job through ftd + ft-worker, SIGTERM mid-run and resume")
    w("")
    w(f"Written by `bench/gpu/cluster_sigterm.sh` on **{env.get('device_name', '?')}**, "
      f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; `resources.device: {env.get('device', '?')}`.")
    w(f"Machine: {env.get('os', '?')}, {env.get('glibc', '?')}; binaries from `.carry/cluster.tar.xz` "
      f"(built with {env.get('carry_built', '?')}; they need {env.get('needs', '?')}); libstdc++: {env.get('libstdcxx', '?')}; "
      f"CUDA libraries from {env.get('cuda_libs', '?')}.")
    w("")
    w(f"**Result: {'all checks passed' if ok else 'FAILED'}** (whole run {env.get('total_wall_s', '?')} s wall).")
    w("")
    w("## Checks")
    w("")
    w("| | check | detail |")
    w("|---|---|---|")
    for c in checks:
        w(f"| {c[0]} | {c[1]} | {c[2] if len(c) > 2 else ''} |")
    w("")
    w("## The job")
    w("")
    w(f"- model: {env.get('shape_desc', '?')} (random weights, `ft-train make-model`)")
    w(f"- LoRA r={env.get('lora_r', '?')} on all 7 linears, fp32, seq {env.get('seq', '?')}, global batch "
      f"{env.get('batch', '?')} (micro-batch {env.get('micro', '?')}), {env.get('steps', '?')} steps "
      f"({env.get('steps_why', '')}), checkpoint every {env.get('every', '?')} steps; SIGTERM once past step "
      f"{env.get('stop_at', '?')}")
    w(f"- job id {job.get('id', '?')}, state {job.get('state', '?')}, steps {I(job, 'steps_done')}/"
      f"{I(job, 'total_steps')}, committed {I(job, 'committed_step')}, preemptions {I(job, 'preemptions')}, "
      f"failures {I(job, 'failures')}, final loss {job.get('last_loss', float('nan')):.4f}")
    w("")
    w("### Attempts (the preemption record, `ftctl --json status`)")
    w("")
    w("| # | epoch | worker | outcome | reason | steps | steps lost | wall s |")
    w("|---|---|---|---|---|---|---|---|")
    for a in job.get("attempts", []):
        wall = (I(a, "ended_ms") - I(a, "started_ms")) / 1000 if I(a, "ended_ms") else float("nan")
        w(f"| {I(a, 'number')} | {I(a, 'epoch')} | {a.get('worker_id', '')} | {a.get('outcome', '')} | "
          f"{a.get('reason', '')} | {I(a, 'start_step')}..{I(a, 'end_step')} | {I(a, 'steps_lost')} | {wall:.1f} |")
    w("")
    w("### Timeline (seconds after submit; ftd's events and this script's actions)")
    w("")
    marks = [(int(r[0]), "script", r[1]) for r in tsv(os.path.join(work, "marks.tsv")) if len(r) > 1]
    evs = [(I(e, "time_ms"), e.get("worker_id", "") or "ftd", f"{e.get('kind', '')}: {e.get('message', '')}")
           for e in events]
    start = min([t for t, _, _ in evs] or [0])
    sub = [t for t, _, m in marks if m.startswith("submit")]
    start = sub[0] if sub else start
    rows = sorted(evs + marks)
    # Periodic checkpoints are many: keep the first, those around the preemption and the last.
    shown, ck = [], [r for r in rows if r[2].startswith("checkpoint:")]
    keep_ck = set()
    if ck:
        keep_ck.add(ck[0][0])
        keep_ck.add(ck[-1][0])
    for i, r in enumerate(rows):
        if r[2].startswith("checkpoint:") and r[0] not in keep_ck:
            nxt = rows[i + 1][2] if i + 1 < len(rows) else ""
            prv = rows[i - 1][2] if i > 0 else ""
            if not any(k in nxt + prv for k in ("SIGTERM", "preempted", "stopped", "started", "resumed")):
                continue
        shown.append(r)
    w("| t (s) | who | what |")
    w("|---|---|---|")
    for t, who, what in shown:
        w(f"| {(t - start) / 1000:.2f} | {who} | {what} |")
    if len(shown) < len(rows):
        w(f"| | | ({len(rows) - len(shown)} periodic checkpoint events left out; all in job-events.json) |")
    w("")
    w("## Throughput and memory")
    w("")
    w("| run | steps | tokens/s (median) | step s (median) | peak bytes (trainer) |")
    w("|---|---|---|---|---|")
    by_epoch = {}
    for p in metrics:
        by_epoch.setdefault(int(p.get("epoch", 0)), []).append(p)
    for ep, ps in sorted(by_epoch.items()):
        tps = [p["tokens_per_s"] for p in ps if p.get("tokens_per_s")]
        peak = max([p.get("peak_bytes") or 0 for p in ps] or [0])
        w(f"| ftd attempt epoch {ep} (as the worker reported it) | {len(ps)} | "
          f"{statistics.median(tps) if tps else 0:.0f} | — | {gib(peak)} |")
    ref = [r for r in jsonl(os.path.join(work, "job", "out-reference", "metrics.jsonl")) if "tokens_per_s" in r]
    if ref:
        w(f"| ft-train run, uninterrupted | {len(ref)} | {statistics.median(r['tokens_per_s'] for r in ref):.0f} | "
          f"{statistics.median(r['step_seconds'] for r in ref):.4f} | {gib(max(r.get('peak_bytes', 0) for r in ref))} |")
    w("")
    pred = memory.get("predicted_bytes") or 0
    samples = memory.get("samples", [])
    used = max([s.get("used_bytes") or 0 for s in samples] or [0])
    w(f"- planner's prediction for the plan: {gib(pred)}; device used memory in the worker's heartbeats "
      f"(max of {len(samples)} samples; a GPU is measured only while idle, see worker/devices.h): {gib(used)}")
    if env.get("smi_peak_mib"):
        w(f"- nvidia-smi memory.used, sampled every 200 ms during the cluster run: peak "
          f"{float(env['smi_peak_mib']) / 1024:.2f} GiB (whole GPU, every process)")
    cats = [r.get("peak_bytes_by_category") for r in ref if r.get("peak_bytes_by_category")]
    if cats:
        w("- trainer peak by category (uninterrupted run): " +
          ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in cats[-1].items()))
    w("")
    w("## Adapter: resumed through the cluster vs uninterrupted `ft-train run`")
    w("")
    if "identical" in cmp:
        w(f"- adapter_model.safetensors: **{'byte-identical' if cmp['identical'] else 'not byte-identical'}** "
          f"({cmp['bytes'][1]} bytes, {cmp.get('tensors')} tensors, {cmp.get('values')} values); "
          f"max abs difference {cmp['max_abs']:.3e}, relative (norm) {cmp['rel_norm']:.3e}")
        w(f"- per-step losses ({cmp['loss_steps'][2]} common steps): "
          f"{'identical' if cmp.get('loss_identical') else 'max abs difference %s' % cmp.get('loss_max_abs')}"
          + (f"; loss {cmp['loss_first_last'][0]:.4f} -> {cmp['loss_first_last'][1]:.4f}" if cmp.get('loss_first_last') else ""))
    else:
        w(f"- not compared: {cmp.get('error', 'a run did not finish')}")
    if cmp2 is not None and "identical" in cmp2:
        w(f"- a second uninterrupted run against the first (the device's run-to-run determinism): "
          f"{'byte-identical' if cmp2['identical'] else 'max abs %.3e, rel %.3e' % (cmp2['max_abs'], cmp2['rel_norm'])}")
    w("")
    w("## Phases (wall seconds)")
    w("")
    w("| phase | s |")
    w("|---|---|")
    for r in tsv(os.path.join(work, "phases.tsv")):
        w(f"| {r[0]} | {r[1]} |")
    w("")
    w("Logs: cluster-logs.tar.gz (script.log, ftd.log, worker-*.log, the job's log, status/events/metrics "
      "JSON, the reference run's log, ldd output, nvidia-smi).")
    with open(dest, "w") as f:
        f.write("\n".join(L) + "\n")
    return 0

if __name__ == "__main__":
    sys.exit({"poll": poll, "get": get, "http": http, "data": data, "steptime": steptime,
              "compare": compare, "report": report}[sys.argv[1]](sys.argv[2:]))
PY
ftc() { python3 "$work/ftc.py" "$@"; }

# ---- 1. the machine --------------------------------------------------------------
say "machine"
cat /etc/os-release
ldd --version | head -1
kv os "$(sed -n 's/^PRETTY_NAME=//p' /etc/os-release 2> /dev/null | tr -d '"')"
kv glibc "$(ldd --version | head -1)"
kv device "$device"
if [ "$device" = cuda ]; then
  if ! command -v nvidia-smi > /dev/null || ! nvidia-smi > "$logs/nvidia-smi.txt" 2>&1; then
    cat "$logs/nvidia-smi.txt" 2> /dev/null
    check "GPU visible" 0 "nvidia-smi failed"
    exit 1
  fi
  name=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)
  kv device_name "$name"
  check "GPU visible" 1 "$name"
else
  kv device_name "CPU ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores), dry run"
fi

# ---- 2. the carried binaries and libraries -----------------------------------------
say "unpack $carry -> $unpack"
t=$EPOCHREALTIME
if [ ! -f "$carry" ]; then
  check "carried binaries" 0 "no $carry: make it with bench/gpu/cluster-carry.sh and carry it"
  exit 1
fi
rm -rf "$unpack" && mkdir -p "$unpack"
# tar needs xz; Python's tarfile does without.
if ! tar -C "$unpack" --strip-components=1 -xJf "$carry" && ! python3 - "$carry" "$unpack" << 'PY'; then
import sys, tarfile
with tarfile.open(sys.argv[1], "r:xz") as t:
    for m in t.getmembers():
        if "/" in m.name:
            m.name = m.name.split("/", 1)[1]
            try:
                t.extract(m, sys.argv[2], filter="fully_trusted")
            except TypeError:
                t.extract(m, sys.argv[2])
PY
  check "carried binaries" 0 "could not unpack $carry"
  exit 1
fi
phase unpack "$(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME - $t}")"
bin=$unpack/bin
cat "$unpack/glibc.txt"
kv carry_built "$(grep '^built-on' "$unpack/glibc.txt" | cut -d' ' -f2-)"
need_glibc=$(awk '$1 == "libs" && $2 == "GLIBC" {print $3}' "$unpack/glibc.txt")
need_cxx=$(awk '$1 == "libs" && $2 == "GLIBCXX" {print $3}' "$unpack/glibc.txt")
need_abi=$(awk '$1 == "libs" && $2 == "CXXABI" {print $3}' "$unpack/glibc.txt")
kv needs "$need_glibc, $need_cxx, $need_abi (the carried libstdc++: $(awk '$1 == "compat" && $2 == "GLIBC" {print $3}' "$unpack/glibc.txt"))"
say "needs $need_glibc, $need_cxx, $need_abi; this machine: $(ldd --version | head -1)"

# libstdc++: the machine's own when it is new enough (its CUDA libraries may
# need it), else the carried one.
sys_cxx=$(ldconfig -p 2> /dev/null | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF; exit}')
for c in /usr/lib/x86_64-linux-gnu/libstdc++.so.6 /lib/x86_64-linux-gnu/libstdc++.so.6 /usr/lib64/libstdc++.so.6; do
  [ -z "$sys_cxx" ] && [ -e "$c" ] && sys_cxx=$c
done
ld=$unpack/lib
if [ -z "${FT_CLUSTER_FORCE_COMPAT:-}" ] && [ -n "$sys_cxx" ] && grep -qa "$need_cxx" "$sys_cxx" &&
  grep -qa "$need_abi" "$sys_cxx"; then
  kv libstdcxx "the machine's ($sys_cxx has $need_cxx)"
else
  ld=$ld:$unpack/compat
  kv libstdcxx "carried (the machine's ${sys_cxx:-none} lacks $need_cxx or $need_abi)"
fi
say "libstdc++: $(awk -F'\t' '$1 == "libstdcxx" {print $2}' "$work/env.tsv")"

# CUDA's libraries: wherever libcudart.so.13 and libcublasLt.so.13 are.
cuda_dirs=()
sp=$(python3 -c 'import site; print(" ".join(site.getsitepackages() + [site.getusersitepackages()]))' 2> /dev/null)
for lib in libcudart.so.13 libcublasLt.so.13; do
  found=""
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
    /usr/local/cuda-13*/lib64 /usr/local/cuda-13*/lib /usr/local/cuda-13*/targets/x86_64-linux/lib; do
    if [ -e "$d/$lib" ]; then found=$d && break; fi
  done
  if [ -z "$found" ]; then
    found=$(ldconfig -p 2> /dev/null | awk -v l="$lib" '$1 == l && /x86-64/ {print $NF; exit}')
    found=${found%/*}
  fi
  if [ -z "$found" ]; then
    for s in $sp; do
      f=$(find "$s/nvidia" -maxdepth 4 -name "$lib*" 2> /dev/null | head -1)
      if [ -n "$f" ]; then found=${f%/*} && break; fi
    done
  fi
  say "$lib: ${found:-not found}"
  if [ -n "$found" ] && [[ " ${cuda_dirs[*]} " != *" $found "* ]]; then cuda_dirs+=("$found"); fi
done
for d in "${cuda_dirs[@]}"; do ld=$ld:$d; done
kv cuda_libs "${cuda_dirs[*]:-nowhere}"
export FTC_LD=$ld  # ftc.py poll runs ftctl with it
say "LD_LIBRARY_PATH for our binaries: $ld"
missing=0
for b in ftd ft-worker ftctl ft-train; do
  LD_LIBRARY_PATH=$ld ldd "$bin/$b" > "$logs/ldd-$b.txt" 2>&1
  if grep -q "not found" "$logs/ldd-$b.txt"; then
    echo "$b:" && grep "not found" "$logs/ldd-$b.txt"
    missing=1
  fi
  grep -E "libstdc\+\+|libcudart|libcublasLt|libgrpc\+\+" "$logs/ldd-$b.txt" | sed "s|^|   $b: |"
done
if [ $missing = 1 ]; then
  check "libraries resolve (ldd)" 0 "some are not found (above)"
  exit 1
fi
check "libraries resolve (ldd)" 1 "ftd, ft-worker, ftctl, ft-train: nothing missing"
# Our binaries get the carried libraries; Python and nvidia-smi keep the machine's.
# (Background ones through env, so that $! is the binary's own pid.)
ft() { LD_LIBRARY_PATH=$ld "$@"; }

# ---- 3. model, data, job -------------------------------------------------------------
say "model ($shape), data"
t=$EPOCHREALTIME
job=$work/job
if [ "$shape" = medium ]; then
  cat > "$job/config.json" << 'EOF'
{
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "hidden_size": 1024,
  "intermediate_size": 2816,
  "num_hidden_layers": 8,
  "num_attention_heads": 16,
  "num_key_value_heads": 4,
  "head_dim": 64,
  "vocab_size": 8192,
  "max_position_embeddings": 2048,
  "rms_norm_eps": 1e-05,
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "torch_dtype": "float32"
}
EOF
  seq=512 batch=8 micro=4 vocab=8192 rows=512 r=16
  kv shape_desc "Llama, 8 layers, hidden 1024, intermediate 2816, 16/4 heads of 64, vocab 8192 (~100M parameters)"
else
  cp "$root/bench/gpu/small-llama/config.json" "$job/config.json"
  seq=128 batch=4 micro=2 vocab=512 rows=256 r=8
  kv shape_desc "Llama, 2 layers, hidden 256, intermediate 512, 4/2 heads of 64, vocab 512 (bench/gpu/small-llama)"
fi
kv seq $seq
kv batch $batch
kv micro $micro
kv lora_r $r
if ! ft timeout "$(cap 120)" "$bin/ft-train" make-model --config "$job/config.json" --out "$job/model" --seed 3 \
  > "$logs/make-model.log" 2>&1; then
  cat "$logs/make-model.log"
  check "model written" 0 "ft-train make-model failed"
  exit 1
fi
ftc data "$job/data.jsonl" $rows $seq $vocab 5
phase "make-model + data" "$(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME - $t}")"

# write_job FILE STEPS EVERY OUTDIR
write_job() {
  cat > "$1" << EOF
# bench/gpu/cluster_sigterm.sh: a LoRA on a random Llama, through ftd + ft-worker.
name: cluster-sigterm
model: {path: model, dtype: fp32}
adapter: {type: lora, r: $r, alpha: $((2 * r)), target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]}
data: {train: data.jsonl, format: tokens, seq_len: $seq, packing: false, shuffle: true}
train: {max_steps: $2, global_batch_size: $batch, micro_batch_size: $micro, lr: 1.0e-3, lr_schedule: cosine, warmup_steps: 10, seed: 7}
checkpoint: {every_steps: $3, every_minutes: 0, keep: 3}
resources: {device: $device}
output: {dir: $4}
EOF
}

# Calibration: a few steps with ft-train run set the job's length (also an early check that the device trains).
if [ -n "${FT_CLUSTER_STEPS:-}" ]; then
  steps=$FT_CLUSTER_STEPS
  kv steps_why "FT_CLUSTER_STEPS"
else
  say "calibrate: 8 steps with ft-train run"
  t=$EPOCHREALTIME
  write_job "$job/calibrate.yaml" 8 1000 out-calibrate
  if ! ft timeout "$(cap 90)" "$bin/ft-train" run "$job/calibrate.yaml" > "$logs/calibrate.log" 2>&1; then
    tail -20 "$logs/calibrate.log"
    check "device trains (calibration run)" 0 "ft-train run of 8 steps failed: $(tail -1 "$logs/calibrate.log")"
    exit 1
  fi
  cal=$(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME - $t}")
  phase "calibration (8 steps, ft-train run)" "$cal"
  step_s=$(ftc steptime "$job/out-calibrate/metrics.jsonl") || step_s=1
  steps=$(awk "BEGIN{s = int($target_s / $step_s / 10) * 10; if (s < 60) s = 60; if (s > 600) s = 600; print s}")
  kv steps_why "calibrated: $step_s s a step, aiming at ${target_s} s"
  check "device trains (calibration run)" 1 "8 steps in $cal s (process start included), median step $step_s s"
fi
every=$(awk "BEGIN{e = int($steps / 12 / 5) * 5; if (e < 5) e = 5; print e}")
stop_at=$(awk "BEGIN{print int($steps * 0.4 / $every) * $every + int($every / 2)}")
kv steps "$steps"
kv every "$every"
kv stop_at "$stop_at"
write_job "$job/job.yaml" "$steps" "$every" out
say "job: $steps steps, checkpoint every $every, SIGTERM past step $stop_at"
ft "$bin/ft-train" plan "$job/job.yaml" --device "$device" > "$logs/plan.txt" 2>&1
cat "$logs/plan.txt"

# ---- 4. ftd, worker A, submit --------------------------------------------------------
say "ftd"
t_cluster=$EPOCHREALTIME
if [ "$device" = cuda ]; then
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$logs/smi-memory-used-mib.txt" 2>&1 &
  smi_pid=$!
fi
web=()
[ -d "$root/web" ] && web=(--web-dir "$root/web")
env LD_LIBRARY_PATH="$ld" "$bin/ftd" --listen "127.0.0.1:${FT_CLUSTER_PORT:-0}" --http "127.0.0.1:${FT_CLUSTER_HTTP_PORT:-0}" "${web[@]}" \
  --data-dir "$work/ftd" --lease-ms 5000 --heartbeat-ms 500 --tick-ms 100 --requeue-backoff-ms 200 \
  > "$logs/ftd.log" 2>&1 &
pids+=($!)
addr="" dash=""
for _ in $(seq 100); do
  addr=$(grep -om1 "ftd: listening on [0-9.:]*" "$logs/ftd.log" | awk '{print $4}')
  dash=$(grep -om1 "ftd: dashboard at [^ ]*" "$logs/ftd.log" | awk '{print $4}')
  [ -n "$addr" ] && [ -n "$dash" ] && break
  sleep 0.1
done
if [ -z "$addr" ]; then
  cat "$logs/ftd.log"
  check "ftd serving" 0 "no 'listening on' line in 10 s"
  exit 1
fi
dash=${dash%/}
check "ftd serving" 1 "gRPC $addr, dashboard $dash"
ctl=(timeout 20 "$bin/ftctl" --addr "$addr")

worker_flags=()
[ "$device" = cpu ] && worker_flags=(--cpu-memory 8GiB)
start_worker() {  # ID
  env LD_LIBRARY_PATH="$ld" "$bin/ft-worker" --daemon "$addr" --id "$1" --ft-train "$bin/ft-train" --work-dir "$work/w-$1" \
    "${worker_flags[@]}" > "$logs/worker-$1.log" 2>&1 &
  pids+=($!)
  last_worker_pid=$!
  mark "started ft-worker $1 (pid $!)"
}
start_worker gpu-a
w1=$last_worker_pid
if ! ftc poll "$(cap 30)" "$logs/workers-a.json" \
  '[w for w in j.get("workers", []) if w["id"] == "gpu-a" and w.get("alive")]' -- "${ctl[@]}" --json workers; then
  tail -20 "$logs/worker-gpu-a.log"
  check "worker gpu-a registered" 0 "not alive in ftd's list within 30 s"
  exit 1
fi
kind=$(ftc get "$logs/workers-a.json" \
  '",".join(d.get("kind","")+":"+d.get("name","") for w in j["workers"] if w["id"]=="gpu-a" for d in w.get("devices",[]))')
check "worker gpu-a offers a $device device" "$(is [ "${kind%%:*}" = "$device" ])" "$kind"
ft "${ctl[@]}" workers | tee "$logs/workers-a.txt"

say "submit"
mark "submit (ftctl submit job.yaml)"
t_submit=$EPOCHREALTIME
if ! id=$(ft "${ctl[@]}" submit "$job/job.yaml" 2> "$logs/submit.err"); then
  cat "$logs/submit.err"
  check "job submitted" 0 "ftctl submit failed"
  exit 1
fi
check "job submitted" 1 "$id"
status=("${ctl[@]}" --json status "$id")  # the record, as a user reads it
api=$dash/api/jobs/$id                    # what the waits poll (no process per poll)

# ---- 5. SIGTERM to worker A mid-run -----------------------------------------------------
say "wait for RUNNING past step $stop_at"
# The poller sends the SIGTERM itself, the moment ftd's progress passes the step.
if ! ftc poll "$(cap 120)" "$logs/wait-running.json" \
  "j.get('state', '').upper() == 'RUNNING' and I(j, 'steps_done') >= $stop_at and j.get('worker_id') == 'gpu-a'" \
  kill="$w1" marks="$work/marks.tsv" -- "$api"; then
  tail -30 "$logs/worker-gpu-a.log"
  check "job RUNNING on gpu-a past step $stop_at" 0 "not reached (see worker-gpu-a.log)"
  exit 1
fi
t=$EPOCHREALTIME
at=$(ftc get "$logs/wait-running.json" "I(j, 'steps_done')")
say "sent SIGTERM to ft-worker gpu-a (pid $w1) at step $at"
on=$(ftc get "$logs/wait-running.json" "j.get('worker_id', '')")
check "job RUNNING on gpu-a past step $stop_at" "$(is [ "$on" = gpu-a ])" "step $at on $on, $(ftc get "$logs/wait-running.json" "'%.0f tokens/s' % (j.get('tokens_per_s') or 0)")"
wrc=124
for _ in $(seq $(($(cap 60) * 10))); do
  if ! kill -0 "$w1" 2> /dev/null; then
    wait "$w1"
    wrc=$?
    break
  fi
  sleep 0.1
done
stop_s=$(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME - $t}")
mark "ft-worker gpu-a exited ($wrc)"
check "ft-worker gpu-a stops cleanly on SIGTERM" "$(is [ "$wrc" = 0 ])" "exit $wrc after $stop_s s"
phase "SIGTERM to worker exit" "$stop_s"
grep -E "stopping|stopped|checkpoint" "$logs/worker-gpu-a.log" | tail -5

if ! ftc poll "$(cap 30)" "$logs/wait-preempted.json" "I(j, 'preemptions') >= 1" -- "$api"; then
  check "preemption recorded" 0 "no preemption in ftd within 30 s"
  exit 1
fi
f=$logs/job-after-sigterm.json
ft "${status[@]}" > "$f"
ft "${ctl[@]}" status "$id" | tee "$logs/status-after-sigterm.txt"
rec=$(ftc get "$f" "'outcome %s, reason \"%s\", steps %d..%d, steps_lost %d, committed %d, preemptions %d, failures %d' % (j['attempts'][0].get('outcome'), j['attempts'][0].get('reason', ''), I(j['attempts'][0], 'start_step'), I(j['attempts'][0], 'end_step'), I(j['attempts'][0], 'steps_lost'), I(j, 'committed_step'), I(j, 'preemptions'), I(j, 'failures'))")
good=$(ftc get "$f" "int(I(j, 'preemptions') == 1 and I(j, 'failures') == 0 and j['attempts'][0].get('outcome') == 'ATTEMPT_PREEMPTED' and 'SIGTERM' in j['attempts'][0].get('reason', '') and I(j['attempts'][0], 'steps_lost') == 0 and I(j['attempts'][0], 'end_step') >= $at and I(j, 'committed_step') == I(j['attempts'][0], 'end_step'))")
check "preemption recorded, steps_lost 0" "$good" "$rec"

# ---- 6. worker B resumes it ---------------------------------------------------------------
say "ft-worker gpu-b"
start_worker gpu-b
if ! ftc poll "$(cap 150)" "$logs/wait-done.json" \
  "j.get('state', '').upper() in ('SUCCEEDED', 'FAILED', 'CANCELLED')" -- "$api"; then
  tail -30 "$logs/worker-gpu-b.log"
  check "job SUCCEEDED after the resume" 0 "not done in time (see worker-gpu-b.log)"
  exit 1
fi
mark "job done"
cluster_s=$(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME - $t_submit}")
phase "cluster job, submit to done (ftd + 2 workers)" "$cluster_s"
f=$logs/job-status.json
ft "${status[@]}" > "$f"
ft "${ctl[@]}" status "$id" | tee "$logs/status-final.txt"
res=$(ftc get "$f" "'%s, %d/%d steps, %d attempts, attempt 2 on %s from step %d' % (j.get('state'), I(j, 'steps_done'), I(j, 'total_steps'), len(j.get('attempts', [])), j['attempts'][-1].get('worker_id'), I(j['attempts'][-1], 'start_step'))")
good=$(ftc get "$f" "int(j.get('state') == 'SUCCEEDED' and I(j, 'steps_done') == $steps and len(j['attempts']) == 2 and j['attempts'][1].get('worker_id') == 'gpu-b' and I(j['attempts'][1], 'start_step') == I(j['attempts'][0], 'end_step') and I(j, 'preemptions') == 1 and I(j, 'failures') == 0)")
check "job SUCCEEDED after the resume" "$good" "$res (in $cluster_s s)"
# The record as the API gives it.
ft "${ctl[@]}" --json events "$id" > "$logs/job-events.json" 2>&1
ft "${ctl[@]}" events "$id" > "$logs/job-events.txt" 2>&1
ft "${ctl[@]}" logs "$id" > "$logs/job-trainer.log" 2>&1
ft "${ctl[@]}" --json workers > "$logs/workers-final.json" 2>&1
ftc http "$dash/api/jobs/$id/metrics" "$logs/job-metrics.json"
ftc http "$dash/api/jobs/$id/memory" "$logs/job-memory.json"
ftc http "$dash/api/jobs/$id" "$logs/job-api.json"
out_dir=$(ftc get "$f" "j.get('output_dir', '')")
phase "cluster phase total (ftd start to records saved)" "$(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME - $t_cluster}")"
# Stop the cluster before the reference run has the device.
for p in "${pids[@]}"; do kill -TERM "$p" 2> /dev/null; done
sleep 1
stop_all

# ---- 7. the same job uninterrupted --------------------------------------------------------
say "reference: ft-train run of the same job, uninterrupted"
t=$EPOCHREALTIME
sed 's|^output: {dir: out}|output: {dir: out-reference}|' "$job/job.yaml" > "$job/job-reference.yaml"
ft timeout "$(cap 100)" "$bin/ft-train" run "$job/job-reference.yaml" > "$logs/reference.log" 2>&1
rrc=$?
ref_s=$(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME - $t}")
phase "ft-train run, uninterrupted" "$ref_s"
check "uninterrupted ft-train run" "$(is [ $rrc = 0 ])" "exit $rrc in $ref_s s"
tail -3 "$logs/reference.log"
ftc compare "$out_dir" "$job/out-reference" "$work/compare.json"
cmp_ok=$(ftc get "$work/compare.json" "int(j.get('identical', False) or (j.get('same_names', False) and j.get('rel_norm', 1) <= 1e-3))")
cmp_txt=$(ftc get "$work/compare.json" "('byte-identical' if j['identical'] else 'NOT byte-identical: max abs %.3e, rel %.3e (bound 1e-3)' % (j['max_abs'], j['rel_norm'])) if 'identical' in j else j.get('error', '?')")
check "adapter: cluster (resumed) vs uninterrupted" "$cmp_ok" "$cmp_txt"
# Not identical: is the device itself deterministic run to run? (Only when the budget allows.)
if [ "$(ftc get "$work/compare.json" "int(j.get('identical', True))")" = 0 ] && [ "$(left)" -gt "$(awk "BEGIN{print int($ref_s + 20)}")" ]; then
  say "second uninterrupted run (run-to-run determinism)"
  sed 's|^output: {dir: out}|output: {dir: out-reference2}|' "$job/job.yaml" > "$job/job-reference2.yaml"
  ft timeout "$(cap 100)" "$bin/ft-train" run "$job/job-reference2.yaml" > "$logs/reference2.log" 2>&1 &&
    ftc compare "$job/out-reference2" "$job/out-reference" "$work/compare-ref2.json"
fi
[ -f "$job/out-reference/metrics.jsonl" ] && cp "$job/out-reference/metrics.jsonl" "$logs/reference-metrics.jsonl"
[ -f "$out_dir/metrics.jsonl" ] && cp "$out_dir/metrics.jsonl" "$logs/cluster-metrics.jsonl"
cp "$work/ftd/logs/"*.log "$logs/" 2> /dev/null
completed=1
