#!/usr/bin/env python3
"""Checks that deploy/Dockerfile's build stage copies every source folder the
build it runs needs, so that `docker build` does not fail at `cmake -S .`
(review-tools 2026-11-24 #1: cli/ and tools/ were added to CMakeLists.txt
after the Dockerfile was written, and the image stopped configuring).

Two checks, both read from the files themselves, not restated here:

  static (always, well under a second):
    - every add_subdirectory(X) of the top CMakeLists.txt that the image's
      configure reaches (all of them except those inside if(DRT_BUILD_TESTS),
      which the Dockerfile turns off; kernels/ is inside if(DRT_HAVE_CUDA)
      and the cuda VARIANT reaches it, so it counts) is copied to the same
      path under the build stage's WORKDIR;
    - every #include "X/..." in a copied source file whose X is a top-level
      folder of the repository is copied too (a configure would not notice a
      missing header; the compile would);
    - every COPY source of either stage (build context paths) exists.

  --configure (also in the default suite; about 25 s of mostly waiting on a
  loaded 2-core machine, ~2 s of CPU): copies exactly the build stage's COPY
  set into a temporary folder and runs the image's own configure
  (`cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DDRT_BUILD_TESTS=OFF
  -DDRT_ENABLE_CUDA=OFF`, the cpu VARIANT) there, configure only. Exits 77
  (ctest: skipped) when no cmake is on PATH.

    dockerfile_copy_test.py [--configure]
"""
import argparse
import os
import posixpath
import re
import shutil
import subprocess
import sys
import tempfile

from checks import Checks

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DOCKERFILE = os.path.join(REPO, "deploy", "Dockerfile")
SOURCE_SUFFIXES = (".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh", ".proto")


def read(path):
    with open(os.path.join(REPO, path)) as f:
        return f.read()


def dockerfile_instructions(text):
    """(keyword, argument text) per instruction, continuation lines joined,
    comments dropped."""
    joined = []
    current = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        joined.append(current)
        current = ""
    out = []
    for instruction in joined:
        keyword, _, rest = instruction.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    return out


def stages(instructions):
    """{stage name: [(keyword, argument)]} in Dockerfile order."""
    result = {}
    name = None
    for keyword, rest in instructions:
        if keyword == "FROM":
            match = re.search(r"\bAS\s+(\S+)", rest, re.I)
            name = match.group(1) if match else f"stage{len(result)}"
            result[name] = []
        elif name is not None:
            result[name].append((keyword, rest))
    return result


def copy_mappings(stage):
    """[(context source, absolute destination)] of the stage's COPYs that read
    the build context (no --from), resolved against WORKDIR."""
    workdir = "/"
    copies = []
    for keyword, rest in stage:
        if keyword == "WORKDIR":
            workdir = posixpath.join(workdir, rest)
        elif keyword == "COPY":
            words = rest.split()
            if any(w.startswith("--from") for w in words):
                continue
            words = [w for w in words if not w.startswith("--")]
            *sources, dest = words
            absolute = posixpath.normpath(posixpath.join(workdir, dest))
            for source in sources:
                target = absolute
                if dest.endswith("/") or len(sources) > 1:
                    target = posixpath.join(absolute, posixpath.basename(source.rstrip("/")))
                copies.append((posixpath.normpath(source), target))
    return workdir, copies


def in_place_copies(workdir, copies):
    """Context paths that land at the same relative path under WORKDIR."""
    return {source for source, target in copies
            if target == posixpath.normpath(posixpath.join(workdir, source))}


def covered(path, copied):
    return any(path == c or path.startswith(c + "/") for c in copied)


def reached_subdirectories(cmake_text):
    """add_subdirectory(X) of the top CMakeLists.txt outside if(DRT_BUILD_TESTS)."""
    reached = []
    blocks = []  # condition of each open if()
    for line in cmake_text.splitlines():
        code = line.split("#", 1)[0].strip()
        match = re.match(r"if\s*\((.*)\)\s*$", code, re.I)
        if match:
            blocks.append(match.group(1).strip())
            continue
        if re.match(r"endif\s*\(", code, re.I):
            blocks.pop()
            continue
        match = re.match(r"add_subdirectory\s*\(\s*([^\s)]+)", code, re.I)
        if match and "DRT_BUILD_TESTS" not in blocks:
            reached.append(posixpath.normpath(match.group(1)))
    return reached


def included_top_folders(copied):
    """{(top folder, including file)} for quoted includes that name a
    top-level folder of the repository."""
    top_folders = {e for e in os.listdir(REPO) if os.path.isdir(os.path.join(REPO, e))}
    found = set()
    for folder in sorted(c for c in copied if os.path.isdir(os.path.join(REPO, c))):
        for root, _, files in os.walk(os.path.join(REPO, folder)):
            for name in files:
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.join(root, name)
                with open(path, errors="replace") as f:
                    text = f.read()
                pattern = r'^\s*(?:#\s*include\s+"|import\s+")([^"/]+)/'
                for top in re.findall(pattern, text, re.M):
                    if top in top_folders:
                        found.add((top, os.path.relpath(path, REPO)))
    return found


def configure_copied_set(c, copied):
    cmake = shutil.which("cmake")
    if cmake is None:
        print("cmake not on PATH: cannot run the configure check")
        return 77
    with tempfile.TemporaryDirectory(prefix="drt-dockerfile-") as tmp:
        for path in sorted(copied):
            src = os.path.join(REPO, path)
            dst = os.path.join(tmp, path)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            if os.path.isdir(src):
                shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(src, dst)
        # The Dockerfile's own configure line, cpu VARIANT (its cuda_args).
        args = [cmake, "-S", tmp, "-B", os.path.join(tmp, "build"), "-DCMAKE_BUILD_TYPE=Release",
                "-DDRT_BUILD_TESTS=OFF", "-DDRT_ENABLE_CUDA=OFF"]
        out = subprocess.run(args, capture_output=True, text=True, timeout=600)
        c.expect(out.returncode == 0, "cmake configures the build stage's COPY set (cpu VARIANT)",
                 (out.stderr[-4000:] or out.stdout[-2000:]).strip())
        if out.returncode == 0:
            help_out = subprocess.run([cmake, "--build", os.path.join(tmp, "build"), "--target", "help"],
                                      capture_output=True, text=True, timeout=120)
            c.expect(re.search(r"\bdrt-server\b", help_out.stdout) is not None,
                     "the configured copy has the drt-server target the image builds")
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configure", action="store_true",
                        help="also run the image's cmake configure on the copied set")
    args = parser.parse_args()

    c = Checks()
    all_stages = stages(dockerfile_instructions(read("deploy/Dockerfile")))
    c.expect("build" in all_stages, "the Dockerfile has a stage named build", str(list(all_stages)))
    workdir, build_copies = copy_mappings(all_stages["build"])
    copied = in_place_copies(workdir, build_copies)

    run_lines = " ".join(rest for keyword, rest in all_stages["build"] if keyword == "RUN")
    c.expect("-DDRT_BUILD_TESTS=OFF" in run_lines,
             "the image configures with -DDRT_BUILD_TESTS=OFF (so tests/ and deploy/test are not needed)")

    for name, stage in all_stages.items():
        _, copies = copy_mappings(stage)
        missing = [s for s, _ in copies if not os.path.exists(os.path.join(REPO, s))]
        c.expect(not missing, f"stage {name}: every COPY source exists in the repository", str(missing))

    c.expect("CMakeLists.txt" in copied, "the build stage copies the top CMakeLists.txt to its WORKDIR")
    subdirectories = reached_subdirectories(read("CMakeLists.txt"))
    c.expect(len(subdirectories) > 0, "the top CMakeLists.txt has add_subdirectory calls the image reaches")
    for sub in subdirectories:
        c.expect(covered(sub, copied),
                 f"add_subdirectory({sub}) of CMakeLists.txt: the build stage copies {sub}/ to {workdir}/{sub}",
                 f"copied in place: {sorted(copied)}; add 'COPY {sub} {sub}' to deploy/Dockerfile")

    missing_includes = sorted((top, path) for top, path in included_top_folders(copied)
                              if not covered(top, copied))
    c.expect(not missing_includes, "every #include of a top-level folder in the copied sources is copied",
             "; ".join(f"{path} includes {top}/" for top, path in missing_includes[:10]))

    if args.configure:
        if configure_copied_set(c, copied) == 77:
            return 77
    return c.summary()


if __name__ == "__main__":
    sys.exit(main())
