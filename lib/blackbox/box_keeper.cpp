#include "blackbox/box_keeper.h"

#include "common/clock.h"
#include "common/log.h"
#include "common/timing.h"
#include "dump/dump_input.h"
#include "format/trace_writer.h"
#include "stacks/stacks.h"

namespace ncclwatch {
namespace blackbox {
namespace {

// A new call site's Python frames may wait for the GIL: tried at this many ticks.
constexpr int kCallsiteRetries = 3;

}  // namespace

BoxKeeper::BoxKeeper(BlackBox* box, ThreadRegistry* threads) : box_(box), threads_(threads) { WriteModules(); }

void BoxKeeper::WriteModules() {
  modules_generation_ = stacks::ModulesGeneration();
  std::vector<BoxModule> modules;
  for (const stacks::LoadedModule& m : stacks::LoadedModules())
    modules.push_back({m.bias, m.lo, m.hi, m.own, m.build_id, m.path});
  box_->SetModules(ModulesText(modules));
}

void BoxKeeper::Tend(uint64_t now, uint64_t poll_ns, uint64_t poll_recorded) {
  box_->Alive(static_cast<int64_t>(UnixNs()), static_cast<int64_t>(now), static_cast<int64_t>(poll_ns), poll_recorded);
  threads_->NameCalls();
  // dlopen, dlclose: checked every timing::kModulesCheck.
  if (now >= next_modules_check_ns_) {
    next_modules_check_ns_ = now + timing::Ns(timing::kModulesCheck);
    if (stacks::ModulesGeneration() != modules_generation_) WriteModules();
    box_->KeepLocked();  // the application may have closed its descriptor (and so its lock)
  }
  // Call sites interned since the last poll, resolved to text now: after a SIGKILL nobody can.
  const size_t count = stacks::CallsiteCount();
  while (sites_next_ < count) {
    const auto id = static_cast<int32_t>(sites_next_);
    stacks::Callsite cs;
    const bool known = stacks::GetCallsite(id, &cs, timing::Ms(timing::kBackgroundGilWait));
    // Not published yet (being interned), or its Python frames wait for the GIL: next poll.
    if ((!known || !cs.note.empty()) && ++site_retries_ < kCallsiteRetries) break;
    site_retries_ = 0;
    ++sites_next_;
    if (!known) continue;  // an id that lost an interning race: never published
    trace::Document one;
    one.detail.callsites.push_back({id, {Symbolized(cs.ips), std::move(cs.python)}, cs.note, cs.driven_from});
    if (!box_->AppendCallsite(trace::WriteDocument(one))) {
      if (!full_logged_) LogInfo("black box: no room for call sites past %d", id);
      full_logged_ = true;
      sites_next_ = count;
    }
  }
}

}  // namespace blackbox
}  // namespace ncclwatch
