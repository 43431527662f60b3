"""kernels_check's scanning rules: what may not appear in the exact kernels' device code (contracted FMA, vendor
math, calls, NaN-dropping max/min) as patterns over AMD assembly, PTX and SASS, the contract's own inline-asm FMAs
told from contracted ones (or counted, where the code carries no marks), and the SASS calls that are ptxas's own
warp helpers. Pure text: no compiler is run here."""

from __future__ import annotations

import re


def word_rule(pattern: str) -> re.Pattern:
    """pattern compiled with each word boundary before a literal word character, \\bX, written X(?<!\\wX): the same
    matches, but a pattern that starts with a literal (or a set of them) is searched ~10x faster by re than one
    that starts with an assertion, and one target's SASS is ~90 MB of text."""
    return re.compile(re.sub(r"\\b(\w)", r"\1(?<!\\w\1)", pattern))


# Fused multiply-add in any AMD encoding (contracted a*b+c), and hardware
# transcendental/division helpers whose results differ between vendors.
AMD_FMA = word_rule(
    r"\bv_(?:pk_)?(?:fma|fmac|mac|mad|fmaak|fmamk|madak|madmk)(?:_mix\w*|_legacy)?_f32(?:_e32|_e64|_dpp|_sdwa)?\b"
    r"|\bv_(?:fma|mad)_mix"
)
AMD_VENDOR_MATH = word_rule(
    r"\bv_(?:exp|log|rcp|rsq|sqrt|sin|cos)(?:_legacy)?_f32(?:_e32|_e64|_dpp|_sdwa)?\b|\bv_div_\w+|__ocml_|__ockl_"
)
AMD_CALL = word_rule(r"\bs_swappc_b64\b|\bs_call_b64\b")
# The contract's max propagates NaN (numerics.h max_nan: a select on AMD). The hardware's float max/min
# (v_max_f32, v_max3_f32, v_pk_max_f32, v_maximum*, ..., what fmaxf lowers to) return the other operand
# for a NaN: none may appear in the exact kernels. (No current gfx target emits any: the select stays a
# compare and a v_cndmask.) Integer and f16 forms (v_max_i32, v_max_u16, ...) are not matched.
AMD_FLOAT_MINMAX = word_rule(
    r"\bv_(?:pk_)?(?:max|min|max3|min3|med3|maximum|minimum|maximum3|minimum3|maxmin|minmax|maximumminimum"
    r"|minimummaximum)(?:_num)?_f(?:32|64)(?:_e32|_e64|_dpp|_sdwa)?\b"
)
PTX_FMA = word_rule(r"\b(?:fma|mad)(?:\.\w+)*\.f32\b")
# An add/sub/mul without a rounding modifier may be contracted by ptxas.
PTX_CONTRACTIBLE = word_rule(r"\b(?:add|sub|mul)(?:\.ftz|\.sat)*\.f32\b")
# PTX max/min without .NaN return the non-NaN operand. max_nan uses max.NaN.f32 on sm_80+ (and a select
# before); only the NaN-dropping forms are flagged.
PTX_FLOAT_MINMAX = word_rule(r"\b(?:max|min)(?:\.ftz)?(?:\.xorsign\.abs)?\.f32\b")
PTX_VENDOR_MATH = word_rule(r"\b(?:ex2|lg2|rcp|rsqrt|sqrt|sin|cos)\.approx|\bdiv\.(?:approx|full)|\bcall\b")
# HFMA2.MMA Rd, -RZ, RZ, imm is the compiler's way to load a constant, not arithmetic.
SASS_FMA = word_rule(r"\bFFMA\b|\bHFMA2(?:\.\w+)*\s+R\d+\s*,(?!\s*-?RZ\s*,\s*RZ\b)")
SASS_VENDOR_MATH = word_rule(r"\bMUFU\b")
# FMNMX.NAN is max.NaN.f32 (NaN wins, as the contract's max); a plain FMNMX drops a NaN operand.
SASS_FLOAT_MINMAX = word_rule(r"\bFMNMX(?!\S*\.NAN)(?:\.FTZ)?\b")
# A call into a subroutine (a vendor math slow path, an outlined function) needs
# a RET in the function's code. sm_80 code also uses CALL.REL.NOINC as a
# structured branch with no RET anywhere; that is not flagged.
SASS_CALL = word_rule(r"\bCALL\S*\s+\S+")
SASS_RET = word_rule(r"\bRET\b")


AMD_RULES = {
    "contracted FMA": AMD_FMA,
    "vendor math": AMD_VENDOR_MATH,
    "call": AMD_CALL,
    "NaN-dropping max/min": AMD_FLOAT_MINMAX,
}
PTX_RULES = {
    "contracted FMA": PTX_FMA,
    "contractible op": PTX_CONTRACTIBLE,
    "vendor math": PTX_VENDOR_MATH,
    "NaN-dropping max/min": PTX_FLOAT_MINMAX,
}
SASS_RULES = {  # FMAs are counted instead (fma_count_violations): the contract writes some itself
    "vendor math": SASS_VENDOR_MATH,
    "NaN-dropping max/min": SASS_FLOAT_MINMAX,
}
AMD_RULES_NO_FMA = {k: v for k, v in AMD_RULES.items() if k != "contracted FMA"}

# The contract's own fused multiply-adds (numerics.h fma_rn) are inline assembly, which PTX brackets with
# "// begin inline asm" ... "// end inline asm" and AMD assembly with ";;#ASMSTART" ... ";;#ASMEND": they are
# taken out before the FMA rule, so any FMA left is a compiler's contraction (the proof for a compile; ptxas
# never fuses the .rn operations PTX then holds). SASS and a shipped library's code objects carry no such
# marks, and ptxas may duplicate code (so SASS holds more FMAs than PTX writes): a shipped library's kernels
# must hold exactly as many FMA instructions as the same kernels compiled with the contract's flags (a
# reference compile of the check unit for that target), and a contracting build holds more.
PTX_EXPLICIT_FMA = re.compile(r"//\s*begin inline asm\s*\n\s*fma\.rn\.f32\b[^;\n]*;\s*\n\s*//\s*end inline asm")
AMD_EXPLICIT_FMA = re.compile(r";;#ASMSTART\s*\n\s*v_fma_f32\b[^\n]*\n\s*;;#ASMEND")


def explicit_fmas(bodies: dict[str, str], pat: re.Pattern) -> dict[str, str]:
    """The bodies without the contract's inline-asm FMAs."""
    return {k: pat.sub("", v) for k, v in bodies.items()}


def fma_counts(bodies: dict[str, str], pat: re.Pattern) -> dict[str, int]:
    return {k: len(pat.findall(v)) for k, v in bodies.items()}


def fma_count_violations(bodies: dict[str, str], pat: re.Pattern, reference: dict[str, int]) -> list[str]:
    """Kernels whose FMA instructions are not exactly as many as the contract's compile of them holds."""
    found = []
    for name, n in fma_counts(bodies, pat).items():
        want = reference.get(name)
        if want is None:
            found.append(f"{name}: contracted FMA: {n} FMA instructions, and no reference compile of this kernel")
        elif n != want:
            found.append(f"{name}: contracted FMA: {n} FMA instructions, {want} in the contract's compile (fma_rn)")
    return found


# Calls that are no call into math, on sm_80 (ptxas's own, in code it cannot prove converged):
# * a structured branch: "@P CALL.REL.NOINC t" with t two instructions on, over a BRA (no RET of its own);
# * the warp helpers of __syncwarp() and __shfl_xor_sync(): bodies of WARPSYNC, SHFL, moves (MOV,
#   IMAD.MOV.U32, a register spilled and restored around them: STL, LDL) and a constant load
#   (HFMA2.MMA Rd, -RZ, RZ, imm) up to the RET.
# Any other called body (a vendor math slow path, an outlined function) is flagged.
SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
SASS_HELPER_OPS = {"WARPSYNC", "SHFL", "MOV", "NOP", "BRA", "STL", "LDL"}
SASS_CONST_LOAD = re.compile(r"^\s*R\d+\s*,\s*-?RZ\s*,\s*RZ\b")


def _instructions(body: str) -> list[tuple[int, str, str]]:
    """(address, opcode, operands) of each SASS instruction."""
    return [(int(m.group(1), 16), m.group(2), m.group(3)) for m in SASS_LINE.finditer(body)]


def _helper_body(instrs: list[tuple[int, str, str]], target: int) -> bool:
    """True when the code from target to its RET is one of ptxas's warp helpers (no arithmetic)."""
    for addr, op, args in instrs:
        if addr < target:
            continue
        base = op.split(".")[0]
        if base == "RET":
            return True
        move = op.startswith("IMAD.MOV") or (base == "HFMA2" and SASS_CONST_LOAD.match(args))
        if base not in SASS_HELPER_OPS and not move:
            return False
    return False


def sass_calls(body: str) -> list[str]:
    if not SASS_RET.search(body):
        return []
    instrs = _instructions(body)
    if not instrs:  # no addresses to follow: every call counts
        return sorted(set(SASS_CALL.findall(body)))
    flagged = set()
    for addr, op, args in instrs:
        if not op.startswith("CALL"):
            continue
        target = re.search(r"0x([0-9a-f]+)", args)
        t = int(target.group(1), 16) if target else -1
        step = instrs[1][0] - instrs[0][0] if len(instrs) > 1 else 16
        if t == addr + 2 * step or _helper_body(instrs, t):
            continue
        flagged.add(f"{op} {args.strip()}")
    return sorted(flagged)


def scan(bodies: dict[str, str], rules: dict[str, re.Pattern]) -> list[str]:
    found = []
    for name, body in bodies.items():
        for rule, pat in rules.items():
            hits = sorted(set(pat.findall(body)))
            if hits:
                found.append(f"{name}: {rule}: {', '.join(hits[:5])}")
    return found
