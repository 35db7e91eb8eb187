// Wrappers with logic of their own: groups, communicator life cycle, errors. Their
// declarations, real-symbol lookup and ABI check come from NCCLWATCH_FOR_EACH_MANAGED.
#include <unistd.h>

#include <climits>
#include <cstddef>
#include <cstring>
#include <iterator>
#include <optional>
#include <set>

#include "common/clock.h"
#include "common/log.h"
#include "common/quietly.h"
#include "intercept/launch.h"
#include "common/real_nccl.h"

using namespace ncclwatch;

namespace {

std::atomic<uint64_t> g_next_group_id{1};
std::atomic<uint32_t> g_init_all_count{0};

// Runs `call` as a tracked NCCL call (re-entry guard, "inside NCCL" marker), then `after`.
// `start`: whether this call may start ncclwatch (creation and operations do; queries do not).
template <typename Call, typename After>
ncclResult_t Managed(const char* function, bool start, Call&& call, After&& after) {
  ThreadState& ts = CurrentThread();
  if (ts.inside) return call();
  Runtime* rt = start ? Runtime::Acquire() : Runtime::IfActive();
  if (!rt) return call();
  ReentryGuard guard(ts);
  if (!Quietly(function, [&] { AttachThread(rt->recorder(), ts); })) return call();
  ncclResult_t r;
  {
    InNcclScope scope(ts.slot, function, MonoNs());
    r = call();
  }
  Quietly(function, [&] { after(rt->recorder(), ts, r); });
  return r;
}

// Reads ncclConfig_t only as far as its own size field says it reaches (older NCCLs have a
// prefix of today's fields).
void ReadConfig(const ncclConfig_t* config, CommInfo* info) {
  if (!config) return;
  size_t size = config->size;
  if (size >= offsetof(ncclConfig_t, blocking) + sizeof(int) && config->blocking != NCCL_CONFIG_UNDEF_INT)
    info->blocking = config->blocking;
  if (size >= offsetof(ncclConfig_t, commName) + sizeof(const char*) && config->commName)
    info->name.assign(config->commName, strnlen(config->commName, 256));
}

void Register(Recorder& rec, ncclComm_t handle, uint64_t id, int size, int rank, CommKind kind,
              const ncclConfig_t* config, const CommInfo* parent = nullptr, int color = -1, int key = -1) {
  if (!handle) return;
  auto info = std::make_unique<CommInfo>();
  info->handle = handle;
  info->id = id;
  info->size = size;
  info->rank = rank;
  info->kind = kind;
  info->created_ns = MonoNs();
  if (parent) {
    info->parent_id = parent->id;
    info->blocking = parent->blocking;
  }
  info->color = color;
  info->key = key;
  ReadConfig(config, info.get());
  if (info->size <= 0 && Real().ncclCommCount) Real().ncclCommCount(handle, &info->size);
  if (info->rank < 0 && Real().ncclCommUserRank) Real().ncclCommUserRank(handle, &info->rank);
  if (Real().ncclCommCuDevice) Real().ncclCommCuDevice(handle, &info->device);
  rec.AddCommunicator(std::move(info));
}

// The communicator being created, visible in dumps while the creation call has not returned.
class PendingScope {
 public:
  PendingScope(const char* function, uint64_t id, int size, int rank) {
    Runtime* rt = Runtime::IfActive();
    rec_ = rt ? &rt->recorder() : nullptr;
    if (!rec_ || !Quietly(function, [&] { token_ = rec_->BeginInit(function, id, size, rank); })) {
      rec_ = nullptr;
      return;
    }
    InNcclScope::SetCreating(CurrentThread().slot, true);
  }
  ~PendingScope() {
    if (!rec_) return;
    InNcclScope::SetCreating(CurrentThread().slot, false);
    rec_->EndInit(token_);
  }

 private:
  Recorder* rec_;
  uint64_t token_ = 0;
};

bool Ok(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

// A creation in progress as dumps show it (`initializing`): who must call it and as which rank.
struct Creation {
  uint64_t id = 0;
  int size = 0, rank = -1;
};

// ncclCommSplit / ncclCommShrink: the child is named by its parent and the parent's child
// counter, which every member advances (NOCOLOR ones included), so ids agree across ranks.
// While the call blocks, dumps show the creation (`creation`): a member that never calls it
// holds the others there, as in ncclCommInitRank.
template <typename Call, typename ChildId, typename CreationOf>
ncclResult_t CreateChild(const char* function, ncclComm_t comm, ncclComm_t* newcomm, ncclConfig_t* config,
                         CommKind kind, int color, int key, Call&& call, ChildId&& child_id, CreationOf&& creation) {
  CommInfo* parent = nullptr;
  uint32_t child = 0;
  return Managed(
      function, true,
      [&] {
        if (Runtime* rt = Runtime::IfActive()) {
          Quietly(function, [&] { parent = rt->recorder().Communicator(comm); });
          if (parent) child = parent->children.fetch_add(1);
        }
        std::optional<PendingScope> pending;
        if (parent) {
          const Creation c = creation(*parent, child);
          pending.emplace(function, c.id, c.size, c.rank);
        }
        return call();
      },
      [&](Recorder& rec, ThreadState&, ncclResult_t r) {
        if (!Ok(r)) {
          rec.Failed(function, r, parent, false);
          return;
        }
        if (newcomm && *newcomm && parent)
          Register(rec, *newcomm, child_id(parent->id, child), 0, -1, kind, config, parent, color, key);
      });
}

}  // namespace

#define NCCLWATCH_REAL(name)   \
  auto real = Real().name;     \
  if (!real) return MissingFunction(#name)

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  NCCLWATCH_REAL(ncclGetUniqueId);
  return real(uniqueId);
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  NCCLWATCH_REAL(ncclCommInitRank);
  return Managed(
      "ncclCommInitRank", true,
      [&] {
        PendingScope pending("ncclCommInitRank", CommIdFromUniqueIds(&commId, sizeof commId), nranks, rank);
        return real(comm, nranks, commId, rank);
      },
      [&](Recorder& rec, ThreadState&, ncclResult_t r) {
        if (Ok(r) && comm)
          Register(rec, *comm, CommIdFromUniqueIds(&commId, sizeof commId), nranks, rank, CommKind::InitRank, nullptr);
        else if (!Ok(r))
          rec.Failed("ncclCommInitRank", r, nullptr, false);
      });
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config) {
  NCCLWATCH_REAL(ncclCommInitRankConfig);
  return Managed(
      "ncclCommInitRankConfig", true,
      [&] {
        PendingScope pending("ncclCommInitRankConfig", CommIdFromUniqueIds(&commId, sizeof commId), nranks, rank);
        return real(comm, nranks, commId, rank, config);
      },
      [&](Recorder& rec, ThreadState&, ncclResult_t r) {
        if (Ok(r) && comm)
          Register(rec, *comm, CommIdFromUniqueIds(&commId, sizeof commId), nranks, rank, CommKind::InitRankConfig,
                   config);
        else if (!Ok(r))
          rec.Failed("ncclCommInitRankConfig", r, nullptr, false);
      });
}

ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds,
                                      ncclConfig_t* config) {
  NCCLWATCH_REAL(ncclCommInitRankScalable);
  return Managed(
      "ncclCommInitRankScalable", true,
      [&] {
        PendingScope pending("ncclCommInitRankScalable",
                             commIds && nId > 0 ? CommIdFromUniqueIds(commIds, sizeof(ncclUniqueId) * static_cast<size_t>(nId))
                                                : 0,
                             nranks, myrank);
        return real(newcomm, nranks, myrank, nId, commIds, config);
      },
      [&](Recorder& rec, ThreadState&, ncclResult_t r) {
        if (Ok(r) && newcomm && commIds && nId > 0)
          Register(rec, *newcomm, CommIdFromUniqueIds(commIds, sizeof(ncclUniqueId) * static_cast<size_t>(nId)),
                   nranks, myrank, CommKind::InitScalable, config);
        else if (!Ok(r))
          rec.Failed("ncclCommInitRankScalable", r, nullptr, false);
      });
}

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  NCCLWATCH_REAL(ncclCommInitAll);
  return Managed(
      "ncclCommInitAll", true, [&] { return real(comms, ndev, devlist); },
      [&](Recorder& rec, ThreadState&, ncclResult_t r) {
        if (!Ok(r) || !comms) return;
        // All ranks live in this process: an id local to it is an id equal on every member.
        uint64_t seed[2] = {static_cast<uint64_t>(getpid()), g_init_all_count.fetch_add(1)};
        uint64_t id = Fnv1a64(seed, sizeof seed, Fnv1a64("init_all", 8));
        for (int i = 0; i < ndev; ++i) Register(rec, comms[i], id, ndev, i, CommKind::InitAll, nullptr);
      });
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  NCCLWATCH_REAL(ncclCommSplit);
  return CreateChild(
      "ncclCommSplit", comm, newcomm, config, CommKind::Split, color, key,
      [&] { return real(comm, color, key, newcomm, config); },
      [&](uint64_t parent_id, uint32_t child) { return CommIdForSplit(parent_id, child, color); },
      [&](const CommInfo& parent, uint32_t child) {
        // Every member of the parent takes part (whatever its color): one id for the split
        // itself, no child's (a color no call can pass).
        return Creation{CommIdForSplit(parent.id, child, INT_MIN), parent.size, parent.rank};
      });
}

ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
                            ncclConfig_t* config, int shrinkFlags) {
  NCCLWATCH_REAL(ncclCommShrink);
  return CreateChild(
      "ncclCommShrink", comm, newcomm, config, CommKind::Shrink, 0, 0,
      [&] { return real(comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags); },
      [&](uint64_t parent_id, uint32_t child) {
        return CommIdForShrink(parent_id, child, excludeRanksList, excludeRanksCount);
      },
      [&](const CommInfo& parent, uint32_t child) {
        // The ranks left take part, renumbered past the excluded ones: the child itself.
        std::set<int> excluded;
        for (int i = 0; excludeRanksList && i < excludeRanksCount; ++i)
          if (excludeRanksList[i] >= 0 && excludeRanksList[i] < parent.size) excluded.insert(excludeRanksList[i]);
        const int below = static_cast<int>(std::distance(excluded.begin(), excluded.lower_bound(parent.rank)));
        return Creation{CommIdForShrink(parent.id, child, excludeRanksList, excludeRanksCount),
                        parent.size - static_cast<int>(excluded.size()), parent.rank - below};
      });
}

#define NCCLWATCH_END_OF_LIFE(fn, new_state)                                              \
  ncclResult_t fn(ncclComm_t comm) {                                                      \
    NCCLWATCH_REAL(fn);                                                                   \
    if (Runtime* rt = Runtime::IfActive()) {                                              \
      if (CommInfo* c = rt->recorder().Known(comm)) {                                     \
        c->live().state.store(new_state);                                                   \
        c->live().ended_ns.store(MonoNs());                                                 \
      }                                                                                   \
    }                                                                                     \
    return Managed(#fn, false, [&] { return real(comm); }, [](Recorder&, ThreadState&, ncclResult_t) {}); \
  }
NCCLWATCH_END_OF_LIFE(ncclCommFinalize, CommState::Finalized)
NCCLWATCH_END_OF_LIFE(ncclCommDestroy, CommState::Destroyed)
#undef NCCLWATCH_END_OF_LIFE

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  NCCLWATCH_REAL(ncclCommAbort);
  // Dump before forwarding: frameworks abort communicators right before killing the process.
  // ncclCommAbort(NULL) does nothing in NCCL: nothing to report either.
  if (Runtime* rt = comm ? Runtime::IfActive() : nullptr) {
    ThreadState& ts = CurrentThread();
    if (!ts.inside) {
      ReentryGuard guard(ts);
      Quietly("ncclCommAbort", [&] { rt->recorder().Aborted(rt->recorder().Known(comm)); });
    }
  }
  return Managed("ncclCommAbort", false, [&] { return real(comm); }, [](Recorder&, ThreadState&, ncclResult_t) {});
}

ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  NCCLWATCH_REAL(ncclCommRevoke);
  return Managed("ncclCommRevoke", false, [&] { return real(comm, revokeFlags); },
                 [](Recorder&, ThreadState&, ncclResult_t) {});
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  NCCLWATCH_REAL(ncclCommGetAsyncError);
  ncclResult_t r = real(comm, asyncError);
  Runtime* rt = Runtime::IfActive();
  ThreadState& ts = CurrentThread();
  if (!rt || ts.inside || r != ncclSuccess || !asyncError) return r;
  ReentryGuard guard(ts);
  Quietly("ncclCommGetAsyncError", [&] {
    Recorder& rec = rt->recorder();
    CommInfo* c = rec.Known(comm);
    rec.Settle(c, *asyncError);
    if (*asyncError != ncclSuccess && *asyncError != ncclInProgress) rec.Failed("ncclCommGetAsyncError", *asyncError, c, true);
  });
  return r;
}

ncclResult_t ncclGroupStart() {
  NCCLWATCH_REAL(ncclGroupStart);
  if (Runtime::Off()) return real();
  ThreadState& ts = CurrentThread();
  if (ts.inside || !Runtime::Acquire()) return real();
  if (ts.group_depth++ == 0) ts.group_id = g_next_group_id.fetch_add(1);
  ReentryGuard guard(ts);
  return real();
}

ncclResult_t ncclGroupEnd() {
  NCCLWATCH_REAL(ncclGroupEnd);
  if (Runtime::Off()) return real();
  ThreadState& ts = CurrentThread();
  Runtime* rt = Runtime::IfActive();
  if (ts.inside || !rt || ts.group_depth == 0) return real();
  ReentryGuard guard(ts);
  if (--ts.group_depth > 0) return real();
  return CallExactlyOnce("ncclGroupEnd", real, [&](RealCall once) { return LaunchGroup(rt->recorder(), ts, once); });
}

ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  NCCLWATCH_REAL(ncclGroupSimulateEnd);
  ThreadState& ts = CurrentThread();
  // Launches nothing: the operations buffered in the group are dropped, unnumbered.
  if (!ts.inside && ts.group_depth > 0 && --ts.group_depth == 0 && ts.group) ts.group->count = 0;
  ReentryGuard guard(ts);
  return real(simInfo);
}

}  // extern "C"
