/* A seccomp filter that answers process_vm_readv with `action` (SECCOMP_RET_KILL_PROCESS,
 * SECCOMP_RET_TRAP, SECCOMP_RET_ERRNO | EPERM, ...) and allows everything else: what systemd's
 * SystemCallFilter=, sandboxes and container profiles do to ncclwatch's reads. C and C++; for the
 * tests only. 0 when installed (flags: SECCOMP_FILTER_FLAG_TSYNC for every thread). */
#ifndef NCCLWATCH_TESTS_REFUSE_PROCESS_VM_READV_H
#define NCCLWATCH_TESTS_REFUSE_PROCESS_VM_READV_H

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static inline int refuse_process_vm_readv(unsigned int action, unsigned int flags) {
#if defined(__x86_64__)
  const unsigned int arch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
  const unsigned int arch = AUDIT_ARCH_AARCH64;
#else
  const unsigned int arch = 0;
#endif
  struct sock_filter code[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, arch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_readv, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, action),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {(unsigned short)(sizeof code / sizeof code[0]), code};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
  return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, flags, &prog);
}

#endif
