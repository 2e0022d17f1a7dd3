"""Experiment (not a speed target): what `-march=native` on Inductor's C++ kernel command line builds for here,
and which of the options it resolves to change the code of real kernels.

Inductor builds every C++ kernel on CPU with `-march=native` (torch/_inductor/cpp_builder.py
`_get_cpu_arch_cflags`, unless `TORCHINDUCTOR_CPP_MARCH` names a target). Its keys hold that literal flag, not
what the compiler makes of it on the machine that builds. This prints:

1. the compiler proper's options the driver resolves `-march=native` to (`g++ -march=native -### -fsyntax-only`), raw and
   as the toolchain records them (`warmup.machine.native_target`: the CPU, the tuning, the extensions enabled,
   the cache sizes); and what `-march=native` changes in `g++ -Q --help=target` / `--help=params`;
2. the flags of Inductor's kernel command line that depend on this machine (the ISA's `-D` macro and `-m`
   flags, `-march=native`);
3. for the C++ kernels of a small model compiled for training (fp32), a bf16 function under autocast and
   an int8 quantisation with a bitwise reduction and an argmax,
   each kernel compiled to an object file (`-c`) with the options of its command line, `-march=native`
   replaced by each variant below, and its machine code (`objdump -d`, addresses dropped) compared with the
   `-march=native` build:

       resolved      the raw options `-march=native` resolves to, spelled out: the resolution is complete if
                     this is identical everywhere
       fewer-ext     the same, less the AVX-512 extensions a CPU of the same Inductor ISA may lack (VBMI, VBMI2,
                     IFMA, BITALG, VPOPCNTDQ, BF16, VP2INTERSECT, GFNI, VAES, VPCLMULQDQ, AVX-VNNI)
       cascadelake   `-march=cascadelake` (Intel, AVX-512 with VNNI: Inductor picks the same ISA
                     `avx512 avx512_vnni` there as on an AVX-512 VNNI AMD or a newer Intel)
       tune-generic  the resolved options with `-mtune=generic`
       cache-sizes   the resolved options with other cache sizes (`--param l1-cache-size=32`,
                     `l2-cache-size=2048`)

    python benchmarks/native_target.py [--work DIR]

x86-64 with g++ only (the variants are x86 names). The machine code comparison says whether code differs, and
which instructions the `-march=native` build uses that the other does not; it cannot say whether those would
fault on another CPU (that needs the other CPU).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = r"""
import torch
model = torch.nn.Sequential(
    torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64), torch.nn.Linear(64, 8)
)
compiled = torch.compile(model, dynamic=False)
compiled(torch.randn(16, 32)).square().mean().backward()
def mixed(a, b):
    return torch.nn.functional.gelu(a.to(torch.bfloat16)) * b.to(torch.bfloat16).softmax(-1)
with torch.autocast("cpu", dtype=torch.bfloat16):
    torch.compile(mixed, dynamic=False)(torch.randn(64, 128), torch.randn(64, 128)).float().sum()
def quantise(a):
    q = (a * 127).round().clamp(-128, 127).to(torch.int8)
    return q, (q.to(torch.int32) & 0x0F).sum(-1), a.argmax(-1)
torch.compile(quantise, dynamic=False)(torch.randn(64, 256))
"""

FEWER = [
    "avx512vbmi",
    "avx512vbmi2",
    "avx512ifma",
    "avx512bitalg",
    "avx512vpopcntdq",
    "avx512bf16",
    "avx512vp2intersect",
    "gfni",
    "vaes",
    "vpclmulqdq",
    "avxvnni",
]


def resolved_raw(compiler: str) -> list[str]:
    """The compiler proper's options that `-march=native` stands for here, as the driver spells them."""
    done = subprocess.run(
        [compiler, "-march=native", "-###", "-fsyntax-only", "-x", "c++", os.devnull],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "LC_ALL": "C"},
    )
    line = next(ln for ln in done.stderr.splitlines() if re.search(r"/cc1(plus)?\s", ln))
    tokens = shlex.split(line)
    kept: list[str] = []
    for index, token in enumerate(tokens):
        if token.startswith("-m"):
            kept.append(token)
        elif token == "--param":
            kept += [token, tokens[index + 1]]
    return kept


def help_difference(compiler: str, what: str) -> list[str]:
    def settings(*flags: str) -> dict[str, str]:
        out = subprocess.run(
            [compiler, *flags, "-Q", f"--help={what}"], capture_output=True, text=True, check=True
        ).stdout
        found = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0].startswith("-"):
                found[parts[0]] = " ".join(parts[1:])
        return found

    plain, native = settings(), settings("-march=native")
    return [f"{k} {plain.get(k)} -> {native[k]}" for k in sorted(native) if plain.get(k) != native[k]]


def kernel_flags(reference: str) -> list[str]:
    """Inductor's kernel command line as compile-only options: no source, output, linking or `-shared`."""
    tokens = shlex.split(reference)[1:]
    kept: list[str] = []
    skip = False
    for token in tokens:
        if skip:
            skip = False
            continue
        if token in ("i", "-shared") or token.startswith(("-l", "-L")) or token.endswith(".so"):
            continue
        if token == "-o":
            skip = True
            continue
        kept.append(token)
    return kept


def machine_code(compiler: str, flags: list[str], source: Path, out: Path) -> list[str]:
    subprocess.run([compiler, *flags, "-c", str(source), "-o", str(out)], check=True, capture_output=True)
    listing = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", "--no-addresses", str(out)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line.split("#")[0].strip() for line in listing.splitlines() if line.startswith((" ", "\t"))]


def mnemonics(code: list[str]) -> collections.Counter[str]:
    return collections.Counter(line.split()[0] for line in code if line.split())


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="native-target-"))
    work.mkdir(parents=True, exist_ok=True)

    from warmup import layout, machine

    compiler = machine.cxx()
    raw = resolved_raw(compiler)
    print(f"compiler: {machine.compiler_version()}; CPU: {machine.cpu_model()}")
    print(f"\n1. -march=native here: {' '.join(raw)}")
    print(f"\n   recorded (cpu_target): {' '.join(machine.native_target() or ())}")
    for what in ("target", "params"):
        print(f"\n   `-Q --help={what}` that -march=native changes:")
        for line in help_difference(compiler, what):
            print(f"     {line}")

    reference = layout._reference_command_line()
    flags = kernel_flags(reference)
    host = [f for f in flags if f.startswith(("-march", "-mtune", "-mcpu", "-m")) or "CPU_CAPABILITY" in f]
    print(f"\n2. host-dependent flags on Inductor's kernel command line: {' '.join(host)}")

    cache = work / "cache"
    subprocess.run(
        [sys.executable, "-c", MODEL], check=True, env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    )
    kernels = sorted(cache.rglob("*.main.cpp"))
    print(f"\n3. {len(kernels)} kernels ({cache})")

    resolved = raw
    variants = {
        "resolved": resolved,
        "fewer-ext": [*resolved, *(f"-mno-{name}" for name in FEWER)],
        "cascadelake": ["-march=cascadelake"],
        "tune-generic": [*(f for f in resolved if not f.startswith("-mtune=")), "-mtune=generic"],
        "cache-sizes": [*resolved, "--param", "l1-cache-size=32", "--param", "l2-cache-size=2048"],
    }
    index = flags.index("-march=native")
    totals: dict[str, list[int]] = {name: [0, 0] for name in variants}
    only_native: dict[str, collections.Counter[str]] = {name: collections.Counter() for name in variants}
    for number, kernel in enumerate(kernels):
        native = machine_code(compiler, flags, kernel, work / f"{number}.native.o")
        for name, replacement in variants.items():
            other_flags = flags[:index] + replacement + flags[index + 1 :]
            other = machine_code(compiler, other_flags, kernel, work / f"{number}.{name}.o")
            differing = sum(1 for a, b in zip(native, other, strict=False) if a != b) + abs(
                len(native) - len(other)
            )
            totals[name][0] += differing
            totals[name][1] += int(native != other)
            only_native[name] += mnemonics(native) - mnemonics(other)
    total = sum(len(machine_code(compiler, flags, k, work / "count.o")) for k in kernels)
    print(f"   instructions in the -march=native builds: {total}")
    print(
        f"   {'variant':<14} {'kernels differing':>18} {'instructions differing':>23}  only in -march=native"
    )
    for name, (instructions, differing_kernels) in totals.items():
        seen = ", ".join(f"{m} {c}" for m, c in only_native[name].most_common(8)) or "-"
        print(f"   {name:<14} {differing_kernels:>10} of {len(kernels):<5} {instructions:>23}  {seen}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
