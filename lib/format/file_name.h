// The file-naming rule of dumps, in one place for the writer and the readers:
//   rank<R>-<host>-<pid>-<dump_seq>-<reason>.json
// R zero-padded to 5 digits, "x" when unknown; the host with anything but [A-Za-z0-9._]
// replaced by '_'. Names sort by rank. Readers select files by the prefix and suffix.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ncclwatch {
namespace trace {

constexpr const char* kDumpFilePrefix = "rank";
constexpr const char* kDumpFileSuffix = ".json";
// The job-wide dump request marker in the dump directory (docs/trace-format.md).
constexpr const char* kDumpRequestFile = "dump-request.json";

// The host as file names carry it: anything but [A-Za-z0-9._] replaced by '_'.
std::string SafeHostName(const std::string& host);
// "rank00003-host-1234-0-stall" (no suffix: the writer adds it to its temporary name too).
std::string DumpFileStem(int rank, const std::string& host, int64_t pid, int64_t dump_seq, const std::string& reason);
// The stem plus kDumpFileSuffix.
std::string DumpFileName(int rank, const std::string& host, int64_t pid, int64_t dump_seq, const std::string& reason);
// Whether a directory entry is a dump by its name.
bool IsDumpFileName(const std::string& name);
// The dump files of `dir` by name, sorted. False (with *error) when `dir` cannot be listed.
// `inodes`, when given, gets each file's inode number from the listing (no stat): a name whose
// inode is unchanged is the same file, since dumps are renamed into place complete.
bool ListDumpFiles(const std::string& dir, std::vector<std::string>* names, std::string* error,
                   std::vector<uint64_t>* inodes = nullptr);
// The global rank a dump file name claims, or -1.
int RankFromFileName(const std::string& name);

}  // namespace trace
}  // namespace ncclwatch
