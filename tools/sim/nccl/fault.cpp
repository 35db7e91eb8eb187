#include "fault.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace simnccl {

namespace {

bool ParseInt(const std::string& s, long long lo, long long hi, long long* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long long v = strtoll(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

std::string Trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

bool ParseOne(const std::string& entry, Fault* f, std::string* err) {
  size_t colon = entry.find(':');
  std::string kind = Trim(entry.substr(0, colon));
  static const struct {
    const char* name;
    FaultKind kind;
  } kKinds[] = {{"stall", FaultKind::kStall}, {"delay", FaultKind::kDelay},
                {"kernel", FaultKind::kKernel}, {"crash", FaultKind::kCrash},
                {"abort", FaultKind::kAbort}, {"error", FaultKind::kError}};
  bool known = false;
  for (const auto& k : kKinds) {
    if (kind == k.name) {
      f->kind = k.kind;
      known = true;
    }
  }
  if (!known) {
    *err = "unknown fault kind '" + kind + "' (stall, delay, kernel, crash, abort, error)";
    return false;
  }
  if (colon == std::string::npos) {
    *err = "'" + kind + "' needs ':rank=R,seq=N'";
    return false;
  }
  bool have_rank = false, have_seq = false, have_ms = false, have_signal = false;
  std::string rest = entry.substr(colon + 1);
  size_t pos = 0;
  while (pos <= rest.size()) {
    size_t comma = rest.find(',', pos);
    std::string kv = Trim(rest.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    pos = comma == std::string::npos ? rest.size() + 1 : comma + 1;
    if (kv.empty()) continue;
    size_t eq = kv.find('=');
    std::string k = Trim(kv.substr(0, eq)), v = eq == std::string::npos ? "" : Trim(kv.substr(eq + 1));
    long long n = 0;
    if (k == "rank") {
      if (!ParseInt(v, 0, 1 << 30, &n)) return *err = "rank must be an integer >= 0, got '" + v + "'", false;
      f->rank = static_cast<int>(n);
      have_rank = true;
    } else if (k == "seq") {
      if (!ParseInt(v, 1, INT64_MAX, &n)) return *err = "seq must be an integer >= 1, got '" + v + "'", false;
      f->seq = static_cast<uint64_t>(n);
      have_seq = true;
    } else if (k == "comm") {
      if (!ParseInt(v, 0, 1 << 30, &n)) return *err = "comm must be an integer >= 0, got '" + v + "'", false;
      f->comm = static_cast<int>(n);
    } else if (k == "ms") {
      if (!ParseInt(v, -1, 1 << 30, &n)) return *err = "ms must be an integer >= -1, got '" + v + "'", false;
      f->ms = static_cast<int>(n);
      have_ms = true;
    } else if (k == "signal") {
      if (v == "KILL" || v == "SIGKILL") f->signal = SIGKILL;
      else if (v == "SEGV" || v == "SIGSEGV") f->signal = SIGSEGV;
      else return *err = "signal must be KILL or SEGV, got '" + v + "'", false;
      have_signal = true;
    } else {
      return *err = "unknown key '" + k + "' (rank, seq, comm, ms, signal)", false;
    }
  }
  if (!have_rank || !have_seq) return *err = "'" + kind + "' needs both rank= and seq=", false;
  if (have_ms && f->kind != FaultKind::kDelay && f->kind != FaultKind::kKernel)
    return *err = "ms= applies only to delay and kernel", false;
  if (have_signal && f->kind != FaultKind::kCrash) return *err = "signal= applies only to crash", false;
  return true;
}

}  // namespace

bool ParseFaults(const char* spec, std::vector<Fault>* out, std::string* err) {
  out->clear();
  std::string s = spec ? spec : "";
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t semi = s.find(';', pos);
    std::string entry = Trim(s.substr(pos, semi == std::string::npos ? std::string::npos : semi - pos));
    pos = semi == std::string::npos ? s.size() + 1 : semi + 1;
    if (entry.empty()) continue;
    Fault f;
    if (!ParseOne(entry, &f, err)) {
      *err += " in '" + entry + "'";
      out->clear();
      return false;
    }
    out->push_back(f);
  }
  return true;
}

const std::vector<Fault>& ActiveFaults() {
  // Leaked on purpose: stream threads may still consult it while the process exits.
  static const std::vector<Fault>* faults = [] {
    auto* v = new std::vector<Fault>;
    std::string err;
    const char* spec = getenv("NCCLWATCH_SIM_FAULT");
    if (spec && !ParseFaults(spec, v, &err))
      fprintf(stderr, "ncclsim: NCCLWATCH_SIM_FAULT: %s; no fault injected\n", err.c_str());
    return v;
  }();
  return *faults;
}

const Fault* FindFault(FaultKind kind, int global_rank, int comm_index, uint64_t seq) {
  for (const Fault& f : ActiveFaults()) {
    if (f.kind == kind && f.rank == global_rank && f.seq == seq && (f.comm < 0 || f.comm == comm_index))
      return &f;
  }
  return nullptr;
}

}  // namespace simnccl
