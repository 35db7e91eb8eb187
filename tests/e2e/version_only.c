/* Calls ncclGetVersion only, then reports how many threads the process has and whether any
 * file appeared: a preloaded ncclwatch must start nothing in such a process. */
#include <dirent.h>
#include <stdio.h>

#include <nccl.h>

static int count_entries(const char* path) {
  DIR* d = opendir(path);
  if (!d) return -1;
  int n = 0;
  struct dirent* e;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}

int main(void) {
  int before = count_entries(".");
  int version = 0;
  ncclResult_t r = ncclGetVersion(&version);
  printf("version %d result %d threads %d new_files %d\n", version, (int)r, count_entries("/proc/self/task"),
         count_entries(".") - before);
  return r == ncclSuccess ? 0 : 1;
}
