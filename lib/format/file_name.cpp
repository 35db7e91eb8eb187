#include "format/file_name.h"

#include <dirent.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace ncclwatch {
namespace trace {

std::string SafeHostName(const std::string& host) {
  std::string safe;
  for (char c : host) safe += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_') ? c : '_';
  return safe;
}

std::string DumpFileStem(int rank, const std::string& host, int64_t pid, int64_t dump_seq,
                         const std::string& reason) {
  std::string name = kDumpFilePrefix;
  char r[16];
  if (rank >= 0) std::snprintf(r, sizeof r, "%05d", rank);
  else std::snprintf(r, sizeof r, "x");
  name += r;
  name += '-';
  name += SafeHostName(host);
  name += '-' + std::to_string(pid) + '-' + std::to_string(dump_seq) + '-';
  for (char c : reason) name += std::isalnum(static_cast<unsigned char>(c)) || c == '_' ? c : '_';
  return name;
}

std::string DumpFileName(int rank, const std::string& host, int64_t pid, int64_t dump_seq,
                         const std::string& reason) {
  return DumpFileStem(rank, host, pid, dump_seq, reason) + kDumpFileSuffix;
}

bool IsDumpFileName(const std::string& name) {
  size_t p = std::strlen(kDumpFilePrefix), s = std::strlen(kDumpFileSuffix);
  return name.size() > p + s && name.compare(0, p, kDumpFilePrefix) == 0 &&
         name.compare(name.size() - s, s, kDumpFileSuffix) == 0 && name != kDumpRequestFile;
}

bool ListDumpFiles(const std::string& dir, std::vector<std::string>* names, std::string* error,
                   std::vector<uint64_t>* inodes) {
  DIR* d = opendir(dir.c_str());
  if (!d) {
    *error = dir + ": " + std::strerror(errno);
    return false;
  }
  std::vector<std::pair<std::string, uint64_t>> found;
  while (dirent* e = readdir(d))
    if (IsDumpFileName(e->d_name)) found.emplace_back(e->d_name, static_cast<uint64_t>(e->d_ino));
  closedir(d);
  std::sort(found.begin(), found.end());
  for (auto& f : found) {
    names->push_back(std::move(f.first));
    if (inodes) inodes->push_back(f.second);
  }
  return true;
}

int RankFromFileName(const std::string& name) {
  size_t i = std::strlen(kDumpFilePrefix);
  if (name.compare(0, i, kDumpFilePrefix) != 0) return -1;
  int rank = 0;
  size_t digits = 0;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && digits < 9; ++i, ++digits)
    rank = rank * 10 + (name[i] - '0');
  return digits > 0 && i < name.size() && name[i] == '-' ? rank : -1;
}

}  // namespace trace
}  // namespace ncclwatch
