// The causes a verdict can name, one row each: what in the wait graph leads to it, who it
// blames, whether it needs the job to show a hang, and its rank among causes of equal impact.
// Adding a cause: its enumerator (report/vocabulary.h), its row here, its sentences
// (render/render_report.cpp: the compiler lists every switch that lacks it), its docs
// (docs/analysis.md) and its tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>

#include "model/wait_graph.h"
#include "report/vocabulary.h"

namespace ncclwatch {
namespace analysis {

// Which blocked operations a terminal cause is named for.
enum class Applies : uint8_t {
  kNone,        // not found from a blocker's terminal: from the shape of the graph
  kCollective,  // a collective (comm, seq)
  kP2p,         // a Send/Recv transfer
  kBoth,
};

// Who a verdict of the cause blames.
enum class Blames : uint8_t {
  kBlockers,  // the members whose wait ends at the row's terminal
  kNotJoined, // the members that never joined a communicator being created (none: all inside)
  kMinority,  // the smaller group of a mismatching sequence number
  kCycle,     // every rank on a wait cycle
  kNobody,    // no rank is to blame (the transport; no hang at all; a job killed from outside)
  kWaiting,   // the waiting ranks: they issued what the members that ended normally never would
  kPair,      // both sides of a Send/Recv transfer whose sizes or datatypes disagree
};

struct CauseRule {
  Cause cause;
  Terminal terminal;  // the end of a blocker's wait that names it (kNone: see `applies`)
  Applies applies;
  Blames blames;
  // A snapshot or a SIGTERM of a healthy job finds ranks at different sequence numbers, which
  // alone is not a hang; a crash, an error, an exit others wait for or a mismatch is one at
  // any age.
  bool needs_hang;
  int priority;  // lower first, among verdicts blocking as many ranks
};

// In the order of the Cause enumeration (checked below).
constexpr CauseRule kCauseRules[] = {
    {Cause::RankMissing, Terminal::kBusy, Applies::kCollective, Blames::kBlockers, true, 7},
    {Cause::RankExited, Terminal::kExited, Applies::kBoth, Blames::kBlockers, false, 2},
    {Cause::NcclError, Terminal::kError, Applies::kBoth, Blames::kBlockers, false, 1},
    {Cause::InitHang, Terminal::kNone, Applies::kNone, Blames::kNotJoined, true, 4},
    {Cause::GpuNotReached, Terminal::kGpuStuck, Applies::kBoth, Blames::kBlockers, true, 8},
    {Cause::StuckInCollective, Terminal::kNone, Applies::kNone, Blames::kNobody, true, 9},
    {Cause::Mismatch, Terminal::kNone, Applies::kNone, Blames::kMinority, false, 3},
    // A Send/Recv whose peer never posted its side; or a wait cycle within one communicator.
    {Cause::P2pUnmatched, Terminal::kBusy, Applies::kP2p, Blames::kBlockers, true, 6},
    {Cause::CrossCommDeadlock, Terminal::kNone, Applies::kNone, Blames::kCycle, true, 5},
    {Cause::RankDead, Terminal::kDead, Applies::kBoth, Blames::kBlockers, false, 0},
    // Stopped (SIGSTOP, a debugger, a frozen cgroup) as its host saw it: it cannot answer.
    {Cause::RankStopped, Terminal::kStopped, Applies::kBoth, Blames::kBlockers, false, 0},
    // The others ended normally after completing everything; the waiting ranks issued one more
    // (a final metric, a last barrier on one rank). When the ended ranks are fewer than the
    // waiting ones, they are the odd ones (uneven inputs): rank_exited names them instead.
    {Cause::ExtraCall, Terminal::kEnded, Applies::kCollective, Blames::kWaiting, false, 2},
    // Every rank ended without a word within a moment (the launcher, the scheduler): one story.
    {Cause::JobKilled, Terminal::kNone, Applies::kNone, Blames::kNobody, false, 0},
    // Every rank of one host ended without a word within a moment while others wait: the host
    // was lost (a node failure) or its ranks killed together.
    {Cause::HostLost, Terminal::kNone, Applies::kNone, Blames::kBlockers, false, 0},
    // The n-th Send from A to B and the n-th Recv at B from A disagree in size or datatype: the
    // receive never completes (NCCL pairs them by order alone). A hang at any age.
    {Cause::P2pMismatch, Terminal::kNone, Applies::kNone, Blames::kPair, false, 3},
    // A wait cycle of Send/Recv within one communicator in which every rank issued the call the
    // other waits for, but queued it behind its own wait (both receive first, in separate groups).
    {Cause::P2pOutOfOrder, Terminal::kNone, Applies::kNone, Blames::kCycle, true, 5},
    {Cause::NoHang, Terminal::kNone, Applies::kNone, Blames::kNobody, false, 10},
};

constexpr bool EveryCauseHasItsRow() {
  if (std::size(kCauseRules) != static_cast<size_t>(Cause::Count)) return false;
  for (size_t i = 0; i < std::size(kCauseRules); ++i)
    if (kCauseRules[i].cause != static_cast<Cause>(i)) return false;
  return true;
}
static_assert(EveryCauseHasItsRow(), "kCauseRules: one row per Cause, in the enumeration's order");

constexpr bool OneCausePerTerminal() {  // a blocker's terminal must name one cause per operation kind
  for (const auto& a : kCauseRules)
    for (const auto& b : kCauseRules)
      if (&a != &b && a.terminal != Terminal::kNone && a.terminal == b.terminal &&
          (a.applies == Applies::kBoth || b.applies == Applies::kBoth || a.applies == b.applies))
        return false;
  return true;
}
static_assert(OneCausePerTerminal(), "kCauseRules: two causes for one terminal and operation kind");

constexpr const CauseRule& RuleOf(Cause c) { return kCauseRules[static_cast<size_t>(c)]; }

constexpr bool AppliesTo(const CauseRule& r, bool p2p) {
  return r.applies == Applies::kBoth || r.applies == (p2p ? Applies::kP2p : Applies::kCollective);
}

}  // namespace analysis
}  // namespace ncclwatch
