"""What the Python tests share: sim_job.py run as a job over the simulator, libncclwatch.so
preloaded, its dumps and black boxes in a temporary directory of its own."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ncclwatch_testing import end_time_limit_when, launcher_of, node_dirs, temp_dir  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sim_job.py")


def marker_line(marker):
    """The line of sim_job.py that carries `marker` (a call site a test expects in a dump)."""
    with open(SCRIPT) as f:
        return next(i for i, l in enumerate(f, 1) if marker in l)


def run_sim_job(build, n, timeout, until=None, **env):
    """Runs sim_job.py as `n` ranks under simlaunch (which gives up after `timeout` s), a stall
    deadline of 2 s and peers polled every 200 ms unless `env` says otherwise; `env` adds the
    job's own settings. `until(dumps)`: a condition (ncclwatch_testing.dumped) after which the
    job's time limit ends at once, as the limit would end it (the hung jobs wait it out
    otherwise). Returns (the launcher's completed process, the dump directory, the black box
    directory)."""
    tmp = temp_dir("ncclwatch-py-")
    node, dumps = node_dirs(tmp), os.path.join(tmp, "dumps")
    boxes = node["NCCLWATCH_BLACKBOX_DIR"]
    job_env = dict(os.environ, LD_PRELOAD=os.path.join(build, "lib", "libncclwatch.so"), NCCLWATCH_DIR=dumps,
                   NCCLWATCH_TIMEOUT="2", NCCLWATCH_PEER_POLL_MS="200", **node)
    job_env.update(env)
    cmd = [os.path.join(build, "bin", "simlaunch"), "-n", str(n), "--timeout", str(timeout), "--", sys.executable, SCRIPT]
    with subprocess.Popen(cmd, env=job_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as launcher:
        if until:
            end_time_limit_when(launcher_of(launcher), until(dumps))
        try:
            out, err = launcher.communicate(timeout=timeout + 80)
        except subprocess.TimeoutExpired:
            launcher.kill()
            raise
    return subprocess.CompletedProcess(cmd, launcher.returncode, out, err), dumps, boxes


def analyze_json(build, dumps, boxes):
    """`ncclwatch analyze --json` of a job's dumps, reading its dead ranks' black boxes in `boxes`:
    the report, or one without verdicts when the command printed no JSON."""
    a = subprocess.run([os.path.join(build, "bin", "ncclwatch"), "analyze", "--json", dumps],
                       capture_output=True, text=True, env=dict(os.environ, NCCLWATCH_BLACKBOX_DIR=boxes))
    try:
        return json.loads(a.stdout)
    except ValueError:
        return {"verdicts": []}
