#include "dump/store_evidence.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "dump/dump_files.h"
#include "format/file_name.h"

namespace ncclwatch {
namespace store {

namespace {

// zlib, opened at run time (the library and the command need only glibc): its three functions.
struct Zlib {
  int (*compress2)(unsigned char*, unsigned long*, const unsigned char*, unsigned long, int) = nullptr;
  unsigned long (*compressBound)(unsigned long) = nullptr;
  int (*uncompress)(unsigned char*, unsigned long*, const unsigned char*, unsigned long) = nullptr;
  bool ok() const { return compress2 && compressBound && uncompress; }
};

const Zlib& Z() {
  static Zlib z;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = dlopen("libz.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    z.compress2 = reinterpret_cast<decltype(z.compress2)>(dlsym(h, "compress2"));
    z.compressBound = reinterpret_cast<decltype(z.compressBound)>(dlsym(h, "compressBound"));
    z.uncompress = reinterpret_cast<decltype(z.uncompress)>(dlsym(h, "uncompress"));
  });
  return z;
}

constexpr const char* kZlibTag = "NWZ1 ";
constexpr const char* kRawTag = "NWR1 ";
constexpr size_t kMaxDumpText = 256u << 20;  // no dump is this large: a value claiming more is not one

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    if (nl > at) out.push_back(text.substr(at, nl - at));
    at = nl + 1;
  }
  return out;
}

}  // namespace

std::string JobPrefix(const std::string& run_id, const std::string& restart_count) {
  return "ncclwatch/" + (run_id.empty() ? std::string("none") : run_id) + "/" +
         (restart_count.empty() ? std::string("0") : restart_count) + "/";
}

bool EncodeDump(const std::string& text, std::string* value) {
  const Zlib& z = Z();
  const std::string size = std::to_string(text.size()) + "\n";
  if (!z.ok()) {
    *value = kRawTag + size + text;
    return true;
  }
  unsigned long bound = z.compressBound(text.size());
  std::string out(bound, '\0');
  if (z.compress2(reinterpret_cast<unsigned char*>(&out[0]), &bound, reinterpret_cast<const unsigned char*>(text.data()),
                  text.size(), 6) != 0)
    return false;
  out.resize(bound);
  *value = kZlibTag + size + out;
  return true;
}

bool DecodeDump(const std::string& value, std::string* text, std::string* why) {
  const bool zipped = value.compare(0, 5, kZlibTag) == 0;
  if (!zipped && value.compare(0, 5, kRawTag) != 0) {
    *why = "not a published dump";
    return false;
  }
  const size_t nl = value.find('\n');
  char* end = nullptr;
  const unsigned long long size = nl == std::string::npos ? 0 : strtoull(value.c_str() + 5, &end, 10);
  if (nl == std::string::npos || end != value.c_str() + nl || size > kMaxDumpText) {
    *why = "a published dump with a bad header";
    return false;
  }
  if (!zipped) {
    *text = value.substr(nl + 1);
    if (text->size() == size) return true;
    *why = "a published dump cut short";
    return false;
  }
  const Zlib& z = Z();
  if (!z.ok()) {
    *why = "a compressed dump, and no libz.so.1 here to read it";
    return false;
  }
  text->assign(size, '\0');
  unsigned long got = size;
  if (z.uncompress(reinterpret_cast<unsigned char*>(size ? &(*text)[0] : nullptr), &got,
                   reinterpret_cast<const unsigned char*>(value.data() + nl + 1), value.size() - nl - 1) != 0 ||
      got != size) {
    *why = "a published dump that does not decompress";
    return false;
  }
  return true;
}

bool FetchEvidence(Client* c, const std::string& prefix, const std::string& out_dir, const std::string& skip_host,
                   std::vector<HostEvidence>* hosts, std::string* why, int timeout_ms) {
  std::string value;
  bool found = false;
  if (!c->Get(prefix + "hosts", &value, &found, timeout_ms)) {
    *why = c->error();
    return false;
  }
  const long n = found ? strtol(value.c_str(), nullptr, 10) : 0;
  for (long i = 0; i < n && i < 100000; ++i) {
    std::string host;
    if (!c->Get(prefix + "host/" + std::to_string(i), &host, &found, timeout_ms)) {
      *why = c->error();
      return false;
    }
    if (!found || host.empty()) continue;  // a host that left (its slot deleted)
    HostEvidence h;
    h.host = host;
    std::string list;
    if (!c->Get(prefix + "files/" + host, &list, &found, timeout_ms)) {
      *why = c->error();
      return false;
    }
    for (const std::string& name : Lines(list)) {
      // Only a dump's own name: nothing the store says writes outside the directory.
      if (!trace::IsDumpFileName(name) || name.find('/') != std::string::npos) continue;
      if (host == skip_host) continue;
      if (out_dir.empty()) {
        h.files.push_back(name);
        continue;
      }
      const std::string path = out_dir + "/" + name;
      if (access(path.c_str(), F_OK) == 0) {  // fetched before (or the host's own copy)
        h.files.push_back(name);
        continue;
      }
      std::string published, text, problem;
      if (!c->Get(prefix + "dump/" + host + "/" + name, &published, &found, timeout_ms)) {
        *why = c->error();
        hosts->push_back(std::move(h));
        return false;
      }
      if (!found) continue;  // removed meanwhile (its process replaced it with a later dump)
      if (!DecodeDump(published, &text, &problem)) {
        h.problems.push_back(name + ": " + problem);
        continue;
      }
      int e = WriteFileNoReplace(path, text);
      if (e == 0 || e == EEXIST)
        h.files.push_back(name);
      else
        h.problems.push_back(name + ": cannot write " + path + ": " + strerror(e));
    }
    hosts->push_back(std::move(h));
  }
  return true;
}

bool PublishRequest(Client* c, const std::string& prefix, const std::string& request_text, std::string* why,
                    int timeout_ms) {
  int64_t n = 0;
  if (!c->Add(prefix + "req_seq", 1, &n, timeout_ms) || !c->Set(prefix + "req/" + std::to_string(n), request_text, timeout_ms)) {
    *why = c->error();
    return false;
  }
  return true;
}

bool FindLatestAttempt(Client* c, const std::string& run_id, int max_restarts, std::string* prefix, int timeout_ms) {
  for (int k = max_restarts; k >= 0; --k) {
    const std::string p = JobPrefix(run_id, std::to_string(k));
    bool exists = false;
    if (!c->Check(p + "hosts", &exists, timeout_ms)) return false;
    if (exists) {
      *prefix = p;
      return true;
    }
  }
  return false;
}

}  // namespace store
}  // namespace ncclwatch
