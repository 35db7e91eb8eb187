// The black box across processes: a child records into its black box and ends without a word;
// the parent, as the host's caretaker, turns it into a postmortem dump and removes it.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <utime.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "blackbox/black_box.h"
#include "blackbox/postmortem.h"
#include "common/clock.h"
#include "format/dump_reader.h"
#include "format/file_name.h"
#include "format/trace_writer.h"
#include "record/comm_registry.h"
#include "record/flight_ring.h"
#include "record/thread_registry.h"
#include "temp_dir.h"

using namespace ncclwatch;
using testing::TempDir;

namespace {

std::vector<std::string> Listing(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> Boxes(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& name : Listing(dir))
    if (name.find("ncclwatch-box-") != std::string::npos) out.push_back(name);
  return out;
}

// A child that records what a rank in an all-reduce records, then ends as `how` says. kStopped:
// it stops itself (SIGSTOP) and waits to be killed; kStoppedThenRuns: the same, and once
// continued its watchdog polls again (it writes a byte to `ran_fd` then) before it waits.
enum class Ending {
  kWithoutAWord, kAfterItsOwnDump, kNormalExit, kStopped, kStoppedThenRuns,
  // Its own word on its end, in the box (EndingMark); the box stays (as after setresuid, chroot).
  kExitedNoRecord, kExitedWithRecord, kExeced, kOtherNamespace,
};

pid_t RecordingChild(const std::string& boxes, const std::string& dumps, Ending how, int ran_fd = -1) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  std::string why;
  auto box = blackbox::BlackBox::Create(boxes, 64, getpid(), "feedfacecafe0001", 30.0, &why);
  if (!box) _exit(10);
  blackbox::BoxIdentity id;
  id.host = "node7";
  id.pid = getpid();
  id.process_uid = "feedfacecafe0001";
  id.dump_dir = dumps;
  id.cmdline = {"python", "train.py"};
  box->SetIdentity(blackbox::IdentityJson(id));
  box->SetRank(3, 8);

  FlightRing ring(64, box->ring());
  CommRegistry comms;
  comms.UseStorage(box->comms(), box->comms_capacity());
  auto info = std::make_unique<CommInfo>();
  info->id = 0xabcdef;
  info->size = 8;
  info->rank = 3;
  info->name = "world";
  CommInfo* c = comms.Register(std::move(info));
  ThreadRegistry threads;
  threads.UseStorage(box->threads());
  ThreadSlot* slot = threads.Claim(4242);

  trace::Document site;
  trace::NativeFrame frame;
  frame.ip = 0x1234;
  frame.module = "/opt/train/bin/train";
  frame.symbol = "train_step";
  site.detail.callsites.push_back({0, {{frame}, {{"train.py", 88, "train_step", false}}}, "", ""});
  box->AppendCallsite(trace::WriteDocument(site));

  for (uint64_t seq = 1; seq <= 12; ++seq) {
    OpSnapshot op;
    op.comm_id = c->id;
    op.seq = c->live().last_enqueued.fetch_add(1) + 1;
    op.kind = trace::OpKind::AllReduce;
    op.bytes = 4096;
    op.callsite = 0;
    op.enqueue_ns = 1000 + seq;
    op.state = trace::OpState::Enqueued;
    const uint64_t index = ring.Record(op);
    if (seq < 12) {
      ring.SetState(index, trace::OpState::Completed, 2000 + seq);
      c->live().last_completed.store(seq);
    } else {
      slot->since_ns.store(1000 + seq);
      slot->op_index1.store(index + 1);
      slot->function.store("ncclAllReduce");  // inside #12 when it ends
      threads.NameCalls();
    }
  }
  box->Alive(1'700'000'000'000'000'000, 5'000'000'000, 4'900'000'000, 0);
  if (how == Ending::kAfterItsOwnDump) box->FinalDumpWritten(4'999'000'000);
  if (how == Ending::kNormalExit) box->Remove();
  if (how == Ending::kExitedNoRecord || how == Ending::kExitedWithRecord) box->MarkEnding(blackbox::EndingKind::kExit, 12);
  if (how == Ending::kExitedWithRecord) box->MarkRecordWritten();
  if (how == Ending::kExeced) box->MarkEnding(blackbox::EndingKind::kExec, 0, "/bin/true");
  if (how == Ending::kOtherNamespace) {  // another container's: its mount namespace is not ours
    auto* h = static_cast<blackbox::Header*>(
        mmap(nullptr, sizeof(blackbox::Header), PROT_READ | PROT_WRITE, MAP_SHARED, open(box->path().c_str(), O_RDWR), 0));
    h->ns.mnt = blackbox::OwnNamespaces().mnt + 1;
  }
  if (how == Ending::kStopped || how == Ending::kStoppedThenRuns) {
    raise(SIGSTOP);
    if (how == Ending::kStoppedThenRuns) {
      box->Alive(1'700'000'100'000'000'000, static_cast<int64_t>(MonoNs()), static_cast<int64_t>(MonoNs()), 12);
      if (write(ran_fd, "x", 1) != 1) _exit(1);
    }
    for (;;) pause();
  }
  _exit(0);  // the lock goes with the process; the file stays unless removed
}

std::string DumpFileNameOf(const trace::LoadedDump& d) {
  return trace::DumpFileName(d.summary.rank, d.summary.host, d.summary.pid, d.summary.dump_seq, d.summary.reason.Name());
}

pid_t StoppedChild(const std::string& boxes, const std::string& dumps, Ending how, int ran_fd = -1) {
  const pid_t pid = RecordingChild(boxes, dumps, how, ran_fd);
  int status = 0;
  REQUIRE(waitpid(pid, &status, WUNTRACED) == pid);
  REQUIRE(WIFSTOPPED(status));
  return pid;
}

void Kill(pid_t pid) {
  kill(pid, SIGKILL);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
}

trace::LoadedDump Read(const std::string& path) {
  trace::LoadedDump d;
  REQUIRE(trace::ReadDumpFile(path, trace::ReadDepth::kFull, &d).usable);
  return d;
}

void Reap(pid_t pid) {
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
}

// Another process that does `hold` (opens a box, takes a lock) and keeps what it holds until
// Release(): a live owner, as the caretaker sees one.
class HoldingChild {
 public:
  explicit HoldingChild(const std::function<bool()>& hold) {
    REQUIRE(pipe(ready_) == 0);
    REQUIRE(pipe(release_) == 0);
    pid_ = fork();
    if (pid_ == 0) {
      char b = hold() ? 1 : 0;
      if (write(ready_[1], &b, 1) != 1 || read(release_[0], &b, 1) != 1) _exit(1);
      _exit(0);
    }
    char b = 0;
    REQUIRE(read(ready_[0], &b, 1) == 1);
    REQUIRE(b == 1);
  }
  void Release() {
    REQUIRE(write(release_[1], "\n", 1) == 1);
    Reap(pid_);
    for (int fd : {ready_[0], ready_[1], release_[0], release_[1]}) close(fd);
  }

 private:
  int ready_[2], release_[2];
  pid_t pid_ = -1;
};

// A live process's box (lives until the child's _exit: never destroyed there).
bool HoldBox(const std::string& boxes) {
  std::string why;
  return blackbox::BlackBox::Create(boxes, 64, getpid(), "0000000000000002", 30.0, &why).release() != nullptr;
}

}  // namespace

TEST_CASE("black box: a process that marked its end is told by its mark, never as a death") {
  TempDir boxes, dumps;
  // Exited, its record not written (out of memory, a directory out of reach): the record is
  // written from the box, with its status.
  Reap(RecordingChild(boxes.path(), dumps.path(), Ending::kExitedNoRecord));
  blackbox::CaretakerPass pass = blackbox::ConvertDeadBoxes(boxes.path(), "none");
  REQUIRE(pass.converted.size() == 1);
  CHECK(pass.converted[0].line.find("exited with status 12 without writing its exit record") != std::string::npos);
  REQUIRE(!pass.converted[0].dump.empty());
  trace::LoadedDump d;
  REQUIRE(trace::ReadDumpFile(pass.converted[0].dump, trace::ReadDepth::kFull, &d).usable);
  CHECK(d.summary.reason.Is(trace::DumpReason::Exit));
  CHECK(d.summary.exit_status == 12);
  CHECK(Boxes(boxes.path()).empty());
  // Exited with its record out, its box left (setresuid, chroot): removed, nothing written.
  Reap(RecordingChild(boxes.path(), dumps.path(), Ending::kExitedWithRecord));
  pass = blackbox::ConvertDeadBoxes(boxes.path(), "none");
  REQUIRE(pass.converted.size() == 1);
  CHECK(pass.converted[0].dump.empty());
  CHECK(!pass.converted[0].ended);
  CHECK(pass.converted[0].line.find("wrote its exit record") != std::string::npos);
  // Exec'd into another program that has ended since: no death.
  Reap(RecordingChild(boxes.path(), dumps.path(), Ending::kExeced));
  CHECK(blackbox::ReadDeadBoxes(boxes.path()).empty());  // a reader tells nothing either
  pass = blackbox::ConvertDeadBoxes(boxes.path(), "none");
  REQUIRE(pass.converted.size() == 1);
  CHECK(pass.converted[0].dump.empty());
  CHECK(pass.converted[0].line.find("re-executed itself (exec of /bin/true)") != std::string::npos);
  CHECK(Boxes(boxes.path()).empty());
  // Another namespace's dead: neither read nor converted nor removed here.
  Reap(RecordingChild(boxes.path(), dumps.path(), Ending::kOtherNamespace));
  CHECK(blackbox::ReadDeadBoxes(boxes.path()).empty());
  CHECK(blackbox::ConvertDeadBoxes(boxes.path(), "none").converted.empty());
  CHECK(Boxes(boxes.path()).size() == 1);
  CHECK(Listing(dumps.path()).size() == 1);  // the exit record above only
}

TEST_CASE("black box: a process gone without a word becomes a postmortem dump of what it knew") {
  TempDir boxes, dumps;
  Reap(RecordingChild(boxes.path(), dumps.path(), Ending::kWithoutAWord));
  REQUIRE(Boxes(boxes.path()).size() == 1);

  blackbox::CaretakerPass pass = blackbox::ConvertDeadBoxes(boxes.path(), "none");
  REQUIRE(pass.converted.size() == 1);
  const blackbox::Conversion& c = pass.converted[0];
  CHECK(c.rank == 3);
  CHECK(c.line.find("rank 3 (pid") != std::string::npos);
  REQUIRE(!c.dump.empty());
  CHECK(Boxes(boxes.path()).empty());  // converted, then removed

  trace::LoadedDump d;
  REQUIRE(trace::ReadDumpFile(c.dump, trace::ReadDepth::kFull, &d).usable);
  CHECK(d.summary.reason.Is(trace::DumpReason::Postmortem));
  CHECK(d.summary.rank == 3);
  CHECK(d.summary.world_size == 8);
  CHECK(d.summary.host == "node7");
  CHECK(d.summary.detail.find("SIGKILL, the OOM killer or a raw exit_group") != std::string::npos);
  CHECK(d.summary.time_mono_ns == 5'000'000'000);  // as of its last sign of life
  REQUIRE(d.summary.in_nccl.size() == 1);
  CHECK(d.summary.in_nccl[0].function == "ncclAllReduce");
  CHECK(d.summary.in_nccl[0].tid == 4242);
  REQUIRE(d.summary.comms.size() == 1);
  CHECK(d.summary.comms[0].name == "world");
  CHECK(d.summary.comms[0].last_enqueued == 12);
  CHECK(d.summary.comms[0].last_completed == 11);
  REQUIRE(d.summary.in_flight.size() == 1);
  CHECK(d.summary.in_flight[0].seq == 12);
  REQUIRE(d.detail);
  CHECK(d.detail->ring.entries.size() == 12);
  CHECK(d.detail->process.cmdline == std::vector<std::string>{"python", "train.py"});
  const trace::Callsite* site = d.detail->FindCallsite(0);
  REQUIRE(site);
  REQUIRE(site->stack.python.size() == 1);
  CHECK(site->stack.python[0].line == 88);
  CHECK(site->stack.native.at(0).symbol == "train_step");
}

TEST_CASE("black box: a live process's box, and one that left its own word, are never converted") {
  TempDir boxes, dumps;
  // Live: this process's own box, locked by this process, is skipped by name.
  std::string why;
  auto own = blackbox::BlackBox::Create(boxes.path(), 64, getpid(), "0000000000000001", 30.0, &why);
  REQUIRE(own);
  const std::string own_name = own->path().substr(own->path().rfind('/') + 1);
  // Live in another process: its lock is held.
  HoldingChild live([&] { return HoldBox(boxes.path()); });
  // Dumped its own end (SIGTERM) just before it went: removed, no dump.
  Reap(RecordingChild(boxes.path(), dumps.path(), Ending::kAfterItsOwnDump));

  blackbox::CaretakerPass pass = blackbox::ConvertDeadBoxes(boxes.path(), "none", own_name);
  REQUIRE(pass.converted.size() == 1);
  CHECK(pass.converted[0].dump.empty());
  CHECK(pass.converted[0].line.find("dumped at its end") != std::string::npos);
  CHECK(Listing(dumps.path()).empty());
  CHECK(Boxes(boxes.path()).size() == 2);  // ours and the live child's

  live.Release();
  pass = blackbox::ConvertDeadBoxes(boxes.path(), "none", own_name);
  CHECK(pass.converted.size() == 1);  // now it is gone
  CHECK(Boxes(boxes.path()) == std::vector<std::string>{own_name});
  own->Remove();
  CHECK(Boxes(boxes.path()).empty());
}

TEST_CASE("black box: a reader reads what dead processes left as their postmortem dumps, changing nothing") {
  TempDir boxes, dumps;
  Reap(RecordingChild(boxes.path(), dumps.path(), Ending::kWithoutAWord));
  Reap(RecordingChild(boxes.path(), dumps.path(), Ending::kAfterItsOwnDump));  // its own word: nothing due
  // A live process's box (its lock held by another process): not read.
  HoldingChild live([&] { return HoldBox(boxes.path()); });
  auto contents = [&] {
    std::vector<std::string> all;
    for (const auto& name : Listing(boxes.path())) {
      std::ifstream f(boxes.path() + "/" + name, std::ios::binary);
      all.push_back(name + ":" + std::string(std::istreambuf_iterator<char>(f), {}));
    }
    return all;
  };
  const auto before = contents();
  REQUIRE(before.size() == 3);

  std::vector<blackbox::LeftBox> left = blackbox::ReadDeadBoxes(boxes.path());
  CHECK(contents() == before);  // not a byte changed, nothing removed
  CHECK(Listing(dumps.path()).empty());  // nothing written
  REQUIRE(left.size() == 2);  // the two dead ones
  const blackbox::LeftBox& dead = left[0].dump.empty() ? left[1] : left[0];
  CHECK((left[0].dump.empty() != left[1].dump.empty()));  // the one that dumped at its end has none due
  CHECK(dead.rank == 3);
  CHECK(dead.dump_dir == dumps.path());
  CHECK(dead.problem.empty());
  trace::LoadedDump in_memory;
  REQUIRE(trace::ReadDumpBuffer(dead.dump, trace::ReadDepth::kFull, &in_memory).usable);

  // The dump the caretaker then writes is the one the reader made.
  live.Release();
  blackbox::CaretakerPass pass = blackbox::ConvertDeadBoxes(boxes.path(), "none");
  std::string written;
  for (const auto& c : pass.converted)
    if (!c.dump.empty()) written = c.dump;
  REQUIRE(!written.empty());
  trace::LoadedDump converted;
  REQUIRE(trace::ReadDumpFile(written, trace::ReadDepth::kFull, &converted).usable);
  CHECK(in_memory.summary.reason.Is(trace::DumpReason::Postmortem));
  CHECK(in_memory.summary.rank == converted.summary.rank);
  CHECK(in_memory.summary.time_mono_ns == converted.summary.time_mono_ns);
  CHECK(in_memory.summary.in_flight.size() == converted.summary.in_flight.size());
  CHECK(in_memory.summary.in_nccl.size() == converted.summary.in_nccl.size());
  REQUIRE(in_memory.detail);
  CHECK(in_memory.detail->ring.entries.size() == converted.detail->ring.entries.size());
  CHECK(DumpFileNameOf(in_memory) == written.substr(written.rfind('/') + 1));
}

TEST_CASE("black box: a reader reads only the dead boxes it asks for, not another job's") {
  // Two jobs died on this host without a word; a reader of job A's directory asks for A's box
  // alone. B's is declined from its identity, before its box is read or its dump made.
  TempDir boxes, dumps_a, dumps_b;
  Reap(RecordingChild(boxes.path(), dumps_a.path(), Ending::kWithoutAWord));
  Reap(RecordingChild(boxes.path(), dumps_b.path(), Ending::kWithoutAWord));
  REQUIRE(Boxes(boxes.path()).size() == 2);
  std::vector<std::string> asked;
  bool asked_before_reading = true;
  const auto left = blackbox::ReadDeadBoxes(boxes.path(), [&](const blackbox::LeftBox& box) {
    asked.push_back(box.dump_dir);
    asked_before_reading = asked_before_reading && box.dump.empty() && box.pid > 0 && box.rank == 3;
    return box.dump_dir == dumps_a.path();
  });
  std::sort(asked.begin(), asked.end());
  CHECK(asked == std::vector<std::string>{std::min(dumps_a.path(), dumps_b.path()), std::max(dumps_a.path(), dumps_b.path())});
  CHECK(asked_before_reading);
  REQUIRE(left.size() == 1);  // B's is not there
  CHECK(left[0].dump_dir == dumps_a.path());
  CHECK(!left[0].dump.empty());
}

TEST_CASE("black box: a stopped process gets one stand-in dump, and its postmortem keeps the stop") {
  // Stopped (SIGSTOP) inside its all-reduce #12, its watchdog silent past its 30 s deadline:
  // the caretaker writes a stand-in from its box (the process cannot answer), once.
  TempDir boxes, dumps;
  const pid_t pid = StoppedChild(boxes.path(), dumps.path(), Ending::kStopped);
  blackbox::CaretakerPass pass = blackbox::ConvertDeadBoxes(boxes.path(), "none");
  REQUIRE(pass.converted.size() == 1);
  const blackbox::Conversion& c = pass.converted[0];
  CHECK(c.stopped);
  CHECK(c.rank == 3);
  CHECK(c.line.find("is stopped (SIGSTOP or a debugger)") != std::string::npos);
  REQUIRE(!c.dump.empty());
  CHECK(Boxes(boxes.path()).size() == 1);  // it lives: its box stays
  trace::LoadedDump d = Read(c.dump);
  CHECK(d.summary.reason.Is(trace::DumpReason::Stopped));
  REQUIRE(d.summary.stopped);
  CHECK(d.summary.stopped->how == "stopped");
  CHECK(d.summary.stopped->seen_unix_ns > 0);
  CHECK(d.summary.time_mono_ns == 5'000'000'000);  // as of its last sign of life
  REQUIRE(d.summary.in_nccl.size() == 1);
  CHECK(d.summary.in_nccl[0].function == "ncclAllReduce");
  REQUIRE(d.summary.comms.size() == 1);
  CHECK(d.summary.comms[0].last_enqueued == 12);

  CHECK(blackbox::ConvertDeadBoxes(boxes.path(), "none").converted.empty());  // once a stop

  // Killed while stopped (its launcher's SIGKILL): the postmortem says it was stopped.
  Kill(pid);
  pass = blackbox::ConvertDeadBoxes(boxes.path(), "none");
  REQUIRE(pass.converted.size() == 1);
  CHECK(!pass.converted[0].stopped);
  CHECK(pass.converted[0].line.find("was stopped (SIGSTOP or a debugger), then ended without a word") != std::string::npos);
  REQUIRE(!pass.converted[0].dump.empty());
  trace::LoadedDump pm = Read(pass.converted[0].dump);
  CHECK(pm.summary.reason.Is(trace::DumpReason::Postmortem));
  CHECK(pm.summary.detail.find("was stopped (SIGSTOP or a debugger), then killed while stopped") != std::string::npos);
  CHECK(pm.summary.detail.find("OOM killer") == std::string::npos);
  REQUIRE(pm.summary.stopped);
  CHECK(pm.summary.stopped->seen_unix_ns == d.summary.stopped->seen_unix_ns);
  CHECK(pm.summary.stopped->last_seen_unix_ns >= d.summary.stopped->last_seen_unix_ns);
  CHECK(Boxes(boxes.path()).empty());
}

TEST_CASE("black box: a process that is not the caretaker sees a stopped one, once, and leaves the dead to the caretaker") {
  // The caretaker may be the stopped process: every other process looks for stops.
  TempDir boxes, dumps;
  Reap(RecordingChild(boxes.path(), dumps.path(), Ending::kWithoutAWord));  // dead: not its business
  HoldingChild running([&] { return HoldBox(boxes.path()); });              // runs: nothing to say
  const pid_t pid = StoppedChild(boxes.path(), dumps.path(), Ending::kStopped);
  std::vector<blackbox::Conversion> seen = blackbox::CareForStoppedBoxes(boxes.path(), "");
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].stopped);
  CHECK(seen[0].rank == 3);
  CHECK(seen[0].line.find("is stopped (SIGSTOP or a debugger)") != std::string::npos);
  REQUIRE(!seen[0].dump.empty());
  CHECK(Read(seen[0].dump).summary.reason.Is(trace::DumpReason::Stopped));
  CHECK(Boxes(boxes.path()).size() == 3);  // nothing converted or removed
  CHECK(blackbox::CareForStoppedBoxes(boxes.path(), "").empty());  // said once a stop
  // The caretaker, later, says it no second time; the dead one is its to convert.
  blackbox::CaretakerPass pass = blackbox::ConvertDeadBoxes(boxes.path(), "none");
  REQUIRE(pass.converted.size() == 1);
  CHECK(!pass.converted[0].stopped);
  CHECK(pass.converted[0].line.find("ended without a word") != std::string::npos);
  // Killed while stopped: its postmortem keeps the stop another process saw.
  Kill(pid);
  pass = blackbox::ConvertDeadBoxes(boxes.path(), "none");
  REQUIRE(pass.converted.size() == 1);
  CHECK(pass.converted[0].line.find("was stopped (SIGSTOP or a debugger), then ended without a word") != std::string::npos);
  running.Release();
}

TEST_CASE("black box: a process that ran again after its stop is not said stopped when it dies") {
  TempDir boxes, dumps;
  int ran[2];
  REQUIRE(pipe(ran) == 0);
  const pid_t pid = StoppedChild(boxes.path(), dumps.path(), Ending::kStoppedThenRuns, ran[1]);
  blackbox::CaretakerPass pass = blackbox::ConvertDeadBoxes(boxes.path(), "none");
  REQUIRE(pass.converted.size() == 1);
  CHECK(pass.converted[0].stopped);
  kill(pid, SIGCONT);
  char b;
  REQUIRE(read(ran[0], &b, 1) == 1);  // its watchdog polled again
  CHECK(blackbox::ConvertDeadBoxes(boxes.path(), "none").converted.empty());  // running: nothing to say
  Kill(pid);
  pass = blackbox::ConvertDeadBoxes(boxes.path(), "none");
  REQUIRE(pass.converted.size() == 1);
  trace::LoadedDump pm = Read(pass.converted[0].dump);
  CHECK(pm.summary.reason.Is(trace::DumpReason::Postmortem));
  CHECK(!pm.summary.stopped);
  CHECK(pm.summary.detail.find("SIGKILL, the OOM killer or a raw exit_group") != std::string::npos);
  close(ran[0]);
  close(ran[1]);
}

TEST_CASE("what the host sees of a process that cannot run: /proc's state, a frozen cgroup") {
  using trace::StopKind;
  CHECK(blackbox::StopOfState('T') == StopKind::Stopped);
  CHECK(blackbox::StopOfState('t') == StopKind::Traced);
  for (char running : {'R', 'S', 'D', 'Z', '\0'}) CHECK(blackbox::StopOfState(running) == std::nullopt);
  CHECK(blackbox::StopOf(getpid()) == std::nullopt);  // this process runs
  const pid_t child = fork();
  if (child == 0) {
    raise(SIGSTOP);
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, WUNTRACED) == child);
  CHECK(blackbox::StopOf(child) == StopKind::Stopped);  // as /proc says it
  Kill(child);

  TempDir root;
  std::filesystem::create_directories(root.path() + "/job.slice/rank3");
  root.Write("job.slice/rank3/cgroup.events", "populated 1\nfrozen 1\n");
  std::filesystem::create_directories(root.path() + "/job.slice/rank4");
  root.Write("job.slice/rank4/cgroup.events", "populated 1\nfrozen 0\n");
  std::filesystem::create_directories(root.path() + "/freezer/slurm/job7");
  root.Write("freezer/slurm/job7/freezer.state", "FROZEN\n");
  CHECK(blackbox::CgroupFrozen("0::/job.slice/rank3\n", root.path()));
  CHECK(!blackbox::CgroupFrozen("0::/job.slice/rank4\n", root.path()));
  CHECK(blackbox::CgroupFrozen("12:cpu,cpuacct:/x\n7:freezer:/slurm/job7\n0::/y\n", root.path()));
  CHECK(!blackbox::CgroupFrozen("7:freezer:/slurm/job8\n", root.path()));
  CHECK(!blackbox::CgroupFrozen("0::/../job.slice/rank3\n", root.path()));
  CHECK(!blackbox::CgroupFrozen("garbage", root.path()));
}

TEST_CASE("black box: a normal exit leaves nothing, and damaged or foreign boxes are removed with one line") {
  TempDir boxes, dumps;
  Reap(RecordingChild(boxes.path(), dumps.path(), Ending::kNormalExit));
  CHECK(Boxes(boxes.path()).empty());

  const std::string name = blackbox::BoxFileName(getuid(), 99999, "0123");
  {
    std::ofstream f(boxes.path() + "/" + name);
    f << std::string(8192, 'x');
  }
  blackbox::CaretakerPass pass = blackbox::ConvertDeadBoxes(boxes.path(), "none");
  REQUIRE(pass.converted.size() == 1);
  CHECK(pass.converted[0].line.find("not a black box") != std::string::npos);
  CHECK(Boxes(boxes.path()).empty());
}

TEST_CASE("caretaker: leftovers of dead processes go, what a live process watches stays") {
  TempDir boxes, relay;
  const std::string uid = std::to_string(getuid());
  auto age = [](const std::string& path, int seconds) {
    struct utimbuf t;
    t.actime = t.modtime = time(nullptr) - seconds;
    REQUIRE(utime(path.c_str(), &t) == 0);
  };
  // A dead job's relay (nobody holds its lock) and a half-created box, both old.
  const std::string dead = relay.Write("ncclwatch-relay-" + uid + "-00000000000000aa", "{}");
  const std::string dead_lock = relay.Write("ncclwatch-relay-" + uid + "-00000000000000aa.lock", "");
  const std::string hidden = boxes.Write("." + blackbox::BoxFileName(getuid(), 99998, "01"), "");
  age(dead, 120);
  age(dead_lock, 120);
  age(hidden, 120);
  // A live job's relay: its watcher holds the flock.
  const std::string live_lock = relay.Write("ncclwatch-relay-" + uid + "-00000000000000bb.lock", "");
  age(live_lock, 120);
  int held = open(live_lock.c_str(), O_RDWR);
  REQUIRE(held >= 0);
  // A process creating its black box right now (its hidden box locked): it may be about to open
  // a relay, so young relay files stay while it lives.
  const std::string starting = boxes.Write("." + blackbox::BoxFileName(getuid(), 99997, "02"), "");
  age(starting, 120);
  int starting_fd = open(starting.c_str(), O_RDWR);
  REQUIRE(starting_fd >= 0);
  HoldingChild watcher([&] { return flock(held, LOCK_EX | LOCK_NB) == 0 && blackbox::TakeBoxLock(starting_fd); });
  close(held);
  close(starting_fd);
  // A new one: may belong to a process starting now.
  relay.Write("ncclwatch-relay-" + uid + "-00000000000000cc.lock", "");
  // A relay whose lock file is gone (written by a later watcher that was then killed).
  age(relay.Write("ncclwatch-relay-" + uid + "-00000000000000dd", "{}"), 120);

  blackbox::CaretakerPass pass = blackbox::ConvertDeadBoxes(boxes.path(), relay.path());
  CHECK(pass.removed_leftovers == 4);
  CHECK(Listing(relay.path()) == std::vector<std::string>{"ncclwatch-relay-" + uid + "-00000000000000bb.lock",
                                                          "ncclwatch-relay-" + uid + "-00000000000000cc.lock"});
  CHECK(Listing(boxes.path()) == std::vector<std::string>{"." + blackbox::BoxFileName(getuid(), 99997, "02")});
  watcher.Release();
  // Nobody is starting any more: the young relay goes too, with the watcher's and the box.
  pass = blackbox::ConvertDeadBoxes(boxes.path(), relay.path());
  CHECK(pass.removed_leftovers == 3);
  CHECK(Listing(relay.path()).empty());
  CHECK(Listing(boxes.path()).empty());
}

TEST_CASE("how a process without a word ended: the kernel's OOM-killer line for its pid") {
  const std::vector<std::string> records = {
      "6,1201,100,-;oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),task=python3,pid=4321,uid=1000",
      "3,1202,101,-;Out of memory: Killed process 4321 (python3) total-vm:9000kB, anon-rss:8000kB\n SUBSYSTEM=x",
      "3,1203,102,-;Out of memory: Killed process 43210 (python3) total-vm:1kB"};
  CHECK(blackbox::FindOomLine(records, 4321) == "Out of memory: Killed process 4321 (python3) total-vm:9000kB, anon-rss:8000kB");
  CHECK(blackbox::FindOomLine({records[0]}, 4321).find("pid=4321,") != std::string::npos);
  CHECK(blackbox::FindOomLine(records, 432).empty());
  CHECK(blackbox::HowItEnded("").find("SIGKILL, the OOM killer or a raw exit_group") != std::string::npos);
  CHECK(blackbox::HowItEnded("Out of memory: Killed process 1").find("OOM killer (Out of memory") != std::string::npos);
  // A zombie's status, read before its parent reaped it: what it says, and nothing more.
  CHECK(blackbox::HowItEnded("", std::nullopt, 5 << 8) ==
        "ended without a word: exited with status 5 without an exit record (an exit past the C library: a raw "
        "exit_group system call)");
  CHECK(blackbox::HowItEnded("", std::nullopt, 9).find("killed by SIGKILL") != std::string::npos);
}

TEST_CASE("black box identity round-trips, and a huge command line does not crowd out who it is") {
  blackbox::BoxIdentity id;
  id.host = "h";
  id.pid = 12;
  id.dump_dir = "/d";
  id.environment = {{"NCCL_DEBUG", "WARN"}};
  id.cmdline = {"a", "b"};
  blackbox::BoxIdentity back;
  REQUIRE(blackbox::ParseIdentity(blackbox::IdentityJson(id), &back));
  CHECK(back.host == "h");
  CHECK(back.pid == 12);
  CHECK(back.cmdline == id.cmdline);
  CHECK(back.environment == id.environment);
  id.cmdline.assign(1, std::string(200000, 'x'));
  const std::string text = blackbox::IdentityJson(id);
  CHECK(text.size() <= blackbox::kIdentityBytes);
  REQUIRE(blackbox::ParseIdentity(text, &back));
  CHECK(back.dump_dir == "/d");
  CHECK(!blackbox::ParseIdentity("{not json", &back));
}

namespace {

// A child with a black box that says who it is (its start, as the library writes it), which
// then drops the box's lock without ending: it closes every descriptor >= 3 (as daemons do,
// the box's included) and waits, or it re-executes itself as another program (`sleep`).
// Its post-mortem goes to `dumps` (the test's own directory: nothing is written elsewhere).
enum class Drop { kClosesDescriptors, kReexecutes };

pid_t LockDroppingChild(const std::string& boxes, const std::string& dumps, Drop how, int ready_fd,
                        int release_fd) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  std::string why;
  auto box = blackbox::BlackBox::Create(boxes, 64, getpid(), "feedfacecafe0002", 30.0, &why);
  if (!box) _exit(10);
  blackbox::BoxIdentity id;
  id.pid = getpid();
  id.process_uid = "feedfacecafe0002";
  id.dump_dir = dumps;
  id.start_ticks = blackbox::ReadProcStat(getpid()).start_ticks;
  if (id.start_ticks == 0) _exit(11);
  box->SetIdentity(blackbox::IdentityJson(id));
  box->SetRank(5, 8);
  for (int fd = 3; fd < 1024; ++fd)
    if (fd != ready_fd && fd != release_fd) close(fd);
  char b = 1;
  if (how == Drop::kReexecutes) {
    // Says it is ready from its new program (the descriptor survives the exec).
    const std::string shell = "printf x >&" + std::to_string(ready_fd) + "; read line <&" + std::to_string(release_fd);
    execl("/bin/sh", "sh", "-c", shell.c_str(), static_cast<char*>(nullptr));
    _exit(12);
  }
  if (write(ready_fd, &b, 1) != 1 || read(release_fd, &b, 1) != 1) _exit(13);
  _exit(0);
}

}  // namespace

TEST_CASE("black box: a free lock is no death while its process runs and a re-executed process leaves its old box quietly") {
  for (Drop how : {Drop::kClosesDescriptors, Drop::kReexecutes}) {
    CAPTURE(how == Drop::kReexecutes);
    TempDir boxes, dumps;
    int ready[2], release[2];
    REQUIRE(pipe(ready) == 0);
    REQUIRE(pipe(release) == 0);
    const pid_t child = LockDroppingChild(boxes.path(), dumps.path(), how, ready[1], release[0]);
    char b = 0;
    REQUIRE(read(ready[0], &b, 1) == 1);
    REQUIRE(Boxes(boxes.path()).size() == 1);
    blackbox::CaretakerPass pass = blackbox::ConvertDeadBoxes(boxes.path(), "none");
    if (how == Drop::kClosesDescriptors) {
      // Alive, its lock dropped by its own close: left alone (it takes the lock again itself).
      CHECK(pass.converted.empty());
      CHECK(Boxes(boxes.path()).size() == 1);
    } else {
      // The same process in another program: removed, and said as no death.
      REQUIRE(pass.converted.size() == 1);
      CHECK_FALSE(pass.converted[0].ended);
      CHECK(pass.converted[0].dump.empty());
      CHECK(pass.converted[0].line.find("re-executed itself") != std::string::npos);
      CHECK(Boxes(boxes.path()).empty());
    }
    REQUIRE(write(release[1], "\n", 1) == 1);
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
    if (how == Drop::kClosesDescriptors) {  // now it is gone without a word
      pass = blackbox::ConvertDeadBoxes(boxes.path(), "none");
      REQUIRE(pass.converted.size() == 1);
      CHECK(pass.converted[0].ended);
      CHECK(Boxes(boxes.path()).empty());
      CHECK(pass.converted[0].dump.rfind(dumps.path() + "/", 0) == 0);  // in the test's directory
    }
    for (int fd : {ready[0], ready[1], release[0], release[1]}) close(fd);
  }
}

TEST_CASE("black box: a process that closed the box descriptor takes its lock again and never touches the number") {
  TempDir boxes;
  std::string why;
  auto box = blackbox::BlackBox::Create(boxes.path(), 64, getpid(), "feedfacecafe0003", 30.0, &why);
  REQUIRE(box);
  CHECK(box->KeepLocked());
  // Which descriptor is the box's: the one whose link names it.
  int box_fd = -1;
  for (int fd = 3; fd < 1024 && box_fd < 0; ++fd) {
    char link[64], target[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    const ssize_t n = readlink(link, target, sizeof target - 1);
    if (n > 0 && std::string(target, static_cast<size_t>(n)) == box->path()) box_fd = fd;
  }
  REQUIRE(box_fd >= 3);
  // The application closes it and opens a file of its own, which gets the same number.
  TempDir own;
  close(box_fd);
  int app_fd = open((own.path() + "/app.txt").c_str(), O_RDWR | O_CREAT, 0600);
  if (app_fd != box_fd) {  // a lower number was free: the application's file takes the box's anyway
    REQUIRE(dup2(app_fd, box_fd) == box_fd);
    close(app_fd);
    app_fd = box_fd;
  }
  REQUIRE(write(app_fd, "0123456789", 10) == 10);
  // A reader sees the lock free: another process could take it.
  pid_t probe = fork();
  if (probe == 0) {
    const int fd = open(box->path().c_str(), O_RDWR);
    struct flock lock{};
    lock.l_type = F_WRLCK;
    lock.l_len = 1;
    _exit(fd >= 0 && fcntl(fd, F_GETLK, &lock) == 0 && lock.l_type == F_UNLCK ? 0 : 1);
  }
  int status = 0;
  REQUIRE(waitpid(probe, &status, 0) == probe);
  CHECK(WEXITSTATUS(status) == 0);

  CHECK(box->KeepLocked());  // opened and locked again, the application's file left as it is
  probe = fork();
  if (probe == 0) {
    const int fd = open(box->path().c_str(), O_RDWR);
    struct flock lock{};
    lock.l_type = F_WRLCK;
    lock.l_len = 1;
    _exit(fd >= 0 && fcntl(fd, F_GETLK, &lock) == 0 && lock.l_type == F_WRLCK ? 0 : 1);
  }
  REQUIRE(waitpid(probe, &status, 0) == probe);
  CHECK(WEXITSTATUS(status) == 0);
  struct stat st;
  REQUIRE(fstat(app_fd, &st) == 0);
  CHECK(st.st_size == 10);
  CHECK(lseek(app_fd, 0, SEEK_CUR) == 10);
  box.reset();  // its destructor closes only what is still ours
  CHECK(fcntl(app_fd, F_GETFD) >= 0);
  close(app_fd);
}
