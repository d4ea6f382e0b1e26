#!/usr/bin/env python3
"""SASS of one brook kernel, without a GPU: the same NVRTC compile as the engine (common.cuh
prepended, the same appended files, -D defines), ptxas for the target, then cuobjdump/nvdisasm.

Why: counting a kernel's instructions a loop (how much of the SM's issue rate a memory-bound
loop needs) needs no device; session 43 found the bulk gemv's ~466 instructions a stage this way.

  scripts/kernel-sass.py FILE KERNEL [NAME=VALUE ...] [--arch sm_90] [--span 0x16a0 0x33c0]

FILE is a kernels/ stem (gemv_bulk, paged_decode, prefill_attn_wgmma, ...), KERNEL the
extern "C" name, NAME=VALUE the defines its loader passes (e.g. HD=128 GROUP=4 KV_FP8=1).
Prints ptxas's register/spill line, the instruction mix, and with --span the instructions
between two addresses (e.g. one loop body, from the branch targets in the listing written
to target/sass/KERNEL.sass).

Tools: NVRTC and ptxas from target/cuda-tools (what .ci/run installs); cuobjdump and nvdisasm
are installed from PyPI into target/cuda-sass on first use.
"""
import argparse
import collections
import ctypes
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(ROOT, "target/cuda-tools/nvidia/cu13")
SASS_TOOLS = os.path.join(ROOT, "target/cuda-sass")
# Files the engine compiles together (compile.rs: PAGED_DECODE, PREFILL_ATTN_WG, gemv_chain).
APPENDED = {
    "gemv_chain": ["gemv_bulk", "gemv_chain"],
    "paged_decode": ["paged_decode", "paged_decode_mma"],
    "prefill_attn_wgmma": ["prefill_attn", "prefill_attn_wgmma"],
}


def need_tools():
    if not os.path.exists(os.path.join(TOOLS, "bin/ptxas")):
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                        os.path.join(ROOT, "target/cuda-tools"),
                        "nvidia-cuda-nvrtc==13.0.88", "nvidia-cuda-nvcc==13.0.88"], check=True)
    bins = os.path.join(SASS_TOOLS, "nvidia/cu13/bin")
    if not os.path.exists(os.path.join(bins, "nvdisasm")):
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                        SASS_TOOLS, "nvidia-cuda-cuobjdump==13.2.86",
                        "nvidia-cuda-nvdisasm==13.2.86"], check=True)
    return bins


def ptx(stem, defines, arch):
    # NVRTC dlopens its builtins by name: loaded first, the name is already resolved.
    libdir = os.path.join(TOOLS, "lib")
    builtins = [f for f in os.listdir(libdir) if f.startswith("libnvrtc-builtins.so.")]
    ctypes.CDLL(os.path.join(libdir, sorted(builtins)[0]), mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(os.path.join(libdir, "libnvrtc.so.13"))
    kernels = os.path.join(ROOT, "kernels")
    src = "".join(open(os.path.join(kernels, f + ".cu")).read()
                  for f in APPENDED.get(stem, [stem]))
    name = APPENDED.get(stem, [stem])[0]
    common = open(os.path.join(kernels, "common.cuh")).read()
    full = f'{common}\n#line 1 "{name}.cu"\n{src}'.encode()
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), full, f"{name}.cu".encode(), 0, None, None) == 0
    opts = [f"--gpu-architecture={arch}", "--std=c++17"] + [f"-D{d}" for d in defines]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        sys.exit(log.value.decode())
    lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetPTX(prog, buf)
    return buf.value.decode()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("kernel")
    ap.add_argument("defines", nargs="*")
    ap.add_argument("--arch", default="sm_90", help="sm_90, or sm_90a for wgmma/TMA files")
    ap.add_argument("--span", nargs=2, metavar=("FROM", "TO"), help="hex addresses, inclusive")
    a = ap.parse_args()
    bins = need_tools()
    out = os.path.join(ROOT, "target/sass")
    os.makedirs(out, exist_ok=True)
    base = os.path.join(out, a.kernel)
    open(base + ".ptx", "w").write(ptx(a.file, a.defines, a.arch.replace("sm_", "compute_")))
    report = subprocess.run([os.path.join(TOOLS, "bin/ptxas"), f"-arch={a.arch}", "-v", base + ".ptx",
                             "-o", base + ".cubin"], check=True, capture_output=True, text=True).stderr
    lines = report.splitlines()
    for i, l in enumerate(lines):
        if f"'{a.kernel}'" in l and "Compiling" in l:
            print("\n".join(lines[i + 2:i + 4]))
    sass = subprocess.run([os.path.join(bins, "cuobjdump"), "-sass", "-fun", a.kernel, base + ".cubin"],
                          check=True, capture_output=True, text=True,
                          env={**os.environ, "PATH": bins + ":" + os.environ.get("PATH", "")}).stdout
    open(base + ".sass", "w").write(sass)
    ins = [(int(m.group(1), 16), m.group(2).strip())
           for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    if a.span:
        lo, hi = int(a.span[0], 16), int(a.span[1], 16)
        ins = [(x, t) for x, t in ins if lo <= x <= hi]
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for _, t in ins)
    print(f"{len(ins)} instructions{' in the span' if a.span else ''}; listing: {base}.sass")
    print(", ".join(f"{op} {n}" for op, n in ops.most_common(16)))


if __name__ == "__main__":
    main()
