#!/usr/bin/env python3
"""The floor plan of DESIGN.md §3, checked: a folder is a library with an explicit source list, and
includes follow the dependency rule (nothing points up):

    proto -> common -> kernels -> {coll, io} -> model -> worker
             common -> planner -> {coordinator, worker, cli};  cli -> {planner, io}

Also: only kernels/*.cu (and their kernels/src/cuda_*.h) and coll/coll_nccl.c see CUDA or NCCL
headers, only coll/coll_gloo.cc is
C++ (outside kernels/*.cu), and pcsctl links neither Gloo nor BLAS nor CUDA nor the worker runtime.
Usage: check_layout.py SOURCE_DIR [PCSCTL_BINARY]. Exit 1 with one line per violation."""
import os
import re
import subprocess
import sys

SRC = sys.argv[1]
PCSCTL = sys.argv[2] if len(sys.argv) > 2 else None

# folder -> the folders its sources may include (besides itself and the generated protos)
ALLOWED = {
    "common": set(),
    "kernels": {"common"},
    "planner": {"common"},
    "coll": {"common", "kernels"},
    "io": {"common", "kernels"},
    "model": {"common", "kernels", "coll", "io"},
    "worker": {"common", "kernels", "coll", "io", "model", "planner"},
    "coordinator": {"common", "planner"},
    "cli": {"common", "planner", "io"},
}
# public headers under <folder>/include/pcs/ are included as "pcs/<name>"
PUBLIC = {}
for folder in ALLOWED:
    d = os.path.join(SRC, folder, "include", "pcs")
    if os.path.isdir(d):
        for name in os.listdir(d):
            PUBLIC["pcs/" + name] = folder
SOURCE = re.compile(r"\.(c|cc|cu|h)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+([<"])([^">]+)[">]', re.M)

errors = []


def tracked(folder):
    out = subprocess.run(["git", "-C", SRC, "ls-files", folder], capture_output=True, text=True)
    if out.returncode == 0 and out.stdout:
        return out.stdout.split()
    files = []  # not a git checkout: walk the folder
    for root, _, names in os.walk(os.path.join(SRC, folder)):
        files += [os.path.relpath(os.path.join(root, n), SRC) for n in names]
    return files


for folder, allowed in ALLOWED.items():
    for rel in tracked(folder):
        if not SOURCE.search(rel):
            continue
        text = open(os.path.join(SRC, rel), encoding="utf-8", errors="replace").read()
        for kind, inc in INCLUDE.findall(text):
            if kind == "<":
                base = inc.split("/")[0]
                if base in ("cuda_runtime.h", "cuda.h", "cublas_v2.h", "nccl.h", "cuda_fp16.h",
                            "cuda_bf16.h", "cuda_runtime_api.h"):
                    cuda_unit = rel.startswith("kernels/") and (
                        rel.endswith(".cu") or os.path.basename(rel).startswith("cuda_"))
                    if not cuda_unit and rel != "coll/coll_nccl.c":
                        errors.append(f"{rel}: includes <{inc}> (only kernels/*.cu and "
                                      "coll/coll_nccl.c see CUDA/NCCL)")
                if base == "gloo" and rel != "coll/coll_gloo.cc":
                    errors.append(f"{rel}: includes <{inc}> (only coll/coll_gloo.cc sees Gloo)")
                continue
            if inc.startswith("pcs/v1/") or inc.startswith("grpc/health/"):
                continue  # generated messages (proto/)
            if inc in PUBLIC:
                owner = PUBLIC[inc]
            elif "/" in inc:
                owner = inc.split("/")[0]
            else:
                continue  # a private header of the folder itself (kernels/src, common/rpc_*)
            if owner not in ALLOWED:
                continue
            if owner != folder and owner not in allowed:
                errors.append(f"{rel}: includes \"{inc}\" ({folder} -> {owner} points up or "
                              f"sideways; {folder} may use {sorted(allowed) or 'only itself'})")
        if rel.endswith(".cc") and rel != "coll/coll_gloo.cc":
            errors.append(f"{rel}: C++ outside coll/coll_gloo.cc and kernels/*.cu")

# explicit source lists: no globs, no if(EXISTS) guards
for root, dirs, names in os.walk(SRC):
    dirs[:] = [d for d in dirs if not d.startswith(("build", ".git"))]
    for n in names:
        if n == "CMakeLists.txt" or n.endswith(".cmake"):
            p = os.path.join(root, n)
            for i, line in enumerate(open(p, encoding="utf-8"), 1):
                code = line.split("#", 1)[0]
                if re.search(r"\bfile\s*\(\s*GLOB", code) or re.search(r"\bEXISTS\b", code):
                    errors.append(f"{os.path.relpath(p, SRC)}:{i}: {line.strip()} "
                                  "(a folder lists its sources)")

if PCSCTL:
    dyn = subprocess.run(["readelf", "-d", PCSCTL], capture_output=True, text=True).stdout
    for lib in re.findall(r"\(NEEDED\).*\[(.*)\]", dyn):
        if re.search(r"gloo|blas|lapack|cuda|cublas|nccl|ibverbs", lib):
            errors.append(f"pcsctl links {lib}")
    syms = subprocess.run(["nm", "-C", PCSCTL], capture_output=True, text=True).stdout
    for prefix in ("pcs_runtime_", "pcs_train_", "pcs_agent_", "pcs_mlp_", "pcs_ref_",
                   "pcs_coll_", "pcs_kernel_", "pcs_backend_"):
        if re.search(r"\b[TtDdBbRr] " + prefix, syms):
            errors.append(f"pcsctl contains {prefix}* (the worker runtime, model, collectives or "
                          "kernels)")

for e in errors:
    print(e)
print(f"# layout: {len(errors)} violation(s)")
sys.exit(1 if errors else 0)
