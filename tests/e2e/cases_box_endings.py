"""How a process that used NCCL ended by itself, as its black box tells it: quick_exit, a raw
exit_group, an exec into a program without NCCL, setresuid or chroot after NCCL started, an exit
out of memory (never "SIGKILL or the OOM killer"); the boxes of another container's namespaces
in a shared /dev/shm (left to their own); a dump directory the application removed (not created
again). Each runs the same program without the library too: the same status and output."""
import glob
import json
import os
import shutil
import subprocess
import time

from e2e_common import built, case, job
from ncclwatch_testing import check, temp_dir, wait_for


def ending_of(j):
    return [l for l in j.err.splitlines() if l.startswith("simlaunch: rank 0 ")]


def run_app(scenario, preload, env=None, program="e2e_ending_app"):
    j = job(1, [scenario], env={"NCCLWATCH_TIMEOUT": "600", **(env or {})}, timeout=30, preload=preload,
            program=program)
    return j, ending_of(j)


def as_without(scenario, env=None, program="e2e_ending_app"):
    """The scenario without and with the library: the same exit status, ending and output. The
    run with it is returned."""
    without, end_without = run_app(scenario, False, env, program)
    got, end = run_app(scenario, True, env, program)
    check(got.rc == without.rc and end == end_without,
          f"{scenario}: {got.rc} {end} with ncclwatch, {without.rc} {end_without} without:\n{got.err[-1500:]}")
    check(got.out == without.out, f"{scenario}: output {got.out!r} with ncclwatch, {without.out!r} without")
    return got


def box_env(j):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCLWATCH_") and k != "LD_PRELOAD"}
    env["NCCLWATCH_BLACKBOX_DIR"] = os.path.join(j.tmp, "boxes")
    return env


def boxes_of(directory):
    return [f for f in os.listdir(directory) if f.startswith("ncclwatch-box-")] if os.path.isdir(directory) else []


def told(j):
    """What the host makes of the job's black box: what `analyze` reads of it in memory (its JSON
    report, and the dumps the box would become), then what `ncclwatch collect` writes and says.
    Returns (collect's lines, the rank's dumps after it)."""
    nw = built("bin", "ncclwatch")
    r = subprocess.run([nw, "analyze", "--json", j.dir], env=box_env(j), capture_output=True, text=True)
    check("without a word" not in r.stderr and "SIGKILL" not in r.stdout,
          f"analyze reads no death into the box:\n{r.stderr[-1500:]}\n{r.stdout[-2500:]}")
    c = subprocess.run([nw, "collect"], env=box_env(j), capture_output=True, text=True)
    check(not boxes_of(os.path.join(j.tmp, "boxes")), f"the box is gone: {boxes_of(os.path.join(j.tmp, 'boxes'))}")
    return c.stderr, j.dumps().get(0, [])


def exit_with(dumps, status):
    ends = [d["summary"] for d in dumps if d["summary"]["reason"] == "exit"]
    return any(s.get("exit_status") == status for s in ends)


def no_death(scenario, lines, dumps, j):
    reasons = [d["summary"]["reason"] for d in dumps]
    check("postmortem" not in reasons and "ended without a word" not in lines and "SIGKILL" not in lines,
          f"{scenario}: no death without a word is told: {reasons}\n{lines}\n{j.err[-1500:]}")


@case
def box_knows_quick_exit_and_exec():
    # quick_exit: the exit record with its status, the application's at_quick_exit handler still
    # runs. exec into a program without NCCL (after an exec that failed and returned): the
    # process lives on in another program, no death; the failed exec changed nothing.
    j = as_without("quick_exit")
    check("at_quick_exit handler ran" in j.out, f"the handler ran: {j.out!r}")
    lines, dumps = told(j)
    no_death("quick_exit", lines, dumps, j)
    check(exit_with(dumps, 7), f"quick_exit: an exit record with status 7: {[d['summary'] for d in dumps]}")

    j = as_without("exec")
    check("the new program runs" in j.out and "No such file" in j.out, f"exec: {j.out!r}")
    lines, dumps = told(j)
    no_death("exec", lines, dumps, j)
    check("exec of /bin/sh" in lines or "exec of /bin/sh" in j.err, f"exec: said what replaced it:\n{lines}\n{j.err[-1500:]}")


@case
def box_honest_after_raw_exit_group():
    # A raw exit_group leaves no exit record and, once reaped, no more than a SIGKILL does: the
    # post-mortem says the cause is not known (or the status, where the kernel still gave it),
    # never "SIGKILL or the OOM killer" as if it knew.
    j = as_without("raw_exit")
    nw = built("bin", "ncclwatch")
    subprocess.run([nw, "collect"], env=box_env(j), capture_output=True, text=True)
    post = [d["summary"] for d in j.dumps().get(0, []) if d["summary"]["reason"] == "postmortem"]
    check(post, f"raw_exit: its box became a post-mortem: {j.reasons(0)}")
    detail = post[0]["detail"]
    check("raw exit_group" in detail and detail != "ended without a word: SIGKILL or the OOM killer",
          f"raw_exit: the post-mortem does not claim a kill it cannot know: {detail!r}")


@case
def box_knows_exit_after_setresuid_chroot_or_out_of_memory():
    # After setresuid (the box's directory no longer ours) or chroot (no longer reachable), and
    # under an address-space limit (the exit record needs memory there is not): the box still
    # says the process exited, and with which status.
    if os.getuid() == 0:
        for scenario, status in (("setresuid", 4), ("chroot", 6)):
            job_id = f"e2e-ending-{scenario}-{os.getpid()}-{int(time.time() * 1000)}"
            j = as_without(scenario, env={"SLURM_JOB_ID": job_id})
            check(("now nobody" if scenario == "setresuid" else "in a chroot") in j.out, f"{scenario}: {j.out!r}")
            lines, dumps = told(j)
            no_death(scenario, lines, dumps, j)
            check(exit_with(dumps, status) or f"with status {status}" in lines,
                  f"{scenario}: its exit with status {status} is known:\n{lines}\n{[d['summary'] for d in dumps]}")
            if scenario == "chroot":  # the application's new root is left as it made it: empty
                roots = glob.glob(os.path.join(j.tmp, "chroot-root-*"))
                check(roots and all(not os.listdir(r) for r in roots),
                      f"chroot: nothing written into its new root: {[(r, os.listdir(r)) for r in roots]}")
            for left in glob.glob(f"/tmp/ncclwatch-{job_id}-*"):
                shutil.rmtree(left, ignore_errors=True)
    else:
        print("  setresuid, chroot: skipped (not root)")
    j = as_without("oom_exit", program="e2e_resource_app")
    check("out of memory" in j.out, f"oom_exit: {j.out!r}")
    lines, dumps = told(j)
    no_death("oom_exit", lines, dumps, j)
    check(exit_with(dumps, 12), f"oom_exit: the exit status 12 is kept: {[d['summary'] for d in dumps]}\n{lines}")


def unshare_works():
    if os.getuid() != 0 or not shutil.which("unshare"):
        return False
    r = subprocess.run(["unshare", "-m", "-p", "--fork", "--mount-proc", "true"], capture_output=True)
    return r.returncode == 0


@case
def other_namespaces_boxes_left_to_their_own():
    # Two containers share /dev/shm (docker --ipc=host) but not their file systems: a rank of the
    # other one (its own mount and PID namespaces, its dump directory a tmpfs of its own) is
    # SIGKILLed. A job of this one then ends on the host: its caretaker leaves that box alone
    # (nothing written into our view of the other's dump directory, the box kept), and so does
    # `ncclwatch collect` here; the other container's next job converts it into its own file
    # system.
    if not unshare_works():
        print("  skipped: unshare -m -p (as root) is not permitted here")
        return
    tmp = temp_dir("ncclwatch-e2e-ns-")
    boxes, inner, copy = (os.path.join(tmp, n) for n in ("boxes", "inner", "inner_copy"))
    for d in (boxes, inner, copy):
        os.makedirs(d)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCLWATCH_") and k != "LD_PRELOAD"}
    env.update(NCCLWATCH_BLACKBOX_DIR=boxes, NCCLWATCH_DIR=os.path.join(inner, "dumps"), NCCLWATCH_TIMEOUT="600",
               LD_PRELOAD=built("lib", "libncclwatch.so"), T=tmp, INNER=inner, COPY=copy,
               LAUNCH=built("bin", "simlaunch"), WORK=built("bin", "sim_workload"))
    script = r"""
set -e
mount -t tmpfs none "$INNER"
mkdir "$INNER/dumps"
cd "$T"
NCCLWATCH_SIM_FAULT=crash:rank=0,seq=20 "$LAUNCH" -n 1 --timeout 30 -- "$WORK" --iters 100 >/dev/null 2>&1 || true
touch "$T/ready"
i=0; while [ ! -e "$T/go" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
"$LAUNCH" -n 1 --timeout 30 -- "$WORK" --iters 3 >/dev/null 2>"$T/inner_second.err"
cp "$INNER"/dumps/* "$COPY"/ 2>/dev/null || true
"""
    p = subprocess.Popen(["unshare", "-m", "-p", "--fork", "--mount-proc", "sh", "-c", script], env=env, cwd=tmp,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: os.path.exists(os.path.join(tmp, "ready")), "the other container's rank killed", timeout=60)
        check(len(boxes_of(boxes)) == 1, f"its box is left: {os.listdir(boxes)}")
        # This container: a job ends on the host (its caretaker's pass), then `collect`.
        j = job(1, ["--iters", "3"], env={"NCCLWATCH_BLACKBOX_DIR": boxes}, timeout=30)
        check(j.rc == 0, f"our job ran: {j.err[-1500:]}")
        c = subprocess.run([built("bin", "ncclwatch"), "collect"], env=dict(env, NCCLWATCH_DIR=j.dir),
                           capture_output=True, text=True)
        check(len(boxes_of(boxes)) == 1, f"the other namespace's box is left to its own: {os.listdir(boxes)}\n{c.stderr}")
        check(not os.listdir(inner), f"nothing written into our view of its dump directory: {os.listdir(inner)}")
        check("ended without a word" not in j.err + c.stderr, f"no death told here:\n{j.err[-1500:]}\n{c.stderr}")
    finally:
        open(os.path.join(tmp, "go"), "w").close()
        out, err = p.communicate(timeout=90)
    post = glob.glob(os.path.join(copy, "rank00000-*-postmortem.json"))
    check(post, f"the other container's next job converted it in its own file system: {os.listdir(copy)}\n{err[-1500:]}")
    with open(post[0]) as f:
        check(json.load(f)["summary"]["detail"].startswith("ended without a word"), "its post-mortem says how")
    check(not boxes_of(boxes), f"and removed it: {os.listdir(boxes)}")


@case
def removed_working_directory_not_created_again():
    # NCCLWATCH_DIR relative; the application removes its working directory (its dump directory
    # with it) before its exit record. The tree is not created again: one line says it was
    # removed and where the record went instead (the fallback in /tmp). Status and output as
    # without the library.
    job_id = f"e2e-rmcwd-{os.getpid()}-{int(time.time() * 1000)}"
    fallback = f"/tmp/ncclwatch-{job_id}-{os.getuid()}"
    try:
        for preload in (False, True):
            work = os.path.join(temp_dir("ncclwatch-e2e-rmcwd-"), "work")
            env = {"NCCLWATCH_DIR": "dumps", "E2E_WORK_DIR": work, "SLURM_JOB_ID": job_id}
            j, end = run_app("rmcwd", preload, env)
            check(j.rc == 0 and not end and "removed its working directory" in j.out, f"rmcwd ({preload}): {j.rc} {j.out!r}")
            if not preload:
                without = j
                continue
            check(j.out == without.out, f"output {j.out!r} with ncclwatch, {without.out!r} without")
            check(not os.path.exists(work), f"the removed directory is not created again: {work} exists")
            said = [l for l in j.ncclwatch_lines() if "is gone" in l and "not created again" in l]
            check(said and fallback in said[0], f"one line says so, and where the record went:\n{j.err[-1500:]}")
            exits = glob.glob(os.path.join(fallback, "rank00000-*-exit.json"))
            check(exits, f"the exit record is in {fallback}: {os.listdir(fallback) if os.path.isdir(fallback) else '-'}")
    finally:
        shutil.rmtree(fallback, ignore_errors=True)
