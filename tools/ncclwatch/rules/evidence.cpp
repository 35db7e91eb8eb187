#include "model/wait_graph.h"

#include "render/text_format.h"

namespace ncclwatch {
namespace analysis {

void Evidence::FillEvidence(const Unit* u, int dump, CulpritEvidence* e) {
  if (dump < 0) {
    auto it = e->rank >= 0 ? set_.unreadable_ranks().find(e->rank) : set_.unreadable_ranks().end();
    if (it != set_.unreadable_ranks().end()) {
      e->file = it->second;
      e->where = "its dump is unreadable (" + it->second + ")";
      e->state = analysis::CulpritState::UnreadableDump;
    } else {
      e->where = "left no dump";
    }
    e->stack_note = "no stacks: no usable dump";
    return;
  }
  const Dump& dm = g_.dumps_[dump];
  const trace::Summary& s = dm.summary;
  e->host = s.host;
  e->pid = s.pid;
  e->file = dm.file_name;
  e->where = Where(u, dump, e);

  const trace::Detail* det = set_.Detail(dump);
  if (!det) {
    e->stack_note = "no stacks: " + (dm.detail_problem.empty() ? std::string("details unreadable") : dm.detail_problem);
    return;
  }
  // Call site: its operation in the blocked unit, else its last on that communicator, else
  // its last at all (all from the ring when not in flight).
  const trace::Op* op = s.failed ? &*s.failed : nullptr;
  if (u && !op) {
    const std::string& comm = g_.comms_[u->comm].id;
    int oi = u->p2p ? -1 : g_.FindInFlight(dump, comm, u->seq);
    if (oi >= 0) op = &s.in_flight[oi];
    for (auto it = s.in_flight.begin(); !op && u->p2p && it != s.in_flight.end(); ++it)
      if (it->comm == comm && it->IsP2p()) op = &*it;
    for (auto it = s.in_flight.rbegin(); !op && it != s.in_flight.rend(); ++it)
      if (it->comm == comm) op = &*it;
    for (auto it = det->ring.entries.rbegin(); !op && it != det->ring.entries.rend(); ++it)
      if (it->comm == comm) op = &*it;
  }
  if (!op && !s.in_flight.empty()) op = &s.in_flight.back();
  if (!op && !det->ring.entries.empty()) op = &det->ring.entries.back();
  if (op) {
    auto cit = g_.comm_by_id_.find(op->comm);
    e->callsite_op = OpLabel(op->OpName(), op->IsP2p() ? op->p2p_seq : op->seq) + " on " +
                     CommLabel(op->comm, cit == g_.comm_by_id_.end() ? "" : g_.comms_[cit->second].name);
    if (const trace::Callsite* cs = det->FindCallsite(op->callsite)) e->callsite = cs->stack;
  }
  // Current stack: the thread inside NCCL, else the main thread, else one with Python frames,
  // else any; never one of ncclwatch's own threads (its watchdog says nothing about the job).
  const trace::Thread* t = nullptr;
  if (!s.in_nccl.empty()) t = det->FindThread(s.in_nccl.front().tid);
  if (!t) t = det->FindThread(s.pid);
  if (t && t->own) t = nullptr;
  for (const auto& th : det->threads)
    if (!t && !th.own && !th.stack.python.empty()) t = &th;
  for (const auto& th : det->threads)
    if (!t && !th.own) t = &th;
  if (t) {
    e->current_thread = (t->name.empty() ? "thread" : t->name) + " (tid " + std::to_string(t->tid) + ")";
    e->current = t->stack;
    if (t->stack.Empty() && !t->note.empty()) e->stack_note = t->note;
  } else {
    e->stack_note = "no thread stacks in its dump";
  }
}

std::string Evidence::Where(const Unit* u, int dump, CulpritEvidence* e) const {
  using State = analysis::CulpritState;
  using Position = analysis::CommPosition;
  CulpritEvidence ignored;
  if (!e) e = &ignored;
  const trace::Summary& s = g_.dumps_[dump].summary;
  if (g_.IsDead(dump)) {
    e->state = State::Crashed;
    return "crashed: " + (s.detail.empty() ? std::string("fatal signal") : s.detail);
  }
  std::string where;
  if (g_.IsErrored(dump)) {
    e->state = State::NcclError;
    where = "NCCL error: " + (s.detail.empty() ? std::string("an NCCL call failed") : s.detail);
  } else if (g_.IsExited(dump)) {
    e->state = State::Exited;
    where = "exited" + (s.exit_status >= 0 ? " with status " + std::to_string(s.exit_status) : std::string()) +
            (g_.Is(dump, trace::DumpReason::ExitInFlight) ? " with operations in flight" : "");
  } else if (s.in_nccl.empty()) {
    e->state = State::OutsideNccl;
    where = "not inside NCCL";
  } else {
    e->state = State::InsideNccl;
    const trace::InNcclThread& t = s.in_nccl.front();
    where = "inside " + t.function + " for " + FormatSeconds(t.since_s) + " (tid " + std::to_string(t.tid) + ")";
  }
  if (u && !u->p2p) {
    const trace::CommSummary* cs = g_.StateOf(dump, u->comm);
    if (!cs) {
      e->comm_state = Position::NotCreated;
      where += "; it has not created this communicator";
    } else if (cs->last_enqueued < u->seq && cs->last_completed < cs->last_enqueued) {
      e->comm_state = Position::GpuBehind;
      e->comm_seq = cs->last_completed + 1;
      where += "; its GPU has not finished #" + std::to_string(cs->last_completed + 1) +
               ", which the others completed";
    } else if (cs->last_enqueued < u->seq) {
      e->comm_state = Position::NotCalled;
      e->comm_seq = cs->last_enqueued;
      where += "; last call on this communicator #" + std::to_string(cs->last_enqueued);
    } else {
      int oi = g_.FindInFlight(dump, g_.comms_[u->comm].id, u->seq);
      std::string age = oi >= 0 && s.in_flight[oi].age_s >= 0
                            ? " (issued " + FormatSeconds(s.in_flight[oi].age_s) + " ago)"
                            : "";
      bool inside = cs->last_gpu_reached >= u->seq;
      e->comm_state = inside ? Position::GpuInside : Position::GpuNotReached;
      e->comm_seq = u->seq;
      where += inside ? "; its GPU is inside #" + std::to_string(u->seq) + age
                      : "; its GPU has not reached #" + std::to_string(u->seq) + age;
    }
  }
  if (!g_.dumps_[dump].then.empty()) {
    where += "; then";
    for (const auto& r : g_.dumps_[dump].then) where += " " + r;
  }
  return where;
}

}  // namespace analysis
}  // namespace ncclwatch
