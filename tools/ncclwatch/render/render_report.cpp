#include "render/render_report.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "format/hex.h"
#include "render/text_format.h"

namespace ncclwatch {
namespace analysis {

using nlohmann::json;
namespace rk = report_key;

bool Style::ColorWanted(bool no_color_flag) {
  const char* nc = std::getenv("NO_COLOR");
  return !no_color_flag && !(nc && *nc) && ::isatty(STDOUT_FILENO);
}

namespace {

std::string CulpritName(const Verdict& v) {
  std::string s = v.culprit_ranks.empty() ? "" : FormatRanks(v.culprit_ranks);
  // Every rank of one process that drives several (a process busy, stopped or gone): the process.
  if (!v.evidence.empty() && v.evidence.front().device >= 0 && v.culprit_ranks.size() > 1) {
    std::vector<int> ranks = v.culprit_ranks;
    std::sort(ranks.begin(), ranks.end());
    const CulpritEvidence& e = v.evidence.front();
    if (ranks == e.process_ranks)
      s += " (every rank of pid " + std::to_string(e.pid) + " on " + Printable(e.host) + ")";
  }
  if (!v.culprit_comm_ranks.empty())
    s += (s.empty() ? "" : " and ") + FormatRanks(v.culprit_comm_ranks, "comm rank") +
         " (global rank unknown)";
  return s;
}

// "AllReduce #42 on world (3f2a9c0d..)", "Send #3 0->1 on ..." for a transfer (p2p_src >= 0).
std::string OpOnComm(const std::string& op, int64_t seq, const std::string& comm, const std::string& comm_name,
                     int p2p_src = -1, int p2p_dst = -1) {
  std::string s = OpLabel(op, seq);
  if (p2p_src >= 0) s += " " + std::to_string(p2p_src) + "->" + std::to_string(p2p_dst);
  return s + " on " + CommLabel(comm, comm_name);
}

std::string OpRefText(const OpRef& r) { return OpOnComm(r.op, r.seq, r.comm, r.comm_name); }

std::string CycleStepText(const CycleStep& step) {
  return "rank " + std::to_string(step.from) + " waits in " +
         OpOnComm(step.op.op, step.op.seq, step.op.comm, step.op.comm_name, step.p2p ? step.p2p_src : -1,
                  step.p2p_dst) +
         " for rank " + std::to_string(step.to);
}

std::string ThreadLabel(const CulpritEvidence& e) {
  if (e.current_tid < 0) return "";
  return (e.current_thread.empty() ? "thread" : e.current_thread) + " (tid " + std::to_string(e.current_tid) + ")";
}

std::string ThreadLabel(int64_t tid, const std::string& name) {
  return (name.empty() ? "thread" : name) + " (tid " + std::to_string(tid) + ")";
}

// Why a thread is shown, after its label ("" when it is just another thread).
std::string RoleText(ThreadRole role, const CulpritEvidence& e) {
  switch (role) {
    case ThreadRole::IssuedLastCall:
      return "which issued " + (e.callsite_op ? OpRefText(*e.callsite_op) : std::string("its last call"));
    case ThreadRole::InsideNccl: return "inside NCCL";
    case ThreadRole::Main: return "the main thread";
    case ThreadRole::Python: return "running Python";
    case ThreadRole::Other:
    case ThreadRole::Count: break;
  }
  return "";
}

std::string StackNoteText(const CulpritEvidence& e) {
  switch (e.stack_note) {
    case StackNote::kNone: return "";
    case StackNote::kNoUsableDump: return "no stacks: no usable dump";
    case StackNote::kDetailsUnreadable:
      return "no stacks: " + (e.stack_note_text.empty() ? std::string("details unreadable") : e.stack_note_text);
    case StackNote::kThreadNote: return e.stack_note_text;
    case StackNote::kNoThreads: return "no thread stacks in its dump";
    case StackNote::kPythonFromEarlier:
      return "Python frames from its earlier dump " + e.stack_note_text +
             ", in the same state (its latest has none: a thread held the GIL)";
  }
  return "";
}

std::string Where(const Verdict& v) {
  if (v.comm.empty()) return "";
  return OpOnComm(v.op, v.seq, v.comm, v.comm_name, v.p2p ? v.p2p_src : -1, v.p2p_dst) + " (" +
         std::to_string(v.comm_size) + " ranks)";
}

// "rank 2 has not entered AllReduce #51 for 3.0 s; the deadline is 5.0 s".
std::string NotYetText(const NotYet& n) {
  const std::string who = n.culprit_ranks.empty() ? std::string() : FormatRanks(n.culprit_ranks);
  const bool one = n.culprit_ranks.size() == 1;
  const std::string op = OpLabel(n.op, n.seq), waited = " for " + FormatSeconds(n.waited_s);
  std::string s;
  switch (n.cause) {
    case Cause::GpuNotReached:
      s = who + (one ? "'s GPU has" : "' GPUs have") + " not reached " + op + ", which " +
          FormatRanks(n.waiting_ranks) + (n.waiting_ranks.size() == 1 ? " has" : " have") + " waited in" + waited;
      break;
    case Cause::StuckInCollective:
      s = "every member of " + op + " has been inside it" + waited;
      break;
    case Cause::InitHang:
      s = (who.empty() ? std::string("a member") : who) + (one || who.empty() ? " has" : " have") +
          " not joined the communicator " + FormatRanks(n.waiting_ranks) + " are creating (" + n.op + ")" + waited;
      break;
    default:
      s = (who.empty() ? std::string("a member") : who) + (one || who.empty() ? " has" : " have") + " not entered " +
          op + waited + " (" + FormatRanks(n.waiting_ranks) + (n.waiting_ranks.size() == 1 ? " waits" : " wait") + " in it)";
  }
  if (n.deadline_s > 0) s += "; the deadline is " + FormatSeconds(n.deadline_s);
  return s;
}

// "3 ms", "250 ms", "1.0 s": how far apart the killed ranks' last signs of life lie.
std::string WithinText(double ms) {
  char b[32];
  if (ms < 1000) std::snprintf(b, sizeof b, "%.0f ms", ms);
  else std::snprintf(b, sizeof b, "%.1f s", ms / 1000);
  return b;
}

// extra_call: "which no other rank issued: ranks 0-2 completed #40 and ended normally".
std::string EndedText(const Verdict& v) {
  const bool all_others = v.culprit_ranks.size() + v.ended_ranks.size() == static_cast<size_t>(v.comm_size);
  const bool one = v.ended_ranks.size() == 1;
  return std::string(all_others ? "which no other rank issued" : "which " + FormatRanks(v.ended_ranks) + " never issued") +
         ": " + FormatRanks(v.ended_ranks) + (v.ended_after_seq > 0 ? " completed #" + std::to_string(v.ended_after_seq) + " and" : "") +
         " ended normally (exit status 0" + (one ? "" : " each") + ")";
}

// "rank 2's Send #13 to rank 5 carries 2 KiB (512 float32)", "rank 5's Recv #13 from rank 2
// expects 4 KiB (1024 float32)".
std::string P2pCallText(const P2pCall& c) {
  const bool send = c.op == "Send";
  std::string s = "rank " + std::to_string(c.rank) + "'s " + OpLabel(c.op, c.p2p_seq) + (send ? " to" : " from") +
                  " rank " + std::to_string(c.peer) + (send ? " carries " : " expects ") + FormatBytes(c.bytes);
  if (c.count >= 0) s += " (" + std::to_string(c.count) + " " + (c.dtype.empty() ? "?" : c.dtype) + ")";
  return s;
}

// A group of point-to-point operations as one operation: "AlltoAll-like group #13 (7 peers)".
std::string P2pGroupText(const P2pGroup& g) {
  const std::string seq = g.p2p_seq > 0 ? " #" + std::to_string(g.p2p_seq) : "";
  const std::string peers = std::to_string(g.peers) + (g.peers == 1 ? " peer" : " peers");
  if (g.id <= 0 || g.ops.size() <= 1) return "outside any group";
  if (g.shape == "alltoall_like") return "AlltoAll-like group" + seq + " (" + peers + ")";
  if (g.shape == "ring_exchange") return "ring-exchange group" + seq + " (" + peers + ")";
  if (g.shape == "mixed")
    return "group of " + std::to_string(g.ops.size()) + " operations, collectives and Send/Recv (" + peers + ")";
  return "group of " + std::to_string(g.ops.size()) + " Send/Recv" + seq + " (" + peers + ")";
}

// Where one side of a transfer is, from its operation state.
std::string P2pStateText(const std::string& state) {
  if (state == "completed") return "completed";
  if (state == "gpu_reached") return "its GPU is inside it";
  if (state == "enqueued" || state == "pending_launch") return "queued: its GPU has not reached it";
  return state;
}

std::string Headline(const Verdict& v) {
  std::string who = CulpritName(v);
  switch (v.cause) {
    case Cause::RankMissing: return who + " never entered " + Where(v);
    case Cause::GpuNotReached: return "the GPU of " + who + " never reached " + Where(v);
    case Cause::StuckInCollective: return "every member is inside " + Where(v) + " and none completes";
    case Cause::Mismatch: return who + " called a different operation at " + Where(v);
    case Cause::P2pUnmatched:
      if (v.cycle.empty() && v.p2p && v.culprit_ranks.size() == 1 && (v.op == "Send" || v.op == "Recv")) {
        const bool send = v.op == "Send";  // the side that was called; the culprit owes the other
        const int caller = v.culprit_ranks[0] == v.p2p_src ? v.p2p_dst : v.p2p_src;
        return who + " never posted the " + (send ? "Recv" : "Send") + " matching rank " + std::to_string(caller) +
               "'s " + OpLabel(v.op, v.seq) + " on " + CommLabel(v.comm, v.comm_name) + " (" +
               std::to_string(v.comm_size) + " ranks)";
      }
      return v.cycle.empty() ? who + " never matched " + Where(v)
                             : "Send/Recv deadlock between " + who + " at " + Where(v);
    case Cause::CrossCommDeadlock: return "cross-communicator deadlock between " + who;
    case Cause::P2pMismatch:
      if (v.p2p_calls.size() == 2)
        return v.p2p_mismatch + " mismatch on " + CommLabel(v.comm, v.comm_name) + ": " + P2pCallText(v.p2p_calls[0]) +
               "; " + P2pCallText(v.p2p_calls[1]);
      return v.p2p_mismatch + " mismatch between " + who + " at " + Where(v);
    case Cause::P2pOutOfOrder:
      return "Send/Recv out of order between " + who + ": each waits for a call the other issued behind its own wait, at " +
             Where(v);
    case Cause::RankDead:
      if (v.culprit_unanswered || v.culprit_unreadable)
        return who + (v.culprit_unanswered ? " did not answer the latest dump request" : " left only unreadable dumps") +
               (v.comm.empty() ? std::string() : "; others wait in " + Where(v));
      return who + " is dead" + (v.comm.empty() ? " (nobody waits for it yet)" : "; others wait in " + Where(v));
    case Cause::RankStopped:
      return who + (v.culprit_stopped_killed ? " was stopped, then killed while stopped" : " is stopped") +
             (v.comm.empty() ? std::string() : "; others wait in " + Where(v));
    case Cause::NcclError: return "an NCCL call of " + who + " failed; others wait in " + Where(v);
    case Cause::RankExited: return who + " exited while others wait in " + Where(v);
    case Cause::ExtraCall: return who + " issued " + Where(v) + ", " + EndedText(v);
    case Cause::JobKilled:
      return "every rank ended within " + WithinText(v.killed_within_ms) + ": the job was killed from outside";
    case Cause::HostLost:
      return "every rank of host " + v.killed_host + " (" + FormatRanks(v.killed_ranks) + ") ended within " +
             WithinText(v.killed_within_ms) + (v.comm.empty() ? std::string() : "; others wait in " + Where(v));
    case Cause::InitHang:
      if (!v.id_groups.empty())
        return "ranks created communicators of " + std::to_string(v.comm_size) + " ranks with " +
               std::to_string(v.id_groups.size()) + " different ids: none can complete";
      return who.empty() ? "every member is inside " + Where(v) + " and none returns"
                         : who + " never joined: the others wait in " + Where(v);
    case Cause::NoHang:
      if (!v.not_yet.empty()) return "no hang yet: " + NotYetText(v.not_yet.front());
      break;
    case Cause::Count: break;
  }
  return "no hang";
}

// For a call issued by a thread running no Python: "AllReduce #5 on c issued by native_issuer (tid
// 9) during `train_step` at train.py:31, driven from the main thread"; empty otherwise.
std::string IssuedByText(const CulpritEvidence& e) {
  if (e.callsite_driven_from.empty() || e.callsite.python.empty()) return "";
  const trace::PythonFrame* at = nullptr;  // the script's own line, not the framework's; else the first named
  for (const auto& f : e.callsite.python) {
    const bool named = !f.function.empty() || !f.file.empty();
    if (named && (!at || (at->library && !f.library))) at = &f;
    if (at && !at->library) break;
  }
  const std::string call = (e.callsite_op ? OpRefText(*e.callsite_op) : std::string("its last call")) + " issued by " +
                           e.callsite_thread;
  if (!at) return call + ", driven from the " + e.callsite_driven_from + " (its Python line was not named: the code was gone when it was read)";
  const size_t slash = at->file.rfind('/');
  const std::string file = slash == std::string::npos ? at->file : at->file.substr(slash + 1);
  return call + " during `" + at->function + "` at " + file + ":" + std::to_string(at->line) + ", driven from the " +
         e.callsite_driven_from;
}

void RenderEvidence(std::ostream& out, const Style& st, const CulpritEvidence& e, const SourceLines& lines,
                    bool verbose) {
  std::string who = e.rank >= 0 ? "rank " + std::to_string(e.rank) : "comm rank " + std::to_string(e.comm_rank);
  out << "   " << st.Yellow(who);
  if (e.device >= 0)  // one of several ranks of its process
    out << " (device " << e.device << " of pid " << e.pid << " on " << Printable(e.host) << ", which drives "
        << FormatRanks(e.process_ranks) << ")";
  else if (e.launch >= 0)  // two launches share a communicator and repeat RANK numbers
    out << " (RANK " << e.launch_rank << " of launch " << e.launch << "; " << Printable(e.host) << ", pid " << e.pid
        << ")";
  else if (!e.host.empty())
    out << " (" << Printable(e.host) << ", pid " << e.pid << ")";
  out << ": " << Printable(WhereText(e)) << "\n";
  const std::string issued_by = IssuedByText(e);
  if (!issued_by.empty()) out << "     " << Printable(issued_by) << "\n";
  if (!e.current.Empty()) {
    std::string role = RoleText(e.current_role, e);
    if (e.current_role == ThreadRole::IssuedLastCall && e.current_tid == e.pid) role = "the main thread, " + role;
    out << "     now, " << Printable(ThreadLabel(e)) << (role.empty() ? "" : ", " + Printable(role)) << ":\n";
    RenderStack(out, st, e.current, lines, "       ", verbose);
  }
  // The other threads that tell something (the main thread, threads running the application's
  // Python code); the idle ones in one line (all of them are in the JSON).
  constexpr size_t kOtherThreadsShown = 4;
  size_t shown = 0, hidden = 0;
  std::string idle;
  size_t idle_count = 0;
  for (const auto& t : e.other_threads) {
    if (t.idle) {
      if (idle_count++ < kOtherThreadsShown || verbose) idle += (idle.empty() ? "" : ", ") + ThreadLabel(t.tid, t.name);
      continue;
    }
    if (t.stack.Empty()) continue;
    if (!verbose && shown == kOtherThreadsShown) {
      ++hidden;
      continue;
    }
    ++shown;
    std::string role = RoleText(t.role, e);
    out << "     " << Printable(ThreadLabel(t.tid, t.name)) << (role.empty() ? "" : ", " + Printable(role)) << ":\n";
    RenderStack(out, st, t.stack, lines, "       ", verbose);
  }
  if (hidden > 0)
    out << "     " << st.Dim("... " + std::to_string(hidden) + " more threads running Python (--verbose)") << "\n";
  if (idle_count > 0) {
    if (idle_count > kOtherThreadsShown && !verbose) idle += ", ...";
    out << "     " << st.Dim(Printable(std::to_string(idle_count) + " idle thread" + (idle_count > 1 ? "s" : "") + ": " + idle))
        << "\n";
  }
  if (!e.callsite.Empty()) {
    out << "     " << Printable(e.callsite_op ? OpRefText(*e.callsite_op) : "") << " was called from"
        << (e.callsite_driven_from.empty() ? "" : " (Python frames: driven from the " + e.callsite_driven_from + ")")
        << ":\n";
    RenderStack(out, st, e.callsite, lines, "       ", verbose);
  }
  if (e.stack_note != StackNote::kNone) out << "     " << st.Dim(Printable(StackNoteText(e))) << "\n";
}

void RenderVerdict(std::ostream& out, const Style& st, const Report& report, const Verdict& v, size_t number,
                   bool verbose) {
  out << st.Bold(std::to_string(number) + ". ") << st.Red(analysis::CauseName(v.cause)) << "  "
      << st.Bold(Printable(Headline(v))) << "\n";
  if (!v.waiting_ranks.empty()) {
    out << "   waiting: " << FormatRanks(v.waiting_ranks);
    if (v.waited_s >= 0) out << " for " << FormatSeconds(v.waited_s);
    if (v.bytes >= 0) out << "  (" << v.op << ", " << FormatBytes(v.bytes) << ")";
    out << "\n";
  }
  for (const auto& line : FrameworkEndingLines(v)) out << "   " << Printable(line) << "\n";
  for (const auto& g : v.id_groups)
    out << "   " << FormatRanks(g.ranks) << ": inside " << v.op << " of communicator "
        << Printable(CommLabel(g.comm, g.comm_name)) << "\n";
  for (const auto& g : v.groups) {
    out << "   " << FormatRanks(g.ranks) << ": " << g.op << " count " << g.count << " " << g.dtype;
    if (!g.redop.empty()) out << " " << g.redop;
    if (g.root >= 0) out << " root " << g.root;
    out << "\n";
  }
  for (const auto& c : v.p2p_calls) {
    // "rank 2: Send #13 to rank 5"
    const std::string side = "rank " + std::to_string(c.rank) + ": " + OpLabel(c.op, c.p2p_seq) +
                             (c.op == "Send" ? " to" : " from") + " rank " + std::to_string(c.peer);
    if (c.count < 0) {
      out << "   " << side << ": no record of it is left (not in its dump, or its ring no longer holds it): "
          << "the two sides cannot be compared\n";
      continue;
    }
    out << "   " << side << ", " << c.count << " " << Printable(c.dtype) << " (" << FormatBytes(c.bytes) << "), "
        << (c.group.id <= 0 || c.group.ops.size() <= 1 ? std::string("outside any group")
                                                        : "in its " + Printable(P2pGroupText(c.group)))
        << "; " << Printable(P2pStateText(c.state)) << "\n";
  }
  if (!v.cycle.empty()) {
    std::string chain;
    for (size_t i = 0; i < v.cycle.size(); ++i) chain += (i ? " -> " : "") + std::to_string(v.cycle[i]);
    out << "   wait cycle: " << chain << "\n";
    for (const auto& step : v.cycle_steps) out << "     " << CycleStepText(step) << "\n";
  }
  std::set<std::pair<std::string, int64_t>> processes_shown;  // of ranks that share a process
  for (const auto& e : v.evidence) {
    if (e.device >= 0 && !processes_shown.insert({e.host, e.pid}).second) {
      // Another rank of a process shown above: its stacks are that process's.
      out << "   " << st.Yellow("rank " + std::to_string(e.rank)) << " (device " << e.device << " of the same pid "
          << e.pid << "): " << Printable(WhereText(e)) << "\n";
      continue;
    }
    RenderEvidence(out, st, e, report.source_lines, verbose);
  }
  size_t named = v.culprit_ranks.size() + v.culprit_comm_ranks.size();
  if (named > v.evidence.size())
    out << "   " << st.Dim("(stacks shown for " + std::to_string(v.evidence.size()) + " of " +
                           std::to_string(named) + " culprits)") << "\n";
  if (!v.nccl_env.empty()) {
    out << "   NCCL settings:";
    for (const auto& [k, val] : v.nccl_env) out << " " << k << "=" << val;
    out << "\n";
  } else if (v.cause == Cause::StuckInCollective) {
    out << "   NCCL settings: none set (NCCL defaults)\n";
  }
  out << "   " << st.Cyan("advice:") << " " << Printable(AdviceText(v, report)) << "\n";
  // Many operations blocked behind one root (a group of Send/Recv to every peer): counts per
  // communicator and kind, then the first few (every one is in the JSON).
  constexpr size_t kConsequencesShown = 4;
  if (v.consequences.size() > kConsequencesShown && !verbose) {
    std::map<std::pair<std::string, std::string>, size_t> counts;  // (comm label, kind) -> n
    for (const auto& q : v.consequences)
      counts[{CommLabel(q.comm, q.comm_name), q.p2p ? std::string("Send/Recv") : q.op}]++;
    std::string summary;
    for (const auto& [key, n] : counts)
      summary += (summary.empty() ? "" : ", ") + std::to_string(n) + " " + key.second + " on " + key.first;
    out << "   also blocked because of this: " << v.consequences.size() << " operations (" << Printable(summary)
        << "); the first " << kConsequencesShown << " (--verbose, --json: all):\n";
  } else if (!v.consequences.empty()) {
    out << "   also blocked because of this:\n";
  }
  size_t consequences_shown = 0;
  if (!v.consequences.empty()) {
    for (const auto& q : v.consequences) {
      if (!verbose && v.consequences.size() > kConsequencesShown && consequences_shown++ == kConsequencesShown) break;
      out << "     - " << OpLabel(q.op, q.seq);
      if (q.p2p) out << " " << q.p2p_src << "->" << q.p2p_dst;
      out << " on " << CommLabel(q.comm, q.comm_name) << " (" << q.comm_size << " ranks)";
      if (!q.waiting_ranks.empty()) out << ": " << FormatRanks(q.waiting_ranks) << " wait";
      else out << ": queued behind it on the GPUs (no rank inside yet)";
      out << "\n";
    }
  }
}

void RenderHistory(std::ostream& out, const Style& st, const Report& report, bool verbose) {
  if (!verbose || report.earlier_dumps.empty()) return;
  out << "\n"
      << st.Dim("other dumps of these ranks (history; the evidence is each rank's latest dump, or the one where "
                "its teardown began):")
      << "\n";
  for (const auto& e : report.earlier_dumps)
    out << "   rank " << e.rank << ": " << Printable(e.file) << " (" << e.reason
        << (e.later ? "; later than the evidence: it followed the teardown's start" : "") << ")\n";
}

std::string Ms(double ms) {
  char b[32];
  std::snprintf(b, sizeof b, ms < 10 ? "%.1f ms" : "%.0f ms", ms);
  return b;
}

// Below the verdicts: what is worth knowing but is not why the job hangs.
// The innermost frame worth naming of a stack: the script's own Python frame, else any Python
// frame, else the first named native one.
std::string BusyIn(const trace::Stack& s) {
  for (const auto& f : s.python)
    if (!f.library) return f.function + " (" + f.file + ":" + std::to_string(f.line) + ")";
  if (!s.python.empty()) return s.python.front().function;
  // The application's own code rather than the C library's sleep or wait it called.
  const auto system = [](const std::string& m) {
    return m.rfind("/lib/", 0) == 0 || m.rfind("/lib64/", 0) == 0 || m.rfind("/usr/lib/", 0) == 0 ||
           m.rfind("/usr/lib64/", 0) == 0;
  };
  for (const auto& f : s.native)
    if (!f.symbol.empty() && !system(f.module)) return f.symbol;
  for (const auto& f : s.native)
    if (!f.symbol.empty()) return f.symbol;
  return "";
}

std::string RecoveredStallText(const RecoveredStall& r) {
  std::string s = OpRefText(r.op) + " stalled ";
  s += r.recovered_after_s >= 0 ? FormatSeconds(r.recovered_after_s) + " (reported at " + FormatSeconds(r.stalled_after_s) + ")"
                                : "(reported at " + FormatSeconds(r.stalled_after_s) + ")";
  if (!r.waiting_for.empty()) {
    s += " waiting for " + FormatRanks(r.waiting_for);
    std::string in = r.culprit ? BusyIn(r.culprit->current) : "";
    if (r.cause == Cause::RankMissing && !in.empty()) s += " (busy in " + in + ")";
    else if (r.cause != Cause::NoHang) s += " (" + std::string(CauseName(r.cause)) + ")";
  }
  return s + "; it recovered";
}

void RenderFindings(std::ostream& out, const Style& st, const Report& report, bool verbose) {
  if (report.findings.empty() && report.recovered_stalls.empty()) return;
  out << "\n" << st.Bold("Also noticed") << " (not a hang cause):\n";
  for (const auto& r : report.recovered_stalls) {
    out << "  stall_recovered  " << Printable(RecoveredStallText(r)) << "\n";
    if (r.reported_by.size() > 1) out << "    reported stalled by " << FormatRanks(r.reported_by) << "\n";
    if (r.culprit) RenderEvidence(out, st, *r.culprit, report.source_lines, verbose);
  }
  if (report.more_recovered_stalls > 0)
    out << "  " << report.more_recovered_stalls << " more stalled operation(s) recovered\n";
  for (const auto& f : report.findings) {
    out << "  slow_rank  rank " << f.rank << " (" << f.host << ", pid " << f.pid << ") reached "
        << f.last_in << " of " << f.collectives << " collectives on " << f.comm
        << (f.comm_name.empty() ? "" : " (" + f.comm_name + ")") << " last: " << Ms(f.lateness_median_ms)
        << " behind the others (median), " << Ms(f.lateness_p90_ms) << " p90";
    if (f.clock_spread_ms > 0) out << "; clocks aligned within " << Ms(f.clock_spread_ms);
    out << "\n    every member waits for it at each of these collectives: look at what it does before them\n";
    if (!f.callsite.python.empty() || !f.callsite.native.empty()) {
      out << "    where it issues them" << (f.callsite_op.empty() ? "" : " (" + f.callsite_op + ")") << ":\n";
      RenderStack(out, st, f.callsite, report.source_lines, "      ", verbose);
    }
  }
}

// A blank line before them when `separate`.
void RenderNotes(std::ostream& out, const Style& st, const Report& report, bool separate) {
  const std::vector<std::string> notes = NotesText(report);
  if (separate && !notes.empty()) out << "\n";
  for (const auto& n : notes) out << st.Dim("note: " + Printable(n)) << "\n";
}

// Frames as objects, Python first, innermost first: kind, function, file, line (0 unknown),
// module, offset, ip, build_id and module_offset (native), library (Python: a library frame, not
// the user's code). A native frame's file and line come from the debug info of exactly its
// build, where the symbolization pass found it (symbolize_debug.h), else stay empty and 0.
json StackFrames(const trace::Stack& s, const SourceLines& lines) {
  json a = json::array();
  for (const auto& f : s.python)
    a.push_back({{rk::kKind, "python"}, {rk::kFunction, f.function}, {rk::kFile, f.file}, {rk::kLine, f.line},
                 {rk::kLibrary, f.library}});
  for (const auto& f : s.native) {
    const SourceLine* source = lines.Of(f);
    const std::string function = !f.symbol.empty() || !source ? f.symbol : source->function;
    a.push_back({{rk::kKind, "native"}, {rk::kFunction, function}, {rk::kFile, source ? source->file : ""},
                 {rk::kLine, source ? source->line : 0}, {rk::kModule, f.module}, {rk::kOffset, f.offset},
                 {rk::kIp, trace::HexNumber(f.ip)}, {rk::kBuildId, f.build_id},
                 {rk::kModuleOffset, trace::HexNumber(f.module_offset)}});
  }
  return a;
}

json OrNull(int64_t v) { return v < 0 ? json(nullptr) : json(v); }

}  // namespace

std::string ExceptionText(const trace::UncaughtException& e) {
  std::string text = "uncaught " + (e.type.empty() ? std::string("exception") : e.type);
  if (!e.message.empty()) text += ": " + e.message;
  if (!e.file.empty()) {
    const size_t slash = e.file.rfind('/');
    text += " (raised at " + e.file.substr(slash == std::string::npos ? 0 : slash + 1) + ":" + std::to_string(e.line) +
            (e.function.empty() ? "" : " in " + e.function) + ")";
  }
  return text;
}

std::string FrameworkEndingText(const FrameworkEnded& e) {
  using R = trace::DumpReason;
  std::string how;
  if (e.reason == trace::DumpReasonName(R::Exit) || e.reason == trace::DumpReasonName(R::ExitInFlight))
    how = e.exit_status >= 0 ? "exit status " + std::to_string(e.exit_status) : std::string("its exit");
  else if (e.reason == trace::DumpReasonName(R::FatalSignal))
    how = e.signal.empty() ? std::string("a fatal signal") : e.signal;
  else if (e.reason == trace::DumpReasonName(R::Signal))
    how = e.signal.empty() ? std::string("a signal") : e.signal;
  else
    how = "an end without a word";
  return "ncclCommAbort, then " + how;
}

std::vector<std::string> FrameworkEndingLines(const Verdict& v) {
  std::map<std::string, std::vector<int>> ended;  // one line per way it ended them
  for (const auto& e : v.ended_by_framework) ended[FrameworkEndingText(e)].push_back(e.rank);
  std::vector<std::string> lines;
  for (const auto& [how, ranks] : ended)
    lines.push_back(FormatRanks(ranks) + (ranks.size() == 1 ? ": ended by its" : ": ended by their") +
                    " framework after the wait (" + how + ")");
  return lines;
}

std::string PositionText(const CulpritPosition& p) {
  using State = CulpritState;
  std::string where;
  switch (p.state) {
    case State::NoDump:
      if (p.unanswered_behind_s >= 0)
        return "did not answer the latest dump request (its latest dump, " + FormatSeconds(p.unanswered_behind_s) +
               " older, is not used)";
      return "left no dump";
    case State::UnreadableDump: return "its dump is unreadable";
    case State::Crashed: return "crashed: " + (p.detail.empty() ? std::string("fatal signal") : p.detail);
    case State::Killed:
    case State::Stopped:
      if (p.state == State::Stopped) {
        trace::StopKind how;
        where = trace::ParseStopKind(p.stop_how.c_str(), &how) ? trace::StopKindText(how) : std::string("stopped");
        if (p.stopped_seen_unix_ns > 0) where += " since " + FormatWallClock(p.stopped_seen_unix_ns) + " (its host saw it so)";
        if (p.killed_while_stopped) where += ", then killed while stopped";
      } else {
        where = p.detail.empty() ? std::string("ended without a word") : p.detail;
      }
      if (p.in_nccl_known)
        where += p.was_inside_nccl ? "; last seen inside " + p.function + " (tid " + std::to_string(p.tid) + ")"
                                   : "; last seen outside NCCL";
      if (p.states_never)
        where += "; its watchdog never polled: what its GPU did is unknown";
      else if (p.box_age_s >= 0)
        where += "; its black box is as of " + FormatSeconds(p.box_age_s) + " before its last sign of life";
      break;
    case State::NcclError: where = "NCCL error: " + (p.detail.empty() ? std::string("an NCCL call failed") : p.detail); break;
    case State::Exited:
      where = "exited" + (p.exit_status >= 0 ? " with status " + std::to_string(p.exit_status) : std::string()) +
              (p.exit_in_flight ? " with operations in flight" : "") + (p.aborted_first ? " after ncclCommAbort" : "");
      if (p.exception) where += "; " + ExceptionText(*p.exception);
      break;
    case State::OutsideNccl: where = "not inside NCCL"; break;
    case State::InsideNccl:
      where = "inside " + p.function + " for " + FormatSeconds(p.since_s) + " (tid " + std::to_string(p.tid) + ")";
      break;
    case State::Count: break;
  }
  const std::string seq = "#" + std::to_string(p.comm_seq);
  const std::string age = p.issued_age_s < 0 ? std::string()
                          : " (issued " + FormatSeconds(p.issued_age_s) +
                                (p.box_age_s >= 0 || p.states_never ? " before its last sign of life)" : " before its dump)");
  // A black box with several calls after the last one its GPU had finished: its last call,
  // and how far its GPU had got at the box's last update.
  const bool from_last_call = p.finished_through_seq >= 0 &&
                              (p.comm_state == CommPosition::GpuBehind || p.comm_state == CommPosition::GpuUnknown);
  if (from_last_call) {
    where += "; last call on this communicator " + seq;
    if (!p.states_never) {  // else said above: what its GPU did is unknown
      where += "; its GPU had finished " +
               (p.finished_through_seq > 0 ? "#" + std::to_string(p.finished_through_seq) : std::string("none of them")) +
               " at its black box's last update";
      if (p.comm_state == CommPosition::GpuUnknown) where += "; whether it finished " + seq + " is unknown (issued after that update)";
    }
  }
  if (!from_last_call) switch (p.comm_state) {
    case CommPosition::Unknown: break;
    case CommPosition::NotCreated: where += "; it has not created this communicator"; break;
    case CommPosition::GpuBehind:
      where += (p.box_age_s >= 0 ? "; its GPU had not finished " + seq + " at its black box's last update"
                                 : "; its GPU has not finished " + seq) +
               ", which the others completed";
      break;
    case CommPosition::GpuUnknown:
      where += "; whether its GPU finished " + seq + " is unknown (issued after its black box's last update)";
      break;
    case CommPosition::NotCalled: where += "; last call on this communicator " + seq; break;
    case CommPosition::GpuNotReached:
      where += (p.box_age_s >= 0 ? "; its GPU had not reached " + seq + " at its black box's last update"
                                 : "; its GPU has not reached " + seq) + age;
      break;
    case CommPosition::GpuInside:
      where += (p.box_age_s >= 0 ? "; its GPU was inside " + seq + " at its black box's last update"
                                 : "; its GPU is inside " + seq) + age;
      break;
    case CommPosition::NotInReplay:
      where += "; no replay of the CUDA graph holding " + seq + " is under way on it (the last one ended)";
      break;
    case CommPosition::Count: break;
  }
  if (!p.then.empty()) {
    where += "; then";
    for (const auto& r : p.then) where += " " + r;
  }
  return where;
}

std::string WhereText(const CulpritEvidence& e) {
  if (e.position.state == CulpritState::UnreadableDump) return "its dump is unreadable (" + e.file + ")";
  return PositionText(e.position);
}

std::string ProblemText(const Problem& p) {
  const std::string rank = std::to_string(p.number);
  switch (p.kind) {
    case ProblemKind::kUnreadable: return p.message + "; skipped";
    case ProblemKind::kReader: return p.message;
    case ProblemKind::kRankUnknown:
      return "global rank unknown (summary.rank is -1 and no full-size communicator); skipped";
    case ProblemKind::kNoSuchAttempt:
      return rank + " is not an attempt here: there are " + std::to_string(p.count) + " attempts; the latest is used";
    case ProblemKind::kSameDumpSeq: return "same process and dump_seq as " + p.other + "; skipped";
    case ProblemKind::kSameTimeClaim: return "claims rank " + rank + " at the same time as " + p.other + "; skipped";
    case ProblemKind::kLaterClaim:
      return "another process claims rank " + rank + " with a later dump (" + p.other + "); not used";
    case ProblemKind::kDetailsUnreadable: return p.message + "; details not used";
    case ProblemKind::kNewerVersion:
      return p.message + (p.count > 1 ? "; so are " + std::to_string(p.count - 1) + " more files here; all skipped"
                                      : "; skipped");
  }
  return p.message;
}

std::string ProblemLine(const Problem& p) {
  return "ncclwatch: " + Printable(p.file) + ": " + Printable(ProblemText(p));
}

std::vector<std::string> NotesText(const Report& report) {
  std::vector<std::string> notes;
  for (const auto& d : report.unanswered)
    notes.push_back("rank " + std::to_string(d.rank) + " did not answer the latest dump request: its latest dump (" +
                    d.file + ") is " + FormatSeconds(d.behind_s) + " older and answers an earlier one; not used");
  for (const auto& d : report.stale_evidence)
    notes.push_back("rank " + std::to_string(d.rank) + "'s evidence (" + d.file + ", " + d.reason + ") is " +
                    FormatSeconds(d.behind_s) + " older than the newest dump: it may describe an earlier state");
  std::set<std::string> instances;
  for (const auto& a : report.attempts) instances.insert(a.job_instance);
  if (report.attempts.size() > 1 && instances.size() == report.attempts.size() && !instances.count("")) {
    // Jobs that name themselves apart (two `ncclwatch run`s, two launcher jobs) in one directory.
    const Attempt& a = report.attempts[static_cast<size_t>(std::max(report.attempt, 1) - 1)];
    notes.push_back(std::to_string(report.attempts.size()) + " jobs in this directory (one job instance each); " +
                    "analyzing job " + std::to_string(report.attempt) + ", " + Printable(a.job_instance) +
                    (report.attempt == static_cast<int>(report.attempts.size()) ? " (the newest)" : "") +
                    ", alone; --attempt N picks another");
  } else if (report.attempts.size() > 1)
    notes.push_back(std::to_string(report.attempts.size()) + " attempts of the job in this directory; " +
                    "analyzing attempt " + std::to_string(report.attempt) +
                    (report.attempt == static_cast<int>(report.attempts.size()) ? " (the latest)" : "") +
                    "; --attempt N picks another");
  return notes;
}

std::string RenderReportText(const Report& report, const ReportTextOptions& options) {
  std::ostringstream out;
  const Style& st = options.style;
  out << "ncclwatch analyze: " << report.ranks_seen << " ranks with dumps, world size "
      << report.world_size;
  if (!report.ranks_without_dump.empty())
    out << "; no usable dump from " << FormatRanks(report.ranks_without_dump);
  if (!report.problems.empty())
    out << "; " << report.problems.size() << " problem" << (report.problems.size() > 1 ? "s" : "")
        << " with files (listed on stderr)";
  if (!report.launches.empty()) {
    // "2 launches share communicator X: ranks 0-3 are RANK 0-3 of launch 1, ranks 4-5 RANK 0-1 of launch 2"
    out << "\n" << report.launches.size() << " launches share communicator " << report.launches_comm << ":";
    for (size_t i = 0; i < report.launches.size(); ++i) {
      const auto [first, size] = report.launches[i];
      auto span = [](int a, int b) { return a == b ? std::to_string(a) : std::to_string(a) + "-" + std::to_string(b); };
      out << (i ? "," : "") << " ranks " << span(first, first + size - 1) << (i ? "" : " are") << " RANK "
          << span(0, size - 1) << " of launch " << i + 1;
    }
    out << " (ranks here are ranks of " << report.launches_comm << ")";
  }
  out << "\n\n";
  if (!report.Hang() && report.verdicts.front().cause != Cause::JobKilled) {
    // Before a deadline, a wait that is not yet a verdict is no green "no hang".
    const bool pending = !report.verdicts.front().not_yet.empty();
    out << (pending ? st.Yellow("no hang yet") : st.Green("no hang")) << ": " << AdviceText(report.verdicts.front(), report)
        << "\n";
    RenderFindings(out, st, report, options.verbose);
    RenderNotes(out, st, report, false);
    RenderHistory(out, st, report, options.verbose);
    return out.str();
  }
  size_t n = 0;
  for (const auto& v : report.verdicts) {
    if (n) out << "\n";
    RenderVerdict(out, st, report, v, ++n, options.verbose);
  }
  RenderFindings(out, st, report, options.verbose);
  RenderNotes(out, st, report, true);
  RenderHistory(out, st, report, options.verbose);
  return out.str();
}

// The stopped culprits' pids for a command line ("<pid>" where no dump says it).
std::string StoppedPids(const Verdict& v) {
  std::string pids;
  for (const auto& e : v.evidence)
    if (e.pid > 0) pids += (pids.empty() ? "" : " ") + std::to_string(e.pid);
  return pids.empty() ? "<pid>" : pids;
}

// A hang inside a replay of a CUDA graph: what the verdict's operation is.
std::string CapturedNote(const Verdict& v) {
  if (!v.captured) return "";
  return OpLabel(v.op, v.seq) + " was captured in a CUDA graph (#" + std::to_string(v.seq) +
         " is its capture-time sequence number) and the hang is inside a replay" +
         (v.replays > 0 ? " (replay " + std::to_string(v.replays) + " or later)" : "") + ". ";
}

std::string AdviceText(const Verdict& v, const Report& report) {
  const std::string note = CapturedNote(v);
  if (!note.empty()) {
    Verdict plain = v;
    plain.captured = false;
    if (v.cause == Cause::RankMissing)
      return note + CulpritName(v) + " never began that replay: " +
             (v.culprit_in_nccl ? "it is stuck inside an NCCL call (see its stack)"
                                : "its host is elsewhere, not inside NCCL: its stack shows what it does instead "
                                  "(checkpoint save, evaluation, logging on one rank?)") +
             ". Make every rank replay the same graphs, or move one-rank work off the replay path.";
    if (v.cause == Cause::Mismatch)
      return note + CulpritName(v) + " was inside another captured collective of the communicator: the ranks "
             "replay their CUDA graphs in different orders (or different graphs). Make every rank launch the "
             "same graphs in the same order.";
    return note + AdviceText(plain, report);
  }
  std::string who = CulpritName(v);
  switch (v.cause) {
    case Cause::RankMissing:
      return who + " never called " + OpLabel(v.op, v.seq) +
             (v.culprit_in_nccl ? "; it is stuck inside an NCCL call (see its stack)"
                                : "; it is not inside NCCL: its stack shows what it does instead (checkpoint "
                                  "save, evaluation, logging on one rank?)") +
             ". Make every rank issue the same collectives, or move one-rank work off the "
             "collective path.";
    case Cause::GpuNotReached:
      return "The GPU of " + who + " never reached " + OpLabel(v.op, v.seq) +
             ": earlier work on its stream is stuck or very slow (a hung kernel, a copy, a "
             "spin-wait). Look at what it launched before this call (its call-site stack; "
             "nsys or compute-sanitizer on that rank).";
    case Cause::StuckInCollective:
      return std::string(v.p2p_mismatch == "unknown" ? "The Send and the Recv of this transfer could not both be read, so "
                                                       "whether their sizes and datatypes agree is unknown. "
                                                     : "") +
             "Every member's GPU is inside " + OpLabel(v.op, v.seq) +
             " and none completes: no rank is to blame. Suspect the transport (network link, "
             "NIC, IB, NVLink/NVLS); rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET and "
             "check the NCCL settings above and the fabric's error counters.";
    case Cause::Mismatch: {
      std::string s = who + (v.tie ? " (tie: naming the group without the lowest rank)" : "") +
                      " called a different collective at " + OpLabel(v.op, v.seq) + ".";
      if (v.call_count_divergence)
        s += " call-count divergence: one side issued one call more than the other (e.g. "
             "ZeRO-3 parameter gathers with data-dependent lengths); make every rank issue the "
             "same number of collectives.";
      else
        s += " Check rank-dependent branches that change op, count, dtype, root or reduction.";
      return s;
    }
    case Cause::P2pUnmatched:
      if (!v.cycle.empty())
        return "Send/Recv deadlock between " + who +
               ": each waits for a call the other makes only later. Post matching sends and "
               "receives inside one ncclGroupStart/End (batch_isend_irecv), or order them by "
               "rank parity.";
      if (v.p2p && v.culprit_ranks.size() == 1 && (v.op == "Send" || v.op == "Recv")) {
        const int caller = v.culprit_ranks[0] == v.p2p_src ? v.p2p_dst : v.p2p_src;
        return who + " never posted the " + (v.op == "Send" ? "Recv" : "Send") + " matching rank " +
               std::to_string(caller) + "'s " + OpLabel(v.op, v.seq) + " (its count of " +
               (v.op == "Send" ? "receives from" : "sends to") + " rank " + std::to_string(caller) +
               " is lower); its call site above is where it went instead. Check both sides' schedules (a "
               "peer left out of an all-to-all, a pipeline stage skipping a microbatch).";
      }
      return who + " never posted the call matching " + OpLabel(v.op, v.seq) +
             " (counts of sends and receives between the peers differ). Check the pipeline "
             "schedule on both sides.";
    case Cause::P2pMismatch: {
      std::string recv = v.p2p_calls.size() == 2 ? "rank " + std::to_string(v.p2p_calls[1].rank) + "'s Recv" : "the Recv";
      return "NCCL pairs the n-th Send from a rank to a peer with that peer's n-th Recv from it, by order alone: "
             "their " + std::string(v.p2p_mismatch == "datatype" ? "datatypes" : "sizes") + " must agree, and " + recv +
             " never completes. Check how each side computes the " +
             (v.p2p_mismatch == "datatype" ? "datatype (a cast or a dtype argument on one side only)"
                                           : "count (a stale capacity, a split size computed on one side only)") +
             "; both call sites are shown above.";
    }
    case Cause::P2pOutOfOrder:
      return "Each of " + who +
             " waits in a call whose counterpart the other issued, but queued behind its own wait (both receive, or "
             "both send, first, in separate groups). Post each exchange's Send and Recv inside one "
             "ncclGroupStart/End (batch_isend_irecv), or order them by rank parity.";
    case Cause::CrossCommDeadlock:
      return "Ranks enter communicators in different orders (" + who +
             "): each waits in one communicator for a rank that waits in another. Issue "
             "collectives on all communicators in the same order on every rank.";
    case Cause::RankDead:
      if (v.culprit_unanswered)
        return who + " did not answer the latest job-wide dump request, which every running rank answers: its "
               "process is stopped (SIGSTOP, a debugger), its watchdog cannot run, or it reached "
               "NCCLWATCH_MAX_DUMPS. Its older dump is not mixed into this round. Check the process (ps, top) and "
               "its log.";
      if (v.culprit_unreadable)
        return who + " left only dumps that cannot be read (the problems above say why): nothing says it died. "
               "Look at them with `ncclwatch show FILE`, and check its log.";
      if (v.culprit_killed) {
        // The post-mortem's detail may say it already ("ended without a word: SIGKILL or ...").
        std::string how = v.culprit_position ? v.culprit_position->detail : std::string();
        const std::string said = "ended without a word";
        if (how.compare(0, said.size(), said) == 0) how = how.substr(std::min(how.size(), said.size() + 2));
        return who + " " + said + " (" + (how.empty() ? std::string("SIGKILL or the OOM killer") : how) +
               "); where it was and its last call site are above. Check its log, and the kernel log (dmesg) on "
               "its host for the OOM killer.";
      }
      return who + (v.culprit_crashed ? " crashed (fatal signal): its stack at the crash is above; "
                                      : " left no dump: it was likely killed (OOM killer, node failure); ") +
             "check its log and dmesg on its host.";
    case Cause::RankStopped:
      return who + (v.culprit_stopped_killed ? " was stopped until it was killed: it did not fail by itself, and it"
                                             : " is stopped: its process cannot run, so it") +
             " answered no dump request while the others waited; where it was and its last call site are above. "
             "A debugger attached (gdb, a profiler)? Detach it, or `kill -CONT " + StoppedPids(v) + "`; Ctrl-Z in its terminal "
             "(SIGTSTP)? `fg`; a frozen cgroup (a scheduler's suspend, `docker pause`)? Thaw it (cgroup.freeze 0, "
             "`docker unpause`).";
    case Cause::NcclError:
      return "An NCCL call of " + who + " failed (" + (v.culprit_position ? v.culprit_position->detail : "") +
             "); the others wait for it in " + OpLabel(v.op, v.seq) +
             ". Rerun with NCCL_DEBUG=WARN (or INFO) for NCCL's own reason; the failing call's "
             "call site is above.";
    case Cause::RankExited:
      if (v.culprit_position && (v.culprit_position->exception || v.culprit_position->exit_status > 0))
        return who + " " + PositionText(*v.culprit_position) + " before " + OpLabel(v.op, v.seq) +
               ", which the others wait in until their timeout: it ended on an error of its own, not in NCCL. " +
               (v.culprit_position->exception ? "Fix that exception (its full traceback is in that rank's log)."
                                              : "That rank's log says why it exited.");
      return who + " " + (v.culprit_position ? PositionText(*v.culprit_position) : "") + " before " + OpLabel(v.op, v.seq) +
             ", which the others wait in: uneven inputs (a rank with fewer batches leaves the loop "
             "first: use drop_last, equal shards or DDP's join()), an early return, or a pipeline "
             "stage that finished. Make every rank issue the same collectives before it exits.";
    case Cause::ExtraCall:
      return who + " issued " + OpLabel(v.op, v.seq) + ", " + EndedText(v) +
             ", so it waits in it until its timeout. Its call site is the line to look at: a collective issued on "
             "some ranks only (a final metric or log on one rank, a last barrier, one more step); issue it on "
             "every rank before they leave, or on none.";
    case Cause::JobKilled:
      return FormatRanks(v.killed_ranks) + " all ended without a word within " + WithinText(v.killed_within_ms) +
             " of each other: no rank failed by itself and none was waiting on another. The job was killed from "
             "outside: its launcher, the scheduler (a time limit, scancel, a preemption), an operator, or the "
             "failure of the node it ran on. Their logs say who; no fix is needed in the job's code.";
    case Cause::HostLost:
      return FormatRanks(v.killed_ranks) + ", every rank of host " + v.killed_host + ", ended without a word within " +
             WithinText(v.killed_within_ms) + " of each other while the ranks of other hosts live" +
             (v.comm.empty() ? std::string() : " and wait in " + OpLabel(v.op, v.seq)) +
             ": the host was lost or its ranks were killed together (a node failure or reboot, that node's OOM "
             "killer or agent, a launcher's kill on it), not a failure of one rank. Check that host's kernel log "
             "(dmesg), its health and the scheduler's log for that node.";
    case Cause::InitHang:
      if (!v.id_groups.empty()) {
        std::string holders;
        for (const auto& g : v.id_groups)
          holders += (holders.empty() ? "" : "; ") + FormatRanks(g.ranks) + " hold " + CommLabel(g.comm, g.comm_name);
        return "The ranks did not agree on the unique id: they created communicators of the same size with "
               "different ids (" + holders + "), so each waits for members that joined another. A stale "
               "unique-id file left by an earlier run, or a wrong rendezvous (another job's store, a "
               "different MASTER_ADDR/port). Make every rank read this run's id (remove the id file "
               "before the job starts, or write it atomically with a per-run name).";
      }
      if (who.empty())
        return "Every member is inside " + v.op + " and none returns: the bootstrap cannot "
               "connect (MASTER_ADDR/port, firewall, NCCL_SOCKET_IFNAME); rerun with "
               "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,BOOTSTRAP.";
      if (const CulpritPosition* p = v.evidence.empty() ? nullptr : &v.evidence.front().position;
          p && (p->state == CulpritState::OutsideNccl || p->state == CulpritState::InsideNccl))
        return who + " never called " + v.op + " for this communicator, which the others wait in: it runs, " +
               (p->state == CulpritState::OutsideNccl ? std::string("busy elsewhere (its stack above)")
                                                      : "inside " + p->function) +
               ". A communicator created mid-job (a checkpoint or subgroup) must be created by every member: "
               "look for a rank-dependent branch or a slow step before the creation on that rank.";
      return who + " never called " + v.op + " for this communicator: it did not start, "
             "crashed before it, or took another path (a wrong MASTER_ADDR, a failed launch, a "
             "rank-dependent branch before process-group creation). Check that rank's log.";
    case Cause::NoHang: {
      std::string s;
      if (!v.not_yet.empty()) {
        // "no hang yet: rank 2 has not entered AllReduce #51 for 3.0 s ...; the deadline is 5.0 s."
        size_t shown = 0;
        for (const auto& n : v.not_yet) {
          if (shown++ == 3) {
            s += "; and " + std::to_string(v.not_yet.size() - 3) + " more";
            break;
          }
          if (shown > 1) s += "; ";
          s += NotYetText(n);
        }
        return s + ". Dump again after the deadline (or wait for ncclwatch's own dumps) for a verdict.";
      }
      if (v.stopped_while_healthy)
        s = "The job was stopped or snapshotted while healthy: ranks were at different sequence "
            "numbers only because their dumps were taken at slightly different moments";
      else
        s = "No operation is stuck: every communicator's members completed the same sequence numbers";
      if (v.stopped_while_healthy && v.oldest_in_flight_s >= 0)
        s += " (the oldest operation in flight was " + FormatSeconds(v.oldest_in_flight_s) +
             " old, none past its deadline)";
      s += ".";
      if (!report.ranks_without_dump.empty()) s += " " + FormatRanks(report.ranks_without_dump) + " left no usable dump.";
      return s;
    }
    case Cause::Count: break;
  }
  return "";
}

// Every application thread of a culprit, `current` first, each with why it is shown.
json ThreadsJson(const CulpritEvidence& e, const SourceLines& lines) {
  json a = json::array();
  if (e.current_tid >= 0)
    a.push_back({{rk::kTid, e.current_tid}, {rk::kName, e.current_thread}, {rk::kRole, ThreadRoleName(e.current_role)},
                 {rk::kIdle, false}, {rk::kFrames, StackFrames(e.current, lines)}});
  for (const auto& t : e.other_threads)
    a.push_back({{rk::kTid, t.tid}, {rk::kName, t.name}, {rk::kRole, ThreadRoleName(t.role)}, {rk::kIdle, t.idle},
                 {rk::kFrames, StackFrames(t.stack, lines)}});
  return a;
}

json ReportToJson(const Report& report) {
  json verdicts = json::array();
  for (const auto& v : report.verdicts) {
    json j;
    j[rk::kCause] = analysis::CauseName(v.cause);
    j[rk::kComm] = v.comm.empty() ? json(nullptr) : json(v.comm);
    j[rk::kCommName] = v.comm_name;
    j[rk::kCommSize] = v.comm_size;
    j[rk::kSeq] = v.seq;
    if (v.captured) {  // only then: older reports keep their shape
      j[rk::kCaptured] = true;
      j[rk::kReplays] = v.replays < 0 ? json(nullptr) : json(v.replays);
    }
    j[rk::kOp] = v.op.empty() ? json(nullptr) : json(v.op);
    j[rk::kBytes] = OrNull(v.bytes);
    if (v.p2p) {
      j[rk::kP2pSrc] = v.p2p_src;
      j[rk::kP2pDst] = v.p2p_dst;
    }
    j[rk::kCulpritRanks] = v.culprit_ranks;
    j[rk::kCulpritCommRanks] = v.culprit_comm_ranks;
    j[rk::kWaitingRanks] = v.waiting_ranks;
    j[rk::kWaitedS] = v.waited_s < 0 ? json(nullptr) : json(v.waited_s);
    json ended = json::array();
    for (const auto& e : v.ended_by_framework)
      ended.push_back({{rk::kRank, e.rank}, {rk::kReason, e.reason}, {rk::kExitStatus, OrNull(e.exit_status)},
                       {rk::kSignal, e.signal.empty() ? json(nullptr) : json(e.signal)},
                       {rk::kHow, FrameworkEndingText(e)}});
    j[rk::kEndedByFramework] = std::move(ended);
    if (v.cause == Cause::NoHang) {
      json not_yet = json::array();
      for (const auto& n : v.not_yet)
        not_yet.push_back({{rk::kCause, CauseName(n.cause)}, {rk::kCulpritRanks, n.culprit_ranks},
                           {rk::kWaitingRanks, n.waiting_ranks}, {rk::kOp, n.op.empty() ? json(nullptr) : json(n.op)},
                           {rk::kSeq, n.seq}, {rk::kWaitedS, n.waited_s},
                           {rk::kDeadlineS, n.deadline_s < 0 ? json(nullptr) : json(n.deadline_s)}});
      j[rk::kNotYet] = std::move(not_yet);
    }
    json stacks = json::object();
    for (const auto& e : v.evidence) {
      json s;
      s[rk::kWhere] = WhereText(e);
      s[rk::kState] = CulpritStateName(e.position.state);
      s[rk::kCommState] = CommPositionName(e.position.comm_state);
      s[rk::kSeq] = OrNull(e.position.comm_seq);
      s[rk::kHost] = e.host;
      s[rk::kPid] = e.pid;
      if (e.device >= 0) {
        s[rk::kDevice] = e.device;
        s[rk::kProcessRanks] = e.process_ranks;
      }
      if (e.launch >= 0) {
        s[rk::kLaunch] = e.launch;
        s[rk::kLaunchRank] = e.launch_rank;
        s["comm_rank"] = e.comm_rank;
      }
      s[rk::kFile] = e.file;
      s[rk::kCallsiteOp] = e.callsite_op ? OpRefText(*e.callsite_op) : "";
      s[rk::kCallsite] = StackFrames(e.callsite, report.source_lines);
      if (!e.callsite_driven_from.empty()) {
        s[rk::kCallsiteDrivenFrom] = e.callsite_driven_from;
        s[rk::kIssuedBy] = IssuedByText(e);
      }
      s[rk::kThread] = ThreadLabel(e);
      s[rk::kCurrent] = StackFrames(e.current, report.source_lines);
      s[rk::kThreads] = ThreadsJson(e, report.source_lines);
      if (e.stack_note != StackNote::kNone) s[rk::kNote] = StackNoteText(e);
      if (e.position.state == CulpritState::Exited) {
        s[rk::kExitStatus] = OrNull(e.position.exit_status);
        s[rk::kAbortedFirst] = e.position.aborted_first;
        if (const auto& x = e.position.exception)
          s[rk::kException] = {{rk::kType, x->type}, {rk::kMessage, x->message}, {rk::kFile, x->file},
                                {rk::kLine, x->line}, {rk::kFunction, x->function}};
      }
      stacks[e.rank >= 0 ? std::to_string(e.rank) : "comm:" + std::to_string(e.comm_rank)] = std::move(s);
    }
    j[rk::kCulpritStacks] = std::move(stacks);
    if (!v.cycle.empty()) {
      j[rk::kCycle] = v.cycle;
      json steps = json::array();
      for (const auto& step : v.cycle_steps) steps.push_back(CycleStepText(step));
      j[rk::kCycleSteps] = std::move(steps);
    }
    if (!v.groups.empty()) {
      json groups = json::array();
      for (const auto& g : v.groups)
        groups.push_back({{rk::kRanks, g.ranks}, {rk::kOp, g.op}, {rk::kCount, g.count},
                          {rk::kDtype, g.dtype}, {rk::kRoot, g.root},
                          {rk::kRedop, g.redop.empty() ? json(nullptr) : json(g.redop)},
                          {rk::kBytes, OrNull(g.bytes)}});
      j[rk::kGroups] = std::move(groups);
      j[rk::kTie] = v.tie;
      j[rk::kCallCountDivergence] = v.call_count_divergence;
    }
    if (v.cause == Cause::StuckInCollective) j[rk::kNcclEnv] = v.nccl_env;
    if (!v.id_groups.empty()) {
      json groups = json::array();
      for (const auto& g : v.id_groups)
        groups.push_back({{rk::kComm, g.comm}, {rk::kCommName, g.comm_name}, {rk::kRanks, g.ranks}});
      j[rk::kIdGroups] = std::move(groups);
    }
    if (v.cause == Cause::ExtraCall) {
      j[rk::kEndedRanks] = v.ended_ranks;
      j[rk::kEndedAfterSeq] = OrNull(v.ended_after_seq);
    }
    if (v.cause == Cause::JobKilled || v.cause == Cause::HostLost) {
      j[rk::kKilledRanks] = v.killed_ranks;
      j[rk::kKilledWithinMs] = v.killed_within_ms;
      if (v.cause == Cause::HostLost) j[rk::kKilledHost] = v.killed_host;
    }
    if (!v.p2p_calls.empty()) {
      j[rk::kMismatch] = v.p2p_mismatch;
      json calls = json::array();
      for (const auto& c : v.p2p_calls) {
        json group_ops = json::array();
        for (const auto& m : c.group.ops)
          group_ops.push_back({{rk::kOp, m.op}, {rk::kComm, m.comm}, {rk::kPeer, OrNull(m.peer)}, {rk::kSeq, m.seq},
                               {rk::kCount, m.count}, {rk::kDtype, m.dtype}, {rk::kBytes, OrNull(m.bytes)},
                               {rk::kState, m.state}});
        calls.push_back({{rk::kRank, c.rank}, {rk::kOp, c.op}, {rk::kPeer, c.peer}, {rk::kP2pSeq, c.p2p_seq},
                         {rk::kCount, c.count}, {rk::kDtype, c.dtype}, {rk::kBytes, OrNull(c.bytes)},
                         {rk::kState, c.state}, {rk::kText, P2pCallText(c)},
                         {rk::kGroup, {{rk::kGroupId, c.group.id}, {rk::kShape, c.group.shape},
                                       {rk::kPeers, c.group.peers}, {rk::kP2pSeq, OrNull(c.group.p2p_seq)},
                                       {rk::kText, P2pGroupText(c.group)}, {rk::kOps, std::move(group_ops)}}}});
      }
      j[rk::kP2pCalls] = std::move(calls);
    }
    j[rk::kAdvice] = AdviceText(v, report);
    json consequences = json::array();
    for (const auto& q : v.consequences) {
      json c = {{rk::kComm, q.comm}, {rk::kCommName, q.comm_name}, {rk::kCommSize, q.comm_size}, {rk::kSeq, q.seq},
                {rk::kOp, q.op}, {rk::kWaitingRanks, q.waiting_ranks}};
      if (q.p2p) {
        c[rk::kP2pSrc] = q.p2p_src;
        c[rk::kP2pDst] = q.p2p_dst;
      }
      consequences.push_back(std::move(c));
    }
    j[rk::kConsequences] = std::move(consequences);
    verdicts.push_back(std::move(j));
  }
  json earlier = json::array();
  for (const auto& e : report.earlier_dumps)
    earlier.push_back({{rk::kRank, e.rank}, {rk::kFile, e.file}, {rk::kReason, e.reason}, {rk::kLater, e.later}});
  json problems = json::array();
  for (const auto& p : report.problems) problems.push_back({{rk::kFile, p.file}, {rk::kProblem, ProblemText(p)}});
  json attempts = json::array();
  for (const auto& a : report.attempts)
    attempts.push_back({{rk::kAttempt, a.index}, {rk::kStartUnixNs, a.start_unix_ns},
                        {rk::kJobInstance, a.job_instance}, {rk::kRanks, a.ranks.size()}, {rk::kFiles, a.files}});
  json findings = json::array();
  for (const auto& f : report.findings)
    findings.push_back({{rk::kKind, f.kind},
                        {rk::kRank, f.rank},
                        {rk::kHost, f.host},
                        {rk::kPid, f.pid},
                        {rk::kComm, f.comm},
                        {rk::kCommName, f.comm_name},
                        {rk::kCollectives, f.collectives},
                        {rk::kLastIn, f.last_in},
                        {rk::kLatenessMedianMs, f.lateness_median_ms},
                        {rk::kLatenessP90Ms, f.lateness_p90_ms},
                        {rk::kClockSpreadMs, f.clock_spread_ms},
                        {rk::kCallsiteOp, f.callsite_op},
                        {rk::kCallsite, StackFrames(f.callsite, report.source_lines)}});
  json recovered = json::array();
  for (const auto& r : report.recovered_stalls) {
    json j = {{rk::kRank, r.rank},
              {rk::kHost, r.host},
              {rk::kPid, r.pid},
              {rk::kOp, r.op.op},
              {rk::kSeq, r.op.seq},
              {rk::kComm, r.op.comm},
              {rk::kCommName, r.op.comm_name},
              {rk::kReportedBy, r.reported_by},
              {rk::kStalledAfterS, r.stalled_after_s},
              {rk::kRecoveredAfterS, r.recovered_after_s < 0 ? json(nullptr) : json(r.recovered_after_s)},
              {rk::kCause, CauseName(r.cause)},
              {rk::kWaitingFor, r.waiting_for},
              {rk::kText, RecoveredStallText(r)}};
    if (r.culprit) {
      const CulpritEvidence& e = *r.culprit;
      j[rk::kCulprit] = {{rk::kRank, e.rank},
                         {rk::kWhere, WhereText(e)},
                         {rk::kThread, ThreadLabel(e)},
                         {rk::kCurrent, StackFrames(e.current, report.source_lines)},
                         {rk::kCallsiteOp, e.callsite_op ? OpRefText(*e.callsite_op) : ""},
                         {rk::kCallsite, StackFrames(e.callsite, report.source_lines)}};
    }
    recovered.push_back(std::move(j));
  }
  json out = {{rk::kFormat, analysis::kReportFormatName},
          {rk::kVersion, analysis::kReportVersion},
          {rk::kVerdicts, std::move(verdicts)},
          {rk::kFindings, std::move(findings)},
          {rk::kRecoveredStalls, std::move(recovered)},
          {rk::kRanksSeen, report.ranks_seen},
          {rk::kWorldSize, report.world_size},
          {rk::kRanksWithoutDump, report.ranks_without_dump},
          {rk::kEarlierDumps, std::move(earlier)},
          {rk::kProblems, std::move(problems)},
          {rk::kAttempts, std::move(attempts)},
          {rk::kAttempt, report.attempt},
          {rk::kNotes, NotesText(report)}};
  if (!report.launches.empty()) {
    std::vector<std::vector<int>> spans;
    for (const auto& [first, size] : report.launches) spans.push_back({first, size});
    out[rk::kLaunches] = {{"comm", report.launches_comm}, {"ranks", spans}};
  }
  return out;
}

}  // namespace analysis
}  // namespace ncclwatch
