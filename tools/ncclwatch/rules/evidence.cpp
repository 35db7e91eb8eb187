#include "rules/evidence.h"

#include "model/rank_split.h"

#include <algorithm>

namespace ncclwatch {
namespace analysis {
namespace {

// The application's own Python code on a stack (not only the interpreter's or a library's).
bool RunsOwnPython(const trace::Stack& stack) {
  return std::any_of(stack.python.begin(), stack.python.end(), [](const trace::PythonFrame& f) { return !f.library; });
}

// A worker waiting for its next task: no Python of the application's own, and its innermost
// frames in a wait primitive (a condition variable, a semaphore, a futex, an event loop's wait)
// — DDP's autograd thread between steps, a pool's worker. A sleep is not one: a rank that sleeps
// in host code is busy there.
bool WaitsForWork(const trace::Thread& t) {
  if (RunsOwnPython(t.stack)) return false;
  static const char* const kWaits[] = {"pthread_cond_wait", "pthread_cond_timedwait", "pthread_cond_clockwait",
                                       "condition_variable", "sem_wait", "sem_timedwait", "sem_clockwait",
                                       "futex_wait", "futex_abstimed_wait", "epoll_wait", "epoll_pwait"};
  constexpr size_t kInnermost = 6;  // libc's own frames above the wait (futex helpers, cancellation)
  for (size_t i = 0; i < t.stack.native.size() && i < kInnermost; ++i)
    for (const char* w : kWaits)
      if (t.stack.native[i].symbol.find(w) != std::string::npos) return true;
  return false;
}

}  // namespace

void Evidence::Fill(const BlockedOp* blocked, int dump, CulpritEvidence* e) {
  if (dump < 0) {
    auto it = e->rank >= 0 ? set_.unreadable_ranks().find(e->rank) : set_.unreadable_ranks().end();
    if (it != set_.unreadable_ranks().end()) {
      e->file = it->second;
      e->position.state = CulpritState::UnreadableDump;
    }
    auto un = e->rank >= 0 ? set_.unanswered_ranks().find(e->rank) : set_.unanswered_ranks().end();
    if (un != set_.unanswered_ranks().end()) {
      e->file = un->second.file;
      e->position.unanswered_behind_s = un->second.behind_s;
    }
    e->stack_note = StackNote::kNoUsableDump;
    return;
  }
  const Dump& dm = g_.dumps()[dump];
  const trace::Summary& s = dm.summary;
  e->host = s.host;
  e->pid = s.pid;
  if (dm.share) {
    e->device = dm.share->device;
    e->process_ranks = dm.share->process_ranks;
  }
  if (int launch = -1, launch_rank = -1; e->rank >= 0 && set_.LaunchOf(e->rank, &launch, &launch_rank)) {
    e->launch = launch + 1;
    e->launch_rank = launch_rank;
  }
  e->file = dm.file_name;
  e->position = PositionOf(blocked, dump);

  const trace::Detail* det = set_.Detail(dump);
  if (!det) {
    e->stack_note = StackNote::kDetailsUnreadable;
    e->stack_note_text = dm.detail_problem;
    return;
  }
  // Call site: its operation in the blocked one, else its last on that communicator, else
  // its last at all (all from the ring when not in flight).
  const trace::Op* op = s.failed ? &*s.failed : nullptr;
  if (blocked && !op && blocked->p2p) {  // its side of the transfer, in flight or from its ring
    const P2pSide* side = blocked->send.dump == dump ? &blocked->send : blocked->recv.dump == dump ? &blocked->recv : nullptr;
    if (side && side->op) op = &*side->op;
  }
  if (blocked && !op) {
    const std::string& comm = g_.comms()[blocked->comm].id;
    int oi = blocked->p2p ? -1 : g_.FindInFlight(dump, comm, blocked->seq);
    if (oi >= 0) op = &s.in_flight[oi];
    for (auto it = s.in_flight.begin(); !op && blocked->p2p && it != s.in_flight.end(); ++it)
      if (it->comm == comm && it->IsP2p()) op = &*it;
    for (auto it = s.in_flight.rbegin(); !op && it != s.in_flight.rend(); ++it)
      if (it->comm == comm) op = &*it;
    for (auto it = det->ring.entries.rbegin(); !op && it != det->ring.entries.rend(); ++it)
      if (it->comm == comm) op = &*it;
  }
  if (!op && !s.in_flight.empty()) op = &s.in_flight.back();
  if (!op && !det->ring.entries.empty()) op = &det->ring.entries.back();
  if (op) {
    int ci = g_.CommOf(op->comm);
    e->callsite_op = OpRef{op->OpName(), op->IsP2p() ? op->p2p_seq : op->seq, op->comm,
                           ci < 0 ? "" : g_.comms()[ci].name};
    if (const trace::Callsite* cs = det->FindCallsite(op->callsite)) {
      e->callsite = cs->stack;
      e->callsite_driven_from = cs->python_driven_from;
      const trace::Thread* issuer = det->FindThread(op->tid);
      e->callsite_thread = issuer != nullptr && !issuer->name.empty() ? issuer->name : "thread";
      e->callsite_thread += " (tid " + std::to_string(op->tid) + ")";
    }
  }
  if (dm.gone_before_teardown) {  // its threads, as its old dump shows them, are not what it did last
    e->stack_note = StackNote::kThreadNote;
    e->stack_note_text = "no stack of its end: its last dump is from long before it went";
    return;
  }
  // Current stack: the thread that issued its last call there (a side thread, a thread pool's
  // worker, autograd's threads issue collectives while the main thread only waits for them),
  // else the thread inside NCCL, else the main thread, else one with Python frames, else any;
  // never one of ncclwatch's own threads (its watchdog says nothing about the job).
  std::vector<std::pair<const trace::Thread*, ThreadRole>> order;
  auto add = [&](const trace::Thread* t, ThreadRole role) {
    if (!t || t->own) return;
    for (const auto& [have, r] : order)
      if (have == t) return;
    order.emplace_back(t, role);
  };
  if (op && op->tid > 0) add(det->FindThread(op->tid), ThreadRole::IssuedLastCall);
  if (!s.in_nccl.empty()) add(det->FindThread(s.in_nccl.front().tid), ThreadRole::InsideNccl);
  add(det->FindThread(s.pid), ThreadRole::Main);
  for (const auto& th : det->threads)
    if (!th.stack.python.empty()) add(&th, ThreadRole::Python);
  for (const auto& th : det->threads) add(&th, ThreadRole::Other);
  if (order.empty()) {
    e->stack_note = StackNote::kNoThreads;
    return;
  }
  // The thread that issued the last call, now idle outside NCCL (waiting for its next task),
  // says nothing of why the rank does not call again: what the rank does instead comes first,
  // a thread running the application's Python, else one not waiting for work. The issuer follows.
  const bool issuer_in_nccl = std::any_of(s.in_nccl.begin(), s.in_nccl.end(), [&](const trace::InNcclThread& n) {
    return n.tid == order.front().first->tid;
  });
  if (order.front().second == ThreadRole::IssuedLastCall && !issuer_in_nccl && WaitsForWork(*order.front().first)) {
    auto busy = std::find_if(order.begin() + 1, order.end(), [](const auto& o) { return RunsOwnPython(o.first->stack); });
    if (busy == order.end())
      busy = std::find_if(order.begin() + 1, order.end(), [](const auto& o) { return !WaitsForWork(*o.first); });
    if (busy != order.end()) std::rotate(order.begin(), busy, busy + 1);
  }
  const trace::Thread* t = order.front().first;
  e->current_thread = t->name;
  e->current_tid = t->tid;
  e->current = t->stack;
  e->current_role = order.front().second;
  if (t->stack.Empty() && !t->note.empty()) {
    e->stack_note = StackNote::kThreadNote;
    e->stack_note_text = t->note;
  }
  // A later dump's native-only stack never replaces an earlier Python one of the same thread in
  // the same state (at the later dump a thread held the GIL: C code, a spin).
  if (t->stack.python.empty()) {
    std::string earlier;
    std::vector<trace::PythonFrame> python = set_.EarlierPythonFrames(dm, t->tid, &earlier);
    if (!python.empty()) {
      e->current.python = std::move(python);
      e->stack_note = StackNote::kPythonFromEarlier;
      e->stack_note_text = earlier;
    }
  }
  for (size_t i = 1; i < order.size(); ++i) {
    const auto& [th, role] = order[i];
    ThreadEvidence te;
    te.tid = th->tid;
    te.name = th->name;
    te.role = role;
    // Main and a thread inside NCCL always tell something; a thread with none of the
    // application's own Python frames (a pool's idle worker, a native helper) only waits.
    te.idle = role != ThreadRole::Main && role != ThreadRole::InsideNccl && !RunsOwnPython(th->stack);
    te.stack = th->stack;
    te.note = th->note;
    e->other_threads.push_back(std::move(te));
  }
}

CulpritPosition Evidence::PositionOf(const BlockedOp* blocked, int dump) const {
  using Position = CommPosition;
  CulpritPosition p;
  const trace::Summary& s = g_.dumps()[dump].summary;
  const bool stopped = g_.IsStopped(dump);
  const bool killed = g_.IsKilled(dump) && !stopped;
  if (g_.IsDead(dump) && !killed && !stopped) {  // a crash says it all: no communicator position, no teardown
    p.state = CulpritState::Crashed;
    p.detail = s.detail;
    return p;
  }
  if (killed || stopped) {  // how it ended (or stopped), then where it was as its black box says
    const Dump& d = g_.dumps()[dump];
    p.state = stopped ? CulpritState::Stopped : CulpritState::Killed;
    if (stopped) {
      p.stop_how = s.stopped->how;
      p.stopped_seen_unix_ns = s.stopped->seen_unix_ns;
      p.killed_while_stopped = g_.Is(dump, trace::DumpReason::Postmortem);
    }
    p.detail = d.gone_before_teardown ? "gone before the job's teardown: it answered no SIGTERM, and its last dump is " +
                                            std::to_string(d.gone_gap_s) + " s older"
                                      : s.detail;
    if (d.gone_before_teardown) return p;  // its last dump says what it did long before it went
    if (s.states_as_of_mono_ns == 0) p.states_never = true;
    else if (s.states_as_of_mono_ns > 0)
      p.box_age_s = std::max<int64_t>(0, s.time_mono_ns - s.states_as_of_mono_ns) / 1e9;
    p.in_nccl_known = true;
    p.was_inside_nccl = !s.in_nccl.empty();
    if (p.was_inside_nccl) {
      p.function = s.in_nccl.front().function;
      p.since_s = s.in_nccl.front().since_s;
      p.tid = s.in_nccl.front().tid;
    }
  } else if (g_.IsErrored(dump)) {
    p.state = CulpritState::NcclError;
    p.detail = s.detail;
  } else if (g_.IsExited(dump)) {
    p.state = CulpritState::Exited;
    p.exit_status = s.exit_status;
    p.exit_in_flight = g_.Is(dump, trace::DumpReason::ExitInFlight);
    p.aborted_first = g_.dumps()[dump].aborted_before_exit;
    p.exception = s.exception;
  } else if (s.in_nccl.empty()) {
    p.state = CulpritState::OutsideNccl;
  } else {
    p.state = CulpritState::InsideNccl;
    const trace::InNcclThread& t = s.in_nccl.front();
    p.function = t.function;
    p.since_s = t.since_s;
    p.tid = t.tid;
  }
  // A black box's states are as of its watchdog's last poll: what its GPU did with an operation
  // issued after it is unknown, never "not finished".
  const bool from_box = s.states_as_of_mono_ns >= 0;
  auto unknown_to_box = [&](int64_t seq) {
    if (!from_box) return false;
    if (p.states_never) return true;
    const std::string& comm = g_.comms()[blocked->comm].id;
    int oi = g_.FindInFlight(dump, comm, seq);
    return oi < 0 || s.in_flight[oi].state.Is(trace::OpState::Unknown);
  };
  if (blocked && !blocked->p2p && blocked->captured) {
    // Captured: counted complete at capture everywhere; where its replays are says the rest.
    p.comm_seq = blocked->seq;
    p.comm_state = Position::NotInReplay;
    for (const trace::Op& op : s.in_flight) {
      if (op.replays < 0 || op.comm != g_.comms()[blocked->comm].id || op.seq != blocked->seq) continue;
      p.comm_state = op.state.Is(trace::OpState::GpuReached) ? Position::GpuInside : Position::GpuNotReached;
      if (op.age_s >= 0) p.issued_age_s = op.age_s;
    }
  } else if (blocked && !blocked->p2p) {
    const trace::CommSummary* cs = g_.StateOf(dump, blocked->comm);
    if (!cs) {
      p.comm_state = Position::NotCreated;
    } else if (cs->last_enqueued < blocked->seq && cs->last_completed < cs->last_enqueued) {
      p.comm_seq = cs->last_completed + 1;
      p.comm_state = unknown_to_box(p.comm_seq) ? Position::GpuUnknown : Position::GpuBehind;
      // A box with several calls after the last one its GPU finished: told by its last call
      // (the first unfinished one, long before its end, says little of where it was).
      if (from_box && cs->last_enqueued > p.comm_seq) {
        p.finished_through_seq = cs->last_completed;
        p.comm_seq = cs->last_enqueued;
        p.comm_state = unknown_to_box(p.comm_seq) ? Position::GpuUnknown : Position::GpuBehind;
      }
    } else if (cs->last_enqueued < blocked->seq) {
      p.comm_state = Position::NotCalled;
      p.comm_seq = cs->last_enqueued;
    } else {
      int oi = g_.FindInFlight(dump, g_.comms()[blocked->comm].id, blocked->seq);
      if (oi >= 0 && s.in_flight[oi].age_s >= 0) p.issued_age_s = s.in_flight[oi].age_s;
      p.comm_state = cs->last_gpu_reached >= blocked->seq ? Position::GpuInside
                     : unknown_to_box(blocked->seq)          ? Position::GpuUnknown
                                                       : Position::GpuNotReached;
      p.comm_seq = blocked->seq;
    }
  }
  p.then = g_.dumps()[dump].then;
  return p;
}

}  // namespace analysis
}  // namespace ncclwatch
