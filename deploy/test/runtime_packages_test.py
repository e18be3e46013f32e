#!/usr/bin/env python3
"""deploy/image/runtime_packages.sh: the Debian packages a runtime image
installs, from ldd and from the SONAMEs a binary opens at run time (review-
deploy 2026-11-25 F1: cuBLAS is dlopen'ed since that morning, ldd no longer
listed it, and the CUDA image lost it; every session on such a pod failed).

Checks, against this machine's dpkg database (independent: dpkg-query names
the owner of each file):
  - /bin/ls alone, and with libz.so.1 named: the same packages plus zlib1g
    (dpkg-query -S of */libz.so.1);
  - a SONAME found nowhere: exit 1, naming it, nothing on stdout;
  - a SONAME not in ld.so.cache but beside a library the binary links (a
    tiny program with a RUNPATH to a temporary folder, when cc is there):
    found there (the error then names that path: dpkg owns no file in /tmp);
  - deploy/Dockerfile passes libcublas.so.<CUDA major> for the cuda VARIANT,
    the name kernels/cublas_library.cc opens.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

from checks import Checks

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(REPO, "deploy", "image", "runtime_packages.sh")


def run(*args):
    return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, timeout=60)


def main():
    c = Checks()
    ls = shutil.which("ls") or "/bin/ls"
    plain = run(ls)
    c.expect(plain.returncode == 0, "ls alone: exit 0", plain.stderr)
    with_z = run(ls, "libz.so.1")
    c.expect(with_z.returncode == 0, "ls + libz.so.1: exit 0", with_z.stderr)
    # dpkg's own answer for the file libz.so.1 (in any folder).
    owner = subprocess.run(["dpkg-query", "-S", "*/libz.so.1"], capture_output=True,
                           text=True).stdout
    want = owner.split(":")[0] if owner.count("\n") == 1 else ""
    c.expect(want != "", "dpkg owns libz.so.1 here", owner)
    got_plain = set(plain.stdout.split())
    got_z = set(with_z.stdout.split())
    c.expect(want not in got_plain and got_z == got_plain | {want},
             f"naming libz.so.1 adds exactly its package {want}", f"{got_plain} -> {got_z}")

    missing = run(ls, "libdrt-nothing.so.7")
    c.expect(missing.returncode == 1 and "libdrt-nothing.so.7" in missing.stderr
             and missing.stdout == "", "an unknown SONAME: exit 1, named", repr(missing))

    cc = shutil.which("cc")
    if cc is None:
        print("SKIPPED (no cc): the SONAME beside a linked library")
    else:
        with tempfile.TemporaryDirectory() as tmp:
            lib = os.path.join(tmp, "libdrtlinked.so")
            src = os.path.join(tmp, "x.c")
            with open(src, "w") as f:
                f.write("int drt_linked(void) { return 1; }\n")
            subprocess.run([cc, "-shared", "-fPIC", "-o", lib, src], check=True)
            with open(src, "w") as f:
                f.write("int drt_linked(void); int main(void) { return drt_linked() - 1; }\n")
            prog = os.path.join(tmp, "prog")
            subprocess.run([cc, "-o", prog, src, f"-L{tmp}", "-ldrtlinked",
                            f"-Wl,-rpath,{tmp}"], check=True)
            open(os.path.join(tmp, "libdrtopened.so.3"), "w").close()
            # Found, it fails later, on ownership (dpkg owns nothing in
            # /tmp, the linked library first); not found, it says so.
            beside = run(prog, "libdrtopened.so.3")
            c.expect(beside.returncode == 1 and "no Debian package owns" in beside.stderr
                     and "neither in" not in beside.stderr,
                     "a SONAME beside a linked library is found there", repr(beside))
            elsewhere = run(prog, "libdrtabsent.so.3")
            c.expect(elsewhere.returncode == 1 and "libdrtabsent.so.3 (opened at run time"
                     in elsewhere.stderr, "a SONAME beside nothing is not", repr(elsewhere))

    with open(os.path.join(REPO, "deploy", "Dockerfile")) as f:
        dockerfile = f.read()
    with open(os.path.join(REPO, "kernels", "cublas_library.cc")) as f:
        cublas = f.read()
    c.expect('"libcublas.so.", CUBLAS_VER_MAJOR' in cublas,
             "kernels/cublas_library.cc opens libcublas.so.<major>")
    c.expect(re.search(r'VARIANT\}" == cuda \]\]; then dlopened=\("libcublas\.so\.\$\{CUDA_VERSION%%-\*\}"\)',
                       dockerfile) is not None and
             re.search(r'runtime_packages\.sh /out/drt-server "\$\{dlopened\[@\]\}"', dockerfile)
             is not None,
             "the Dockerfile names libcublas.so.<CUDA major> to runtime_packages.sh for cuda")
    return c.summary()


if __name__ == "__main__":
    sys.exit(main())
