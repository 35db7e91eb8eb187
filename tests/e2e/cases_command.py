"""The `ncclwatch` command around a job: `run` and its live verdicts, `dump` snapshots,
metrics, help texts and the examples the README promises."""
import glob
import json
import os
import re
import shutil
import signal
import subprocess

from e2e_common import (built, case, long_case, job, ranks_catching, run_ended_when, serial_case)
from ncclwatch_testing import (check, dumped, read_text, temp_dir, wait_for)


def run_until_live_verdict(cmd, env, cwd, verdict):
    """`ncclwatch run ... -- simlaunch ...` of a hung job: its time limit ends once `run` has
    printed its live `verdict` (and said so: "while the job runs")."""
    return run_ended_when(cmd, env, cwd, lambda out, err: verdict in out and "while the job runs" in err)

@case
def run_wrapper():
    nw = built("bin", "ncclwatch")
    tmp = temp_dir("ncclwatch-e2e-")
    base = {k: v for k, v in os.environ.items() if not k.startswith("NCCLWATCH_") and k != "LD_PRELOAD"}
    # The exit status is the command's, whatever it is; LD_PRELOAD is prepended, not replaced.
    r = subprocess.run([nw, "run", "--", "sh", "-c", "echo \"$LD_PRELOAD|$NCCLWATCH_DIR\"; exit 3"],
                       env=dict(base, LD_PRELOAD="libm.so.6"), cwd=tmp, capture_output=True, text=True)
    check(r.returncode == 3, f"exit status 3 kept ({r.returncode}): {r.stderr}")
    pre, d = r.stdout.strip().split("|")
    check(pre.endswith("libncclwatch.so:libm.so.6"), f"ours first, the existing value kept: {pre}")
    check(os.path.basename(d).startswith("ncclwatch-"), f"a job-scoped directory: {d}")
    r = subprocess.run([nw, "run", "--", "sh", "-c", "kill -TERM $$"], env=base, cwd=tmp, capture_output=True)
    check(r.returncode == -signal.SIGTERM, f"death by signal kept: {r.returncode}")
    # A hang: dumps land in --dir and the verdict is printed after the job.
    dumps = os.path.join(tmp, "dumps")
    r = run_until_live_verdict([nw, "run", "--dir", dumps, "--timeout", "3", "--set", "PEER_POLL_MS=200", "--",
                                built("bin", "simlaunch"), "-n", "2", "--timeout", "8", "--",
                                built("bin", "sim_workload"), "--iters", "20", "--busy-rank", "1", "--busy-at", "4",
                                "--busy-ms", "-1"], base, tmp, "rank_missing")
    check(r.returncode == 124, f"the launcher's timeout status is kept ({r.returncode})")
    check(glob.glob(os.path.join(dumps, "rank*.json")), "dumps in --dir")
    check("rank_missing" in r.stdout and "rank 1" in r.stdout, f"the verdict is printed:\n{r.stdout[-2000:]}")
    # ... while the job runs (the launcher's time limit ends it after the verdict),
    # and not a second time at the end: nothing changed.
    check("while the job runs" in r.stderr, f"the verdict came while the job ran:\n{r.stderr[-2000:]}")
    check(re.search(r"^ncclwatch: while the job runs, 2 of 2 ranks dumped \(\d+ dump\(s\) of this job in ", r.stderr, re.M),
          f"under one line saying how many ranks dumped:\n{r.stderr[-2000:]}")
    check(r.stdout.count("rank_missing") == 1 or "no change since the report above" in r.stderr,
          f"one report per story:\n{r.stderr[-1500:]}")
    check("process(es) watched" in r.stderr, f"one line on what was watched:\n{r.stderr[-1000:]}")
    # A healthy job: no dump, no analysis.
    r = subprocess.run([nw, "run", "--dir", os.path.join(tmp, "ok"), "--", built("bin", "simlaunch"), "-n",
                        "2", "--", built("bin", "sim_workload"), "--iters", "5"], env=base, cwd=tmp,
                       capture_output=True, text=True)
    check(r.returncode == 0 and "analysis" not in r.stderr + r.stdout, f"nothing to analyze: {r.stderr}")
    r = subprocess.run([nw, "run", "--bogus"], env=base, capture_output=True, text=True)
    check(r.returncode == 2 and "unknown option '--bogus'" in r.stderr, f"bad usage: one clear line: {r.stderr}")
    # Options are checked before anything starts: nothing runs, one line each, exit 2.
    marker = os.path.join(tmp, "ran")
    for bad, says in ((["--timeout", "abc"], "NCCLWATCH_TIMEOUT='abc'"), (["--set", "FOO=1"], "unknown setting NCCLWATCH_FOO"),
                      (["--set", "RING=x"], "NCCLWATCH_RING='x'")):
        r = subprocess.run([nw, "run"] + bad + ["--", "touch", marker], env=base, capture_output=True, text=True)
        check(r.returncode == 2 and says in r.stderr and r.stderr.count("\n") == 1 and not os.path.exists(marker),
              f"{bad}: refused before starting, one line: {r.returncode} {r.stderr}")
    # The environment's settings are the job's too: checked the same way, once, said to come from
    # there (not one line per rank as the job starts); an option given over one replaces it.
    for bad, says in (({"NCCLWATCH_RING": "x"}, "NCCLWATCH_RING='x'"),
                      ({"NCCLWATCH_TIMOUT": "5"}, "unknown setting NCCLWATCH_TIMOUT, did you mean NCCLWATCH_TIMEOUT?")):
        r = subprocess.run([nw, "run", "--", "touch", marker], env=dict(base, **bad), cwd=tmp, capture_output=True,
                           text=True)
        check(r.returncode == 2 and says in r.stderr and "(in the environment)" in r.stderr
              and r.stderr.count("\n") == 1 and not os.path.exists(marker),
              f"{bad} in the environment: refused before starting, one line: {r.returncode} {r.stderr}")
    r = subprocess.run([nw, "run", "--dir", os.path.join(tmp, "replaced"), "--set", "RING=64", "--", "touch", marker],
                       env=dict(base, NCCLWATCH_RING="x"), cwd=tmp, capture_output=True, text=True)
    check(r.returncode == 0 and os.path.exists(marker), f"--set RING over NCCLWATCH_RING=x runs: {r.stderr}")


@serial_case
def run_prints_no_live_verdict_after_recovery():
    # Ranks 0 and 2 stall (deadline 1 s) while rank 1 is busy 3 s, then recover. Nobody answers
    # requests (peer polls a minute apart), so `ncclwatch run` reports the episode after its
    # settling time, when the recoveries are in: no live verdict for a stall its own dumps show
    # recovered. Then the same dumps, replayed into a run's directory as a loaded machine can
    # bring them: both stalls, but only rank 0's recovery (the collective completed, so rank 2's
    # stall is over too): still no live verdict. The end tells the stall either way.
    nw = built("bin", "ncclwatch")
    tmp = temp_dir("ncclwatch-e2e-")
    base = {k: v for k, v in os.environ.items() if not k.startswith("NCCLWATCH_") and k != "LD_PRELOAD"}
    base["NCCLWATCH_BLACKBOX_DIR"] = os.path.join(tmp, "boxes")
    os.makedirs(base["NCCLWATCH_BLACKBOX_DIR"])

    def run(dumps, command):
        r = subprocess.run([nw, "run", "--dir", dumps, "--timeout", "1", "--set", "PEER_POLL_MS=60000", "--"] + command,
                           env=base, cwd=tmp, capture_output=True, text=True, timeout=120)
        check(r.returncode == 0, f"the job finished: {r.returncode}\n{(r.stdout + r.stderr)[-3000:]}")
        check("while the job runs" not in r.stderr, f"no live verdict for a recovered stall:\n{(r.stdout + r.stderr)[-4000:]}")
        final = r.stdout[r.stdout.rfind("ncclwatch analyze:"):]
        check("stall_recovered" in final, f"the end tells the stall:\n{final[-3000:]}")
    dumps = os.path.join(tmp, "d")
    run(dumps, [built("bin", "simlaunch"), "-n", "3", "--timeout", "60", "--",
                built("bin", "sim_workload"), "--iters", "10", "--busy-rank", "1", "--busy-at", "3",
                "--busy-ms", "3000", "--linger-ms", "4000"])
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(dumps, "rank*.json")))
    replay = [n for n in names if n.startswith("rank00000-") and n.endswith(("-stall.json", "-recovery.json"))] + \
        [n for n in names if n.startswith("rank00002-") and n.endswith("-stall.json")]
    check(len(replay) == 3, f"rank 0's stall and recovery, rank 2's stall: {names}")
    again = os.path.join(tmp, "again")
    os.makedirs(again)
    # The replayed dumps become the second run's own: a run reads only its job's dumps (its
    # NCCLWATCH_RUN_ID, which its command inherits, in place of the first run's).
    first = json.load(open(os.path.join(dumps, replay[0])))["summary"]["job_instance"]
    check(first.startswith("run-"), f"the first run named its job: {first!r}")
    copy = 'sleep 1; for f in "$@"; do sed "s#' + first + '#$NCCLWATCH_RUN_ID#g" "$f" > ' + again + '/.t && mv ' + \
        again + '/.t ' + again + '/"$(basename "$f")"; done; sleep 8'
    run(again, ["sh", "-c", copy, "sh"] + [os.path.join(dumps, n) for n in replay])


@case
def help_texts_print_as_written():
    # Usage texts printed with fputs or as a %s argument keep their characters: no printf escapes.
    for program in ("sim_workload", "simlaunch", "ncclwatch"):
        r = subprocess.run([built("bin", program), "--help"], capture_output=True, text=True)
        text = r.stdout + r.stderr
        check(r.returncode == 0 and text.strip(), f"{program} --help: exit {r.returncode}")
        check("%%" not in text, f"{program} --help prints '%%':\n{text}")
    r = subprocess.run([built("bin", "sim_workload"), "--help"], capture_output=True, text=True)
    check("color = rank % (k+1)" in r.stdout, f"the modulo reads as one: {r.stdout}")


@serial_case
def c_example_gives_its_promised_verdict():
    # examples/README.md: HANG_RANK=1 ncclwatch run -- simlaunch -n 4 -- example_allreduce gives
    # rank_missing, culprit rank 1 (with a shorter deadline and a launcher time limit here).
    nw = built("bin", "ncclwatch")
    tmp = temp_dir("ncclwatch-e2e-")
    base = {k: v for k, v in os.environ.items() if not k.startswith("NCCLWATCH_") and k != "LD_PRELOAD"}
    r = run_until_live_verdict([nw, "run", "--dir", os.path.join(tmp, "d"), "--timeout", "3", "--set", "PEER_POLL_MS=200",
                                "--", built("bin", "simlaunch"), "-n", "4", "--timeout", "12", "--",
                                built("bin", "example_allreduce")],
                               dict(base, HANG_RANK="1", NCCL_ID_FILE=os.path.join(tmp, "id")), tmp, "rank_missing")
    check("rank_missing  rank 1 never entered AllReduce" in r.stdout,
          f"the promised verdict:\n{r.stdout[-3000:]}\n{r.stderr[-2000:]}")


@serial_case
def run_reports_a_healthy_stop():
    # A healthy job with a straggler, stopped by SIGTERM (a time limit): the ranks' signal dumps
    # come in while the launcher still runs; that analysis is not news then (no hang), so it is
    # printed at the end: "no hang" and the slow rank, never "no change since the report above"
    # with no report above.
    nw = built("bin", "ncclwatch")
    tmp = temp_dir("ncclwatch-e2e-")
    base = {k: v for k, v in os.environ.items() if not k.startswith("NCCLWATCH_") and k != "LD_PRELOAD"}
    r = subprocess.run([nw, "run", "--dir", os.path.join(tmp, "d"), "--timeout", "600", "--",
                        built("bin", "simlaunch"), "-n", "4", "--timeout", "5", "--",
                        built("bin", "sim_workload"), "--iters", "1000000", "--straggler-rank", "3",
                        "--straggler-ms", "20", "--straggler-max-ms", "40"], env=base, cwd=tmp, capture_output=True,
                       text=True, timeout=120)
    check(r.returncode == 124, f"the launcher's timeout status is kept ({r.returncode}):\n{r.stderr[-2000:]}")
    check("stopped or snapshotted while healthy" in r.stdout, f"the report is printed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    check("slow_rank  rank 3" in r.stdout, f"with the straggler:\n{r.stdout[-2000:]}")
    check("no change since" not in r.stderr, f"no 'no change' without a report above:\n{r.stderr[-2000:]}")
    check("process(es) watched" in r.stderr, f"one line on what was watched:\n{r.stderr[-1000:]}")


@case
def live_dump_snapshot():
    # `ncclwatch dump DIR` against a running healthy job: every rank answers the request, the job
    # goes on, and the snapshot reads no_hang (exit 0).
    shared = temp_dir("ncclwatch-e2e-live-")
    result = {}

    def snapshot(p):
        ranks_catching(p, 4, signal.SIGTERM)  # the library runs in every rank: it watches the directory
        r = subprocess.run([built("bin", "ncclwatch"), "dump", shared, "--json", "--wait", "10"],
                           capture_output=True, text=True)
        result["rc"], result["out"], result["err"] = r.returncode, r.stdout, r.stderr
        result["alive"] = p.poll() is None

    job(4, ["--iters", "1000000"], env={"NCCLWATCH_DIR": shared, "NCCLWATCH_TIMEOUT": "600"}, timeout=8,
        after_start=snapshot)
    check("4/4 ranks answered" in result["err"], f"every rank answered: {result['err'][-1500:]}")
    check(result["alive"], "the job went on after the snapshot")
    report = json.loads(result["out"])
    check(result["rc"] == 0 and report["verdicts"][0]["cause"] == "no_hang",
          f"the snapshot of a healthy job is no_hang (exit {result['rc']}):\n{result['out'][:1500]}")
    a_file = os.path.join(shared, "dump-request.json")
    r = subprocess.run([built("bin", "ncclwatch"), "dump", a_file], capture_output=True, text=True)
    check(r.returncode == 2 and r.stderr.count("\n") == 1 and a_file in r.stderr,
          f"not a directory: one line with the path, exit 2: {r.stderr}")
    nobody = os.path.join(temp_dir("ncclwatch-e2e-nobody-"), "typo")
    r = subprocess.run([built("bin", "ncclwatch"), "dump", nobody, "--wait", "1"], capture_output=True,
                       text=True)
    check(r.returncode == 2 and "no rank answered" in r.stderr and not os.path.exists(nobody),
          f"nobody there: exit 2, and the directory it created is gone again: {r.stderr}")


@long_case(15)
def live_dump_creates_the_directory():
    # A job preloaded by hand with NCCLWATCH_DIR set, which has dumped nothing yet (the library
    # creates the directory at its first dump): `ncclwatch dump DIR` creates it, and the ranks,
    # polling that path, answer.
    shared = os.path.join(temp_dir("ncclwatch-e2e-live-"), "not-yet")
    result = {}

    def snapshot(p):
        ranks_catching(p, 2, signal.SIGTERM)
        result["existed"] = os.path.exists(shared)
        r = subprocess.run([built("bin", "ncclwatch"), "dump", shared, "--json", "--wait", "20"],
                           capture_output=True, text=True)
        result["rc"], result["out"], result["err"] = r.returncode, r.stdout, r.stderr

    job(2, ["--iters", "1000000"], env={"NCCLWATCH_DIR": shared, "NCCLWATCH_TIMEOUT": "600"}, timeout=15,
        after_start=snapshot)
    check(not result["existed"], "the premise: nothing had created the directory")
    check(result["rc"] == 0 and "2/2 ranks answered" in result["err"],
          f"the directory was created and every rank answered (exit {result['rc']}): {result['err'][-1500:]}")


PROM_LINE = re.compile(r'^(ncclwatch_[a-z_]+)\{((?:[a-z_]+="[^"\\]*",?)*)\} (-?[0-9.e+]+)$')


def check_prometheus_text(text):
    """The text exposition format as node-exporter's textfile collector reads it; promtool's
    own check too where it is installed (Debian package prometheus)."""
    helped, typed = set(), {}
    samples = []
    for line in text.splitlines():
        if line.startswith("# HELP "):
            helped.add(line.split()[2])
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            typed[name] = kind
        else:
            m = PROM_LINE.match(line)
            check(m, f"a sample line: {line!r}")
            name = m.group(1)
            check(name in helped and name in typed, f"{name} has HELP and TYPE before its samples")
            check(typed[name] != "counter" or name.endswith("_total"), f"counter {name} ends in _total")
            check("rank=" in m.group(2), f"every sample has the rank label: {line}")
            samples.append((name, m.group(2), float(m.group(3))))
    promtool = shutil.which("promtool")
    if promtool:
        r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        check(r.returncode == 0, f"promtool check metrics: {r.stdout} {r.stderr}")
    else:
        print("  promtool not installed: checked against the format's rules only")
    return samples


@case
def metrics_textfile():
    # NCCLWATCH_METRICS=DIR: each process keeps a Prometheus file there while it runs, and removes
    # it when it exits normally.
    # A directory that does not exist yet (a textfile collector's, before its first writer): created.
    metrics = os.path.join(temp_dir("ncclwatch-e2e-metrics-"), "node-exporter", "textfile")
    seen = {}

    def all_counted():
        # Both files, each past the 300 all-reduces (the job lingers 7 s after them).
        texts = {path: read_text(path) for path in glob.glob(os.path.join(metrics, "*.prom"))}
        done = [max([float(v) for v in re.findall(r"^ncclwatch_collectives_completed_total\{.*\} (\S+)$", t, re.M)]
                    or [0]) for t in texts.values()]
        return len(texts) == 2 and all(d >= 300 for d in done) and texts

    def sample(p):
        seen.update(wait_for(all_counted, "two metrics files counting 300 all-reduces"))

    j = job(2, ["--iters", "300", "--linger-ms", "7000"], env={"NCCLWATCH_METRICS": metrics}, timeout=30,
            after_start=sample)
    check(j.rc == 0, f"the job finished: {j.rc} {j.err[-1500:]}")
    check(len(seen) == 2, f"one file per process while it ran: {list(seen)}")
    for path, text in seen.items():
        samples = check_prometheus_text(text)
        ops = [v for n, l, v in samples if n == "ncclwatch_operations_total" and 'op="AllReduce"' in l]
        check(ops and max(ops) >= 300, f"{path}: the all-reduces are counted: {ops}")
        done = [v for n, l, v in samples if n == "ncclwatch_collectives_completed_total"]
        check(done and max(done) >= 300, f"{path}: completions counted: {done}")
    check(glob.glob(os.path.join(metrics, "*")) == [], f"files removed at exit: {os.listdir(metrics)}")


@case
def metrics_removed_when_a_signal_ends_the_job():
    # The launcher's SIGTERM ends the ranks (after their dumps): their metrics files go with them,
    # or the collector would show dead processes as alive.
    metrics = temp_dir("ncclwatch-e2e-metrics-")

    def wait_files(p):
        wait_for(lambda: len(glob.glob(os.path.join(metrics, "*.prom"))) == 2, "two metrics files")
    j = job(2, ["--iters", "20", "--busy-rank", "0", "--busy-at", "5", "--busy-ms", "-1"],
            env={"NCCLWATCH_METRICS": metrics, "NCCLWATCH_TIMEOUT": "600"}, timeout=8, after_start=wait_files,
            until=lambda d: lambda: len(glob.glob(os.path.join(metrics, "*.prom"))) == 2)
    for r in range(2):
        check(f"rank {r} killed by SIGTERM" in j.err and "signal" in j.reasons(r), f"rank {r} dumped, then SIGTERM ended it")
    check(os.listdir(metrics) == [], f"no metrics file left: {os.listdir(metrics)}")


@case
def one_line_per_rank_per_event():
    # At 512 ranks the launcher's log is where users look: each rank says each event once, in
    # one short line (what happened and the dump's file name), never the same stall twice.
    j = job(4, ["--iters", "20", "--busy-rank", "2", "--busy-at", "5", "--busy-ms", "-1"],
            env={"NCCLWATCH_TIMEOUT": "2"}, timeout=8, until=lambda d: dumped(d, range(4)))
    lines = j.ncclwatch_lines()
    dumps = sum(len(v) for v in j.dumps().values())
    check(len(lines) == dumps, f"one line per dump ({dumps}), no more:\n" + "\n".join(lines))
    for l in lines:
        check(len(l) < 300 and "(dump rank" in l, f"short, naming the dump: {l}")


@serial_case
def run_at_scale_says_how_many_ranks_dumped():
    # A hang at 64 ranks under `run`: by default no rank prints a line of its own (at 1,024 ranks
    # they would bury the verdict); `run` says in one line how many ranks dumped, above the
    # verdict. The ranks' own lines are for NCCLWATCH_LOG=info: one per rank at least.
    nw = built("bin", "ncclwatch")
    tmp = temp_dir("ncclwatch-e2e-")
    base = {k: v for k, v in os.environ.items() if not k.startswith("NCCLWATCH_") and k != "LD_PRELOAD"}
    ranks = 64

    def hang(name, env):
        return run_until_live_verdict(
            [nw, "run", "--dir", os.path.join(tmp, name), "--timeout", "3", "--set", "PEER_POLL_MS=200",
             "--", built("bin", "simlaunch"), "-n", str(ranks), "--timeout", "20", "--",
             built("bin", "sim_workload"), "--iters", "20", "--busy-rank", "1", "--busy-at", "4", "--busy-ms", "-1"],
            dict(base, **env), tmp, "rank_missing")

    def rank_lines(err):
        return [l for l in err.splitlines() if re.match(r"ncclwatch\[(rank \d+ )?pid \d+\]", l)]

    r = hang("default", {})
    check(r.returncode == 124 and "rank_missing" in r.stdout and "rank 1" in r.stdout,
          f"the verdict ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    check(re.search(rf"^ncclwatch: while the job runs, {ranks} of {ranks} ranks dumped \(", r.stderr, re.M),
          f"how many ranks dumped, in one line:\n{r.stderr[-2000:]}")
    lines = rank_lines(r.stderr)
    check(not lines, f"no line of the ranks' own by default ({len(lines)}):\n" + "\n".join(lines[:20]))
    r = hang("info", {"NCCLWATCH_LOG": "info"})
    said = {int(m) for l in rank_lines(r.stderr) for m in re.findall(r"^ncclwatch\[rank (\d+) ", l)}
    check(said == set(range(ranks)), f"at NCCLWATCH_LOG=info every rank says its dump: {sorted(said)}")
