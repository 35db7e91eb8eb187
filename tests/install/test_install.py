#!/usr/bin/env python3
"""Installation tests: what `cmake --install` and `cpack -G DEB` produce, and that it works.

    test_install.py --build BUILD_DIR --source SOURCE_DIR --cmake CMAKE --cpack CPACK
                     --check-elf CHECK_ELF --version VERSION [--multiarch TRIPLET]
                     [--static-runtime] CASE

installed_run      installs the build into a temporary prefix, checks what is there (the
                   command, the library, the docs; nothing else), and runs a simulated job
                   (tools/sim, as tests/e2e's run_wrapper case does) through the INSTALLED
                   `ncclwatch run`: the installed library is preloaded, every rank dumps, the
                   verdict is printed.
without_libunwind  where libunwind.so.8 cannot be loaded, a job still gets its dumps and
                   verdict, without native frames (root only, for a private mount namespace;
                   skipped, exit 77, otherwise).
deb_package        `cpack -G DEB` gives two packages: ncclwatch, holding bin/ncclwatch and
                   lib/libncclwatch.so, stripped, named and versioned after the project,
                   depending on glibc only (and on a glibc at least as new as the files need);
                   ncclwatch-dbg, their debug info under /usr/lib/debug/.build-id by build id.
                   Skipped (exit 77) without dpkg-deb.
wheel              scripts/build-wheel.sh gives ncclwatch-<version>-py3-none-manylinux_2_34_<arch>.whl
                   (the tag the binaries need: glibc 2.34 at most, nothing else) with the debug
                   info beside it; installed with `pip install --no-index` into a fresh venv, a
                   simulated job runs through the venv's `ncclwatch` and `python -m ncclwatch`,
                   both preloading the wheel's library; the Python API analyzes the dumps and
                   asks a live job for a dump; uninstalling leaves nothing behind. Built and
                   installed with the Python build-wheel.sh finds (python3 on PATH, else
                   /usr/bin/python3: pyenv's and conda's often lack the build modules); skipped
                   (exit 77) only where no Python here has python3-build, -setuptools, -wheel
                   and -venv.
wheel_python       build-wheel.sh finds a Python that can build the wheel when python3 on PATH
                   cannot (pyenv, conda: no build module): the system's /usr/bin/python3, said
                   in one line; where none can, one line says what to install. Skipped (exit
                   77) where /usr/bin/python3 lacks the modules.
"""
import argparse
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ncclwatch_testing import (SKIP, catches, check, clean_env, read_text, run, run_cases, temp_dir,  # noqa: E402
                               wait_for_ranks)

A = None


def files_under(root):
    out = set()
    for d, _, names in os.walk(root):
        for n in names:
            out.add(os.path.relpath(os.path.join(d, n), root))
    return out


def frame_modules(node, modules=None):
    """The `module` of every native frame anywhere in a dump (trace format version 2: an
    index into the dump's top-level `modules`)."""
    if modules is None and isinstance(node, dict):
        modules = [m.get("path", "") for m in node.get("modules", [])]
    found = set()
    if isinstance(node, dict):
        if "ip" in node and isinstance(node.get("module"), str):
            found.add(node["module"])
        elif "ip" in node and isinstance(node.get("module"), int) and 0 <= node["module"] < len(modules or []):
            found.add(modules[node["module"]])
        for v in node.values():
            found |= frame_modules(v, modules)
    elif isinstance(node, list):
        for v in node:
            found |= frame_modules(v, modules)
    return found


def preloaded_by(ncclwatch, env=None):
    """What `ncclwatch run` puts in LD_PRELOAD when started from where it is. `ncclwatch`: its
    path, or a command line that runs it (`python -m ncclwatch`)."""
    command = [ncclwatch] if isinstance(ncclwatch, str) else list(ncclwatch)
    r = run(command + ["run", "--no-analyze", "--", "sh", "-c", 'echo "$LD_PRELOAD"'], env=env or clean_env())
    check(r.returncode == 0, f"{command} run: exit {r.returncode}: {r.stderr}")
    return r.stdout.strip()


def section_names(elf):
    r = run(["readelf", "-SW", elf])
    check(r.returncode == 0, f"readelf -S {elf}: {r.stderr}")
    return set(re.findall(r"\]\s+(\.\S+)", r.stdout))


def check_stripped_with_debug(elf, debug_root):
    """`elf` ships stripped but keeps its build id, and its debug info is the file
    `debug_root`/.build-id/xx/yyyy.debug (what /usr/lib/debug is to `analyze` and gdb).
    Returns the sizes of both."""
    sections = section_names(elf)
    check(".debug_info" not in sections and ".symtab" not in sections,
          f"{elf} is stripped: its sections are {sorted(sections)}")
    notes = run(["readelf", "-n", elf]).stdout
    m = re.search(r"Build ID: ([0-9a-f]+)", notes)
    check(m, f"{elf} keeps its build id:\n{notes}")
    build_id = m.group(1)
    debug = os.path.join(debug_root, ".build-id", build_id[:2], build_id[2:] + ".debug")
    check(os.path.isfile(debug), f"the debug info of {elf} is {debug}: {sorted(files_under(debug_root))}")
    check(".debug_info" in section_names(debug) and ".debug_line" in section_names(debug),
          f"{debug} holds debug info (and line tables): {sorted(section_names(debug))}")
    print(f"  {os.path.basename(elf)}: {os.path.getsize(elf)} bytes stripped, build id {build_id}, "
          f"debug info {os.path.getsize(debug)} bytes beside it")
    return os.path.getsize(elf), os.path.getsize(debug)


def installed_run():
    prefix = temp_dir("ncclwatch-install-")
    r = run([A.cmake, "--install", A.build, "--prefix", prefix])
    check(r.returncode == 0, f"cmake --install failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")

    # The command, the library in a lib dir, the docs: nothing else (no simulator, no tests,
    # no ncclwatch-gen).
    files = files_under(prefix)
    libs = sorted(f for f in files if os.path.basename(f) == "libncclwatch.so")
    check(len(libs) == 1 and libs[0].startswith("lib"), f"one libncclwatch.so in a lib dir: {libs}")
    lib = os.path.join(prefix, libs[0])
    docs = {"share/doc/ncclwatch/README.md"} | {
        "share/doc/ncclwatch/" + os.path.relpath(p, A.source)
        for pattern in ("*.md", "images/*.png", "images/*.svg") for p in glob.glob(os.path.join(A.source, "docs", pattern))}
    expected = {"bin/ncclwatch", libs[0]} | docs
    check(files == expected, f"installed exactly {sorted(expected)}\n  missing: {sorted(expected - files)}\n"
                             f"  unexpected: {sorted(files - expected)}")
    # Every relative link and image of the installed docs resolves where they are installed.
    doc_root = os.path.join(prefix, "share", "doc", "ncclwatch")
    for doc in sorted(d for d in docs if d.endswith(".md")):
        path = os.path.join(prefix, doc)
        for target in re.findall(r"\]\(([^)\s]+)\)", read_text(path)):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            where = os.path.normpath(os.path.join(os.path.dirname(path), target.split("#")[0]))
            if not where.startswith(doc_root) or not re.search(r"\.(md|png|svg|jpg)$", where):
                continue  # the source tree's files (lib/, include/): not documentation
            check(os.path.exists(where), f"{doc} links {target}, which is not installed ({where})")
    nw = os.path.join(prefix, "bin", "ncclwatch")
    check(os.access(nw, os.X_OK), f"{nw} is executable")
    print(f"  installed: {sorted(files)}")

    # Stripped; the debug info only on request (the dbg component), by build id.
    debug = temp_dir("ncclwatch-install-dbg-")
    r = run([A.cmake, "--install", A.build, "--prefix", debug, "--component", "dbg"])
    check(r.returncode == 0, f"cmake --install --component dbg failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    for f in (nw, lib):
        check_stripped_with_debug(f, os.path.join(debug, "lib", "debug"))
    shutil.rmtree(debug)

    # The installed command finds the installed library, not the build tree's.
    check(preloaded_by(nw) == os.path.realpath(lib), f"the installed library is preloaded: {preloaded_by(nw)!r}")

    # Other layouts of a prefix: GNUInstallDirs' multiarch lib dir, lib64.
    for libdir in ([f"lib/{A.multiarch}"] if A.multiarch else []) + ["lib64"]:
        other = temp_dir("ncclwatch-layout-")
        os.makedirs(os.path.join(other, "bin"))
        os.makedirs(os.path.join(other, libdir))
        shutil.copy2(nw, os.path.join(other, "bin", "ncclwatch"))
        shutil.copy2(lib, os.path.join(other, libdir, "libncclwatch.so"))
        got = preloaded_by(os.path.join(other, "bin", "ncclwatch"))
        check(got == os.path.realpath(os.path.join(other, libdir, "libncclwatch.so")), f"found in {libdir}: {got!r}")
        shutil.rmtree(other)

    # A simulated job through the installed command.
    tmp = temp_dir("ncclwatch-install-job-")
    dumps, stderr = hang_job(nw, tmp)
    check("libunwind" not in stderr, f"no line about libunwind where it is there:\n{stderr[-3000:]}")
    # Native stacks in the dumps name frames of the installed library (its watchdog thread):
    # the installed library ran, and libunwind, which it opens at run time, unwound.
    modules = frame_modules(dumps)
    check(os.path.realpath(lib) in modules, f"a native frame in {lib}; frames name {sorted(modules)}")
    shutil.rmtree(prefix)
    shutil.rmtree(tmp)


def hang_job(ncclwatch, tmp, wrap=(), env=None):
    """Runs, through `ncclwatch run`, a simulated job (tools/sim, as tests/e2e's run_wrapper case
    does) in which rank 1 stops calling NCCL while rank 0 waits. Every rank must dump (the
    library is in both) and the command must print the verdict. Returns the dumps and the
    job's stderr (and the dumps are in `tmp`/dumps)."""
    dumps = os.path.join(tmp, "dumps")
    r = run(list(wrap) + [ncclwatch, "run", "--dir", dumps, "--timeout", "3", "--set", "PEER_POLL_MS=200", "--",
                          os.path.join(A.build, "bin", "simlaunch"), "-n", "2", "--timeout", "8", "--",
                          os.path.join(A.build, "bin", "sim_workload"), "--iters", "20", "--busy-rank", "1",
                          "--busy-at", "4", "--busy-ms", "-1"], env=env or clean_env(), cwd=tmp, timeout=120)
    check(r.returncode == 124, f"the launcher's timeout status is kept ({r.returncode}):\n{r.stderr[-3000:]}")
    out = []
    for p in sorted(glob.glob(os.path.join(dumps, "rank*.json"))):
        with open(p) as f:
            out.append(json.load(f))
    ranks = sorted({d["summary"]["rank"] for d in out})
    check(ranks == [0, 1], f"both ranks dumped: ranks {ranks}\n{r.stderr[-3000:]}")
    check("rank_missing" in r.stdout and "rank 1" in r.stdout, f"the verdict is printed:\n{r.stdout[-3000:]}")
    print(f"  job: exit {r.returncode}, {len(out)} dumps from ranks {ranks}, verdict rank_missing for rank 1")
    return out, r.stderr


def without_libunwind():
    """The library opens libunwind at run time: where there is none, a job still gets its
    dumps and verdict, with no native frames. libunwind.so.8 is hidden by mounting /dev/null
    over it in a private mount namespace (root only: skipped otherwise)."""
    if not A.static_runtime:
        print("SKIP: libncclwatch.so links libunwind in this build (NCCLWATCH_STATIC_RUNTIME off)")
        return SKIP
    cache = run(["ldconfig", "-p"]).stdout if shutil.which("ldconfig") else ""
    found = re.findall(r"libunwind\.so\.8 \(([^)]*)\) => (\S+)", cache)
    paths = sorted({os.path.realpath(p) for _, p in found})
    check(paths, f"libunwind.so.8 in the loader's cache (a build dependency):\n{cache[:2000]}")
    hide = " && ".join(f"mount --bind /dev/null {p}" for p in paths)
    probe = run(["unshare", "-m", "sh", "-c", hide]) if shutil.which("unshare") else None
    if probe is None or probe.returncode != 0:
        print(f"SKIP: cannot hide libunwind.so.8 (needs root and unshare): {probe.stderr.strip() if probe else ''}")
        return SKIP
    tmp = temp_dir("ncclwatch-nounwind-")
    script = hide + ' && exec "$@"'
    dumps, stderr = hang_job(os.path.join(A.build, "bin", "ncclwatch"), tmp,
                             wrap=["unshare", "-m", "sh", "-c", script, "sh"])
    check(not frame_modules(dumps), f"no native frames without libunwind: {sorted(frame_modules(dumps))}")
    # Said once per process at start, so that missing native frames are not a mystery.
    said = [line for line in stderr.splitlines() if "libunwind.so.8 is not usable" in line]
    check(len(said) == 2, f"one line about libunwind per rank (2 ranks), {len(said)} found:\n{stderr[-3000:]}")
    shutil.rmtree(tmp)


def deb_fields(deb, *names):
    fields = {}
    for field in names:
        r = run(["dpkg-deb", "-f", deb, field])
        fields[field] = r.stdout.strip()
        print(f"  {field}: {fields[field].splitlines()[0] if fields[field] else ''}")
    return fields


def deb_package():
    if not shutil.which("dpkg-deb"):
        print("SKIP: dpkg-deb not found (not a Debian-based system): the package cannot be read")
        return SKIP
    out = temp_dir("ncclwatch-deb-")
    r = run([A.cpack, "-G", "DEB", "--config", os.path.join(A.build, "CPackConfig.cmake"), "-B", out], cwd=out)
    check(r.returncode == 0, f"cpack failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    debs = sorted(glob.glob(os.path.join(out, "*.deb")))
    names = [os.path.basename(d) for d in debs]
    arch = run(["dpkg", "--print-architecture"]).stdout.strip() if shutil.which("dpkg") else "amd64"
    check(names == [f"ncclwatch-dbg_{A.version}_{arch}.deb", f"ncclwatch_{A.version}_{arch}.deb"],
          f"the package and its debug package in {out}: {os.listdir(out)}")
    dbg, deb = debs
    for d in debs:
        print(f"  {os.path.basename(d)}: {os.path.getsize(d)} bytes")

    listing = run(["dpkg-deb", "-c", deb])
    check(listing.returncode == 0, f"dpkg-deb -c: {listing.stderr}")
    paths = [line.split()[-1] for line in listing.stdout.splitlines() if line.strip()]
    check("./usr/bin/ncclwatch" in paths, f"bin/ncclwatch in the package:\n{listing.stdout}")
    check(any(re.fullmatch(r"\./usr/lib(/[^/]+)?/libncclwatch\.so", p) for p in paths),
          f"lib/libncclwatch.so in the package:\n{listing.stdout}")
    for name in ("libnccl.so.2", "libcuda.so.1", "simlaunch", "sim_workload", "ncclwatch-gen"):
        check(not any(p.endswith("/" + name) for p in paths), f"{name} is not in the package")
    check(not any("/usr/lib/debug" in p for p in paths), "no debug info in the package (in ncclwatch-dbg)")

    fields = deb_fields(deb, "Package", "Version", "Maintainer", "Depends", "Description", "Installed-Size")
    check(fields["Package"] == "ncclwatch", f"package name: {fields['Package']!r}")
    check(fields["Version"] == A.version, f"version {A.version} from project(): {fields['Version']!r}")
    check(re.fullmatch(r".+ <.+@.+>", fields["Maintainer"]), f"a maintainer: {fields['Maintainer']!r}")
    # Debian's form: a summary line (said once), then the long description, each line indented.
    summary, *body = fields["Description"].splitlines()
    check(summary and len(summary) <= 80 and body and all(line.startswith(" ") for line in body)
          and summary.strip() not in "\n".join(body) and "`" not in fields["Description"],
          f"a summary and a long description:\n{fields['Description']}")
    deps = [d.strip() for d in fields["Depends"].split(",") if d.strip()]
    check(deps, "a Depends field")

    dbg_fields = deb_fields(dbg, "Package", "Version", "Depends", "Section", "Description", "Installed-Size")
    check(dbg_fields["Package"] == "ncclwatch-dbg" and dbg_fields["Version"] == A.version,
          f"ncclwatch-dbg {A.version}: {dbg_fields}")
    check(dbg_fields["Depends"] == f"ncclwatch (= {A.version})", f"for exactly this build: {dbg_fields['Depends']!r}")
    check(dbg_fields["Description"].splitlines()[0] != summary, "its own summary")

    # The package's binaries are stripped; the debug package has their debug info by build id,
    # where `analyze` looks (tests/analyzer: test_symbolize_debug).
    root = os.path.join(out, "root")
    for d in debs:
        r = run(["dpkg-deb", "-x", d, root])
        check(r.returncode == 0, f"dpkg-deb -x: {r.stderr}")
    binaries = sorted(f for f in files_under(root) if f.endswith("libncclwatch.so") or f.endswith("bin/ncclwatch"))
    check(len(binaries) == 2, f"the command and the library: {binaries}")
    for f in binaries:
        check_stripped_with_debug(os.path.join(root, f), os.path.join(root, "usr", "lib", "debug"))

    if A.static_runtime:
        check(all(d.split()[0] == "libc6" for d in deps), f"depends on libc6 only: {fields['Depends']!r}")
        floor = [tuple(map(int, m)) for d in deps for m in re.findall(r"libc6 \(>= (\d+)\.(\d+)", d)]
        check(floor, f"a minimum libc6 version: {fields['Depends']!r}")
        # The files need no newer glibc than the package asks for.
        for f in binaries:
            need = glibc_needed(os.path.join(root, f))
            check(need <= max(floor), f"{f} needs glibc {need}, the package asks for {max(floor)}")
            print(f"  {f}: needs glibc {need[0]}.{need[1]}")
    shutil.rmtree(out)


def glibc_needed(elf):
    """The highest glibc version `elf` needs, checking that it needs nothing but glibc."""
    r = run([A.check_elf, "--only-glibc", elf])
    check(r.returncode == 0, f"{elf} needs only glibc:\n{r.stdout}")
    m = re.search(r"highest glibc version needed: GLIBC_(\d+)\.(\d+)", r.stdout)
    check(m, f"{elf}: no glibc version found:\n{r.stdout}")
    return int(m.group(1)), int(m.group(2))


# Run by the venv's Python: the API on the hang job's dumps, and its errors.
API_SCRIPT = r"""
import glob, json, os, sys
import ncclwatch

dumps, empty = sys.argv[1], sys.argv[2]
out = {"library": ncclwatch.library_path(), "version": ncclwatch.__version__}
report = ncclwatch.analyze(dumps, no_slow_ranks=True, verbose=False)
out["verdicts"] = [[v["cause"], v["culprit_ranks"]] for v in report["verdicts"]]
dump = ncclwatch.load_dump(sorted(glob.glob(os.path.join(dumps, "rank*.json")))[0])
out["dump_rank"] = dump["summary"]["rank"]
out["errors"] = {}
for name, call in (("analyze", lambda: ncclwatch.analyze(os.path.join(dumps, "nope"))),
                   ("option", lambda: ncclwatch.analyze(dumps, attempt=0)),
                   ("load_dump", lambda: ncclwatch.load_dump(os.path.join(dumps, "nope.json"))),
                   ("request_dump", lambda: ncclwatch.request_dump(empty, wait=0.5))):
    try:
        call()
        out["errors"][name] = None
    except ncclwatch.NcclwatchError as e:
        out["errors"][name] = [str(e), e.returncode]
print(json.dumps(out))
"""


def wheel():
    # The Python build-wheel.sh builds with (python3 on PATH, else the system's where pyenv's or
    # conda's lacks the build modules) also makes the venv: the test runs whichever python3 runs it.
    env = clean_env()
    env.pop("PYTHON", None)
    r = run([os.path.join(A.source, "scripts", "build-wheel.sh"), "--which-python"], env=env)
    if r.returncode != 0:
        print(f"SKIP: {r.stderr.strip()}")
        return SKIP
    py = r.stdout.strip()
    print(f"  {r.stderr.strip()}")
    if run([py, "-c", "import ensurepip"]).returncode != 0:
        print(f"SKIP: {py} cannot make a venv (no ensurepip): install python3-venv (scripts/install-deps.sh)")
        return SKIP
    timings = {}
    started = time.monotonic()

    def lap(what):
        nonlocal started
        timings[what] = time.monotonic() - started
        started = time.monotonic()

    out = temp_dir("ncclwatch-wheel-")
    dist = os.path.join(out, "dist")
    r = run([os.path.join(A.source, "scripts", "build-wheel.sh"), dist, A.build], env=dict(env, PYTHON=py))
    check(r.returncode == 0, f"build-wheel.sh failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    lap("build-wheel.sh")
    wheels = glob.glob(os.path.join(dist, f"ncclwatch-{A.version}-py3-none-manylinux_*.whl"))
    debug_tar = os.path.join(dist, f"ncclwatch-{A.version}-debug.tar.gz")
    check(len(wheels) == 1 and sorted(os.listdir(dist)) == sorted(os.path.basename(f) for f in wheels + [debug_tar]),
          f"the wheel and its debug info: {os.listdir(dist)}\n{r.stdout[-2000:]}")
    whl = wheels[0]
    print(f"  {os.path.basename(whl)}: {os.path.getsize(whl)} bytes; {os.path.basename(debug_tar)}: "
          f"{os.path.getsize(debug_tar)} bytes")

    # What the wheel holds: the package with the stripped command (executable) and library, and
    # its metadata: impure, tagged py3-none-<platform>, the README as its description.
    unpacked = os.path.join(out, "unpacked")
    with zipfile.ZipFile(whl) as z:
        infos = {i.filename: i for i in z.infolist()}
        z.extractall(unpacked)
    info_dir = f"ncclwatch-{A.version}.dist-info/"
    package = {n for n in infos if not n.startswith(info_dir)}
    expected = {"ncclwatch/" + n for n in ("__init__.py", "__main__.py", "_version.py", "py.typed",
                                           "bin/ncclwatch", "lib/libncclwatch.so")}
    check(package == expected, f"the wheel holds {sorted(expected)}: {sorted(package)}")
    check({info_dir + n for n in ("METADATA", "WHEEL", "RECORD", "entry_points.txt")} <= set(infos),
          f"its metadata: {sorted(infos)}")
    check(infos["ncclwatch/bin/ncclwatch"].external_attr >> 16 & 0o111, "the command is executable in the wheel")
    with open(os.path.join(unpacked, info_dir + "WHEEL")) as f:
        wheel_info = f.read()
    check("Root-Is-Purelib: false" in wheel_info, f"impure (platlib):\n{wheel_info}")
    with open(os.path.join(unpacked, info_dir + "METADATA")) as f:
        metadata = f.read()
    with open(os.path.join(A.source, "README.md")) as f:
        readme = f.read()
    check(f"\nVersion: {A.version}\n" in metadata and "Description-Content-Type: text/markdown" in metadata
          and readme.strip() in metadata, f"version {A.version} and the README as description:\n{metadata[:1500]}")
    with open(os.path.join(unpacked, info_dir + "entry_points.txt")) as f:
        check("ncclwatch = ncclwatch.__main__:main" in f.read(), "the ncclwatch script")

    # Its binaries are stripped with their debug info beside the wheel, and need only glibc, 2.34
    # at most; its tag says the version they need.
    debug_root = os.path.join(out, "debug")
    os.makedirs(debug_root)
    r = run(["tar", "-C", debug_root, "-xzf", debug_tar])
    check(r.returncode == 0, f"tar -xzf {debug_tar}: {r.stderr}")
    needs = []
    for f in sorted(expected):
        if "/bin/" in f or "/lib/" in f:
            elf = os.path.join(unpacked, f)
            check_stripped_with_debug(elf, os.path.join(debug_root, "usr", "lib", "debug"))
            needs.append(glibc_needed(elf))
            check(needs[-1] <= (2, 34), f"{f} needs glibc 2.34 at most: it needs {needs[-1]}")
    tag = "py3-none-manylinux_{}_{}_{}".format(*max(needs), os.uname().machine)
    check(os.path.basename(whl) == f"ncclwatch-{A.version}-{tag}.whl" and f"Tag: {tag}\n" in wheel_info,
          f"the tag is {tag}, what the binaries need: {os.path.basename(whl)}\n{wheel_info}")
    print(f"  the binaries need glibc {max(needs)[0]}.{max(needs)[1]}: {tag}")
    lap("checking the wheel")

    # A fresh venv, the wheel installed without an index.
    venv = os.path.join(out, "venv")
    r = run([py, "-m", "venv", venv])
    check(r.returncode == 0, f"python3 -m venv: {r.stderr[-2000:]}")
    vpy = os.path.join(venv, "bin", "python")
    pip = [vpy, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    pip_env = clean_env(PIP_CONFIG_FILE=os.devnull)
    run(pip + ["list"], env=pip_env)  # pip's own first run, before what is in the venv is noted
    before = files_under(venv)
    lap("python3 -m venv")
    r = run(pip + ["install", "--no-index", whl], env=pip_env)
    check(r.returncode == 0, f"pip install --no-index: {r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    lap("pip install --no-index")

    r = run([vpy, "-c", "import ncclwatch; print(ncclwatch.library_path())"], env=clean_env())
    lib = r.stdout.strip()
    check(r.returncode == 0 and lib.startswith(venv + os.sep) and os.path.isfile(lib),
          f"library_path() is the wheel's library in the venv: {lib!r} {r.stderr}")
    on_path = clean_env(PATH=os.path.join(venv, "bin") + os.pathsep + os.environ.get("PATH", ""))
    check(shutil.which("ncclwatch", path=on_path["PATH"]) == os.path.join(venv, "bin", "ncclwatch"),
          "ncclwatch is on the venv's PATH")
    for command, env in ((["ncclwatch"], on_path), ([vpy, "-m", "ncclwatch"], clean_env())):
        r = run(command + ["--version"], env=env)
        check(r.returncode == 0 and r.stdout.startswith(f"ncclwatch {A.version} "), f"{command} --version: {r.stdout}")
        # The command's own help, byte for byte.
        check(run(command + ["help"], env=env).stdout == run([os.path.join(A.build, "bin", "ncclwatch"), "help"]).stdout,
              f"{command} help is the command's")
        check(preloaded_by(command, env) == os.path.realpath(lib), f"{command} run preloads {lib}")

    # A simulated job through each; native frames in the dumps are the wheel's library's.
    jobs = {}
    for name, ncclwatch, wrap in (("ncclwatch run", "ncclwatch", ()), ("python -m ncclwatch run", "ncclwatch", (vpy, "-m"))):
        jobs[name] = temp_dir("ncclwatch-wheel-job-")
        dumps, _ = hang_job(ncclwatch, jobs[name], wrap=wrap, env=on_path)
        modules = frame_modules(dumps)
        check(os.path.realpath(lib) in modules, f"{name}: a native frame in {lib}: {sorted(modules)}")
        lap(f"job through {name}")

    # The Python API on those dumps, and its errors: the command's one line, as exceptions.
    empty = temp_dir("ncclwatch-wheel-empty-")
    r = run([vpy, "-c", API_SCRIPT, os.path.join(jobs["python -m ncclwatch run"], "dumps"), empty], env=clean_env())
    check(r.returncode == 0, f"the API script: {r.stderr[-3000:]}")
    api = json.loads(r.stdout)
    check(api["library"] == lib and api["version"] == A.version, f"library_path(), __version__: {api}")
    check(api["verdicts"] and api["verdicts"][0] == ["rank_missing", [1]],
          f"analyze(): rank_missing rank 1: {api['verdicts']}")
    check(api["dump_rank"] in (0, 1), f"load_dump(): a rank's dump: {api['dump_rank']}")
    for name, error in api["errors"].items():
        check(error and error[1] == 2 and error[0].startswith("ncclwatch") and "\n" not in error[0],
              f"{name}: NcclwatchError with the command's one line and exit status 2: {error}")
    check("nope" in api["errors"]["analyze"][0] and "nope.json" in api["errors"]["load_dump"][0]
          and "--attempt" in api["errors"]["option"][0], f"each says what was wrong: {api['errors']}")
    print(f"  API: analyze -> {api['verdicts'][0]}; errors: {[e[0] for e in api['errors'].values()]}")

    # request_dump() on a running healthy job started with plain LD_PRELOAD=library_path().
    live = temp_dir("ncclwatch-wheel-live-")
    job = subprocess.Popen([os.path.join(A.build, "bin", "simlaunch"), "-n", "2", "--timeout", "30", "--quiet", "--",
                            os.path.join(A.build, "bin", "sim_workload"), "--iters", "100000000"],
                           env=clean_env(LD_PRELOAD=lib, NCCLWATCH_DIR=live, NCCLWATCH_TIMEOUT="600",
                                         NCCLWATCH_PEER_POLL_MS="200"),
                           cwd=live, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_ranks(job, 2, lambda pid: catches(pid, signal.SIGTERM), "catching SIGTERM")
        r = run([vpy, "-c", "import json, sys, ncclwatch; print(json.dumps(ncclwatch.request_dump(sys.argv[1], wait=10)))",
                 live], env=clean_env())
        alive = job.poll() is None
    finally:
        job.terminate()
        job.wait(timeout=30)
    check(r.returncode == 0 and alive, f"request_dump() while the job goes on: {r.stderr[-2000:]}")
    check(json.loads(r.stdout)["verdicts"][0]["cause"] == "no_hang", f"a healthy job reads no_hang: {r.stdout[:1500]}")
    lap("request_dump() on a live job")

    # Uninstalled, nothing of it is left in the venv.
    r = run(pip + ["uninstall", "-y", "ncclwatch"], env=pip_env)
    check(r.returncode == 0, f"pip uninstall: {r.stderr[-2000:]}")
    lap("pip uninstall")
    after = files_under(venv)
    left = sorted(after - before) + sorted(
        os.path.relpath(os.path.join(d, n), venv) for d, dirs, _ in os.walk(venv) for n in dirs if "ncclwatch" in n)
    check(not left, f"pip uninstall leaves nothing behind: {left}")
    print("  timings: " + ", ".join(f"{what} {s:.1f} s" for what, s in timings.items()))
    shutil.rmtree(out)


def wheel_python():
    tools = "import build, setuptools, wheel"
    system = "/usr/bin/python3"
    if run([system, "-c", tools]).returncode != 0:
        print(f"SKIP: {system} cannot import build, setuptools and wheel (scripts/install-deps.sh)")
        return SKIP
    script = os.path.join(A.source, "scripts", "build-wheel.sh")
    tmp = temp_dir("ncclwatch-wheel-python-")
    # python3 on PATH without the packaging modules, as pyenv's or conda's often is.
    fake = os.path.join(tmp, "python3")
    with open(fake, "w") as f:
        f.write("#!/bin/sh\necho 'No module named build' >&2\nexit 1\n")
    os.chmod(fake, 0o755)
    env = clean_env(PATH=tmp + os.pathsep + os.environ.get("PATH", ""))
    env.pop("PYTHON", None)
    r = run([script, "--which-python"], env=env)
    lines = r.stderr.strip().splitlines()
    check(r.returncode == 0 and len(lines) == 1 and f"building with {system}" in lines[0] and fake in lines[0],
          f"the system's Python is found past a python3 without the build module, said in one line:\n{r.stderr}")
    # None that can build: one line that says what to install, and a failure.
    r = run([script, "--which-python"], env=dict(env, PYTHON=fake))
    lines = r.stderr.strip().splitlines()
    check(r.returncode != 0 and len(lines) == 1 and "python3-build" in lines[0] and fake in lines[0],
          f"no Python that can build: one line naming what to install:\n{r.stderr}")
    shutil.rmtree(tmp)


CASES = {"installed_run": installed_run, "deb_package": deb_package, "without_libunwind": without_libunwind,
         "wheel": wheel, "wheel_python": wheel_python}


def main():
    global A
    p = argparse.ArgumentParser()
    for opt in ("--build", "--source", "--cmake", "--cpack", "--check-elf", "--version"):
        p.add_argument(opt, required=True)
    p.add_argument("--multiarch", default="")
    p.add_argument("--static-runtime", action="store_true")
    p.add_argument("case", choices=sorted(CASES))
    A = p.parse_args()
    return run_cases(CASES, [A.case])


if __name__ == "__main__":
    sys.exit(main())
