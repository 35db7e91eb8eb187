// Post-mortem by the host: a process that used NCCL and is gone without an `exit` record or a
// dump of its own end (SIGKILL, the OOM killer, a node agent) left its black box
// (black_box.h) behind; another process on the host turns it into a `postmortem` dump in that
// process's dump directory and removes it.
//
// Who does it: the host's caretaker (one process per user per black-box directory, elected with
// flock; the next one takes over when it dies) on every job-wide-request poll, so within about a
// second; `ncclwatch run` when its job has ended and `ncclwatch collect` for what no caretaker
// was left to convert. The same pass removes what dead processes left: hidden black boxes of a
// process killed while creating one, and relay files no live process watches. Commands that
// only read (`ncclwatch analyze`) read what is left in memory (ReadDeadBoxes) and change nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ncclwatch/trace_format.h"

namespace ncclwatch {
namespace blackbox {

// Who the process is, written into its black box at start (JSON) and read back for the dump.
struct BoxIdentity {
  std::string host;
  int pid = 0;
  int local_rank = -1;
  std::string job_id, job_instance, process_uid;
  int64_t start_unix_ns = 0, start_mono_ns = 0;
  uint64_t start_ticks = 0;  // the process's start as /proc/PID/stat says it (ReadProcStat; 0 unknown)
  int nccl_version = 0, cuda_driver_version = 0;
  std::string exe, cwd;
  std::vector<std::string> cmdline;
  std::vector<std::pair<std::string, std::string>> environment;
  std::string dump_dir;       // absolute: where its dumps go
  std::string dump_fallback;  // the fallback directory name (DumpDirectory)
  std::string dump_anchor;    // what of its dump directory existed at its start (DumpDirectory::start_anchor)
  std::string relay;          // its host's relay file ("" none)
};
std::string IdentityJson(const BoxIdentity& id);
bool ParseIdentity(const std::string& json, BoxIdentity* out);

struct Conversion {
  std::string box;        // the black box file
  int pid = 0, rank = -1;
  std::string dump;       // the postmortem (or stand-in) dump written; "" when none was
  bool stopped = false;   // a stand-in for a live process that cannot run: its box stays
  std::string line;       // one line saying what was done
  std::string job_instance;  // of the process, from its identity ("" unknown)
  bool ended = true;         // false: no death to tell (it lives on in another program, or exited with its record)
};

struct CaretakerPass {
  std::vector<Conversion> converted;
  int removed_leftovers = 0;  // hidden boxes and relay files of dead processes
};

// Converts the black boxes in `box_dir` of this user's processes that are gone and removes them,
// and removes leftovers of dead processes in `box_dir` and `relay_dir` ("none": not used).
// A live process that cannot run (stopped, traced, in a frozen cgroup: it answers no dump
// request) is marked so in its box, and once a job-wide request waits for it or it has been
// stopped past its deadline, gets a stand-in dump (reason `stopped`) from its box, once a stop.
// `own_box`: the caller's own black box file name, never touched ("" none). Never throws.
CaretakerPass ConvertDeadBoxes(const std::string& box_dir, const std::string& relay_dir,
                               const std::string& own_box = "");

// The stopped-process part of a pass alone, for the processes that are not the host's caretaker
// (the caretaker may be the stopped one, and its lock stays held while it is): every live box
// but `own_box` whose process cannot run is marked, and gets its stand-in, as ConvertDeadBoxes
// does; whoever sees a stop first says it, once. Boxes whose watchdog polled within a second
// cost one read of their header. Never throws.
std::vector<Conversion> CareForStoppedBoxes(const std::string& box_dir, const std::string& own_box);
// Whether a pass could find anything to do: a box of this user other than `own_box` whose lock
// is free (its process died) or whose process is quiet past timing::kStoppedLookAfter, or a
// hidden one (being created, or left by a process killed then). Allocates nothing and holds
// two descriptors at most, briefly: the caretaker asks it every tick, and passes only on a yes.
bool BoxesNeedCare(const std::string& box_dir, const std::string& own_box);

// A dead process's black box as it lies, read by a command that must change nothing: no lock
// taken, nothing written or removed.
struct LeftBox {
  std::string box;  // the black box file
  int pid = 0, rank = -1;
  std::string job_instance;
  std::string dump_dir;  // where its postmortem dump goes (absolute), "" unknown
  std::string dump;      // that dump (JSON, as the caretaker would write it); "" when none is due
  std::string problem;   // why it could not be read ("" none)
};
// The black boxes in `box_dir` of this user's processes that are gone. A box whose process
// dumped at its end has no dump (nothing to add). `wanted` (null: every box) is asked first with
// what the box's identity says (pid, rank, job_instance, dump_dir; "" and -1 where it cannot be
// read, and no dump yet): a box it declines, another job's, is left out unread (a host keeps
// the boxes of every job that died on it). Never throws.
std::vector<LeftBox> ReadDeadBoxes(const std::string& box_dir,
                                   const std::function<bool(const LeftBox&)>& wanted = nullptr);

// What the kernel log says about how `pid` ended: its OOM-killer line, "" when the log says
// nothing of it or cannot be read (/dev/kmsg needs privileges on most systems).
std::string KernelOomLine(int pid);
// The OOM-killer line for `pid` among kernel log records (one per string), "" if none.
std::string FindOomLine(const std::vector<std::string>& records, int pid);

// How a process without a word ended, as the postmortem dump's detail says it; `stopped`: its
// host saw it stopped until its end (it was killed stopped, not by what killed a running one);
// `zombie_status`: its wait status while it was a zombie not yet reaped (-1 not seen).
std::string HowItEnded(const std::string& oom_line, const std::optional<trace::StopKind>& stopped = std::nullopt,
                       int zombie_status = -1);

// A process that cannot run, as its host sees it: /proc/PID/stat's state (T stopped, t traced),
// else its cgroup frozen. Nothing when it runs, or cannot be seen.
std::optional<trace::StopKind> StopOf(int pid);
// Its pieces: what a /proc/PID/stat state letter says; whether the cgroup a /proc/PID/cgroup text
// names is frozen under `cgroup_root` (/sys/fs/cgroup; v2 cgroup.events, v1 freezer.state).
std::optional<trace::StopKind> StopOfState(char state);
bool CgroupFrozen(const std::string& proc_cgroup, const std::string& cgroup_root);

}  // namespace blackbox
}  // namespace ncclwatch
