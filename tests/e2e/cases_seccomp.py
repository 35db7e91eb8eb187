"""Never harm the job under a seccomp filter that refuses process_vm_readv (systemd's
SystemCallFilter=, sandboxes, container profiles): the library finds out before its first read
and reads only what can be read, so each run ends, prints and dumps as without the library."""
from cases_harm import app_with_dump, same_as_without
from e2e_common import case, long_case
from ncclwatch_testing import check

# The line each process says once (NCCLWATCH_LOG=info) when the call is refused.
SAID = "process_vm_readv is refused here"


def refused_read_runs_as_without(scenario, late=False):
    run = lambda s, preload: app_with_dump("e2e_seccomp_app", s, preload, env={"NCCLWATCH_LOG": "info"})
    last = f"{scenario}: 20 operations" + ("" if late else ", SIGSYS handler ran 0 times")
    waited = "waited for the worker" if late else "spun under a frame pointer into a PROT_NONE page"
    got = same_as_without(run, scenario, None, [f"{scenario}: {waited}", last])
    if "not on x86_64" in got.out or "cannot install" in got.out:
        print(f"  {scenario}: no filter here, nothing to compare: {got.out.strip()}")
        return
    reasons = got.reasons(0)
    check("peer_request" in reasons and reasons[-1] == "exit",
          f"{scenario}: the job-wide dump and the exit record were written: {reasons}\n{got.err[-2000:]}")
    d = got.first(0, "peer_request")
    main = [t for t in d["threads"] if t["tid"] == d["summary"]["pid"]]
    check(main and main[0]["frames"], f"{scenario}: the main thread is in the dump with its frames: {main}")
    others = [t for t in d["threads"] if not t["own"] and t["tid"] != d["summary"]["pid"] and t["frames"]]
    check(others, f"{scenario}: the sleeping NCCL thread's stack is in the dump: "
                  f"{[(t['tid'], t['note']) for t in d['threads']]}")
    said = [l for l in got.ncclwatch_lines() if SAID in l]
    check(len(said) == (0 if late else 1), f"{scenario}: said once that process_vm_readv is refused: {got.ncclwatch_lines()}")


@long_case(16)
def seccomp_kill_on_process_vm_readv_as_without():
    # SECCOMP_RET_KILL_PROCESS / KILL_THREAD: the library never makes the call in the process
    # (a child sharing its memory finds out), so the job lives, as without the library.
    for scenario in ("kill_process", "kill_thread"):
        refused_read_runs_as_without(scenario)


@long_case(16)
def seccomp_trap_and_eperm_on_process_vm_readv_as_without():
    # SECCOMP_RET_TRAP with the application's own SIGSYS handler: the handler never runs for a
    # call of ours. SECCOMP_RET_ERRNO(EPERM): a frame pointer into a PROT_NONE page (JIT code)
    # is read only after a readability check, so the dump does not fault.
    for scenario in ("trap", "eperm"):
        refused_read_runs_as_without(scenario)


@case
def seccomp_trap_installed_after_start_reaches_the_application():
    # A SECCOMP_RET_TRAP filter installed on every thread once NCCL has started (not seen at the
    # start): a dump's read on the library's own thread raises SIGSYS there, which must reach the
    # application's handler (our threads never block a fault signal), as on its own threads; its
    # EPERM then turns the library to checked reads.
    refused_read_runs_as_without("trap_after_start", late=True)
