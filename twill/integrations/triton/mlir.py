"""A small reader for the textual TTGIR that Triton prints: ``scf.for`` loops, the statements of their
bodies (results, operands, types, attributes, location) and the ``#loc`` table.

It reads only what the frontend needs, in the pretty form Triton 3.6 prints (one statement per line; a
statement with a region, such as ``tt.reduce``, ends on the line that closes the region and carries its
attributes and types there). Nothing is evaluated; edits for schedule injection are made on the same text
(:mod:`twill.integrations.triton.inject`), which Triton then re-parses.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from twill.errors import FormatError, TwillError

_VALUE = re.compile(r"%[A-Za-z0-9_$.\-]+(?:#\d+)?")
_OPNAME = re.compile(r'^\s*(?:(?P<res>%[^=]+?)\s*=\s*)?"?(?P<op>[a-z_][a-z0-9_]*\.[a-z0-9_.]+)"?')
_LOC_DEF = re.compile(r"^(#loc\d*)\s*=\s*loc\((.*)\)\s*$")
_LOC_REF = re.compile(r"loc\((#loc\d*)\)\s*$")
_FILE_LOC = re.compile(r'^"([^"]*)":(\d+):(\d+)$')
_NAMED_LOC = re.compile(r'^"([^"]*)"\((#loc\d*)\)$')
_CALLSITE = re.compile(r"^callsite\((#loc\d*) at (#loc\d*)\)$")
_TYPE = re.compile(r"(tensor|!ttg\.memdesc)<((?:\d+x)*)(!tt\.ptr<[^<>]*>|[a-zA-Z][a-zA-Z0-9]*)([^<>]*(?:<[^<>]*>[^<>]*)*)>")

#: MLIR element types -> Twill dtype names (``twill.machine.costs.DTYPE_BYTES``).
ELEMENT_DTYPES = {"f16": "fp16", "bf16": "bf16", "f32": "fp32", "f64": "fp64", "i32": "i32", "i64": "i64",
                  "i1": "i1", "i8": "i8", "i16": "i16", "f8E4M3FN": "fp8", "f8E5M2": "fp8", "tf32": "tf32"}
ELEMENT_BYTES = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i32": 4, "i64": 8, "i1": 1, "i8": 1, "i16": 2,
                 "f8E4M3FN": 1, "f8E5M2": 1}


@dataclass(frozen=True)
class TileType:
    """A tensor or memory-descriptor type: ``shape``, MLIR element type, and where it lives
    (``registers``, ``shared`` or ``tmem``)."""

    shape: tuple[int, ...]
    element: str
    space: str
    pointee: str | None = None

    @property
    def elements(self) -> int:
        return math.prod(self.shape) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.elements * ELEMENT_BYTES.get(self.element, 4)

    def pointed_to(self) -> TileType:
        """The tile a load through this type reads: for a tensor of pointers (``tensor<128x64x!tt.ptr<f16>>``)
        the same shape of the pointee element type, else the type itself."""
        if self.element != "ptr" or not self.pointee:
            return self
        return TileType(self.shape, self.pointee, self.space)

    @property
    def is_float(self) -> bool:
        return self.element.startswith(("f", "bf", "tf"))

    @property
    def dtype(self) -> str:
        return ELEMENT_DTYPES.get(self.element, self.element)


@dataclass(frozen=True)
class Statement:
    """One operation at the top level of a loop body.

    Attributes:
        index: position in the body (0-based; the ``scf.yield`` terminator is not a statement).
        op: MLIR op name (``tt.dot``, ``math.exp2``).
        results: SSA names it defines (``%acc#0`` style names for packed results).
        operands: SSA names it uses, including those used inside its regions, in order of appearance.
        types: every tensor/memdesc type of its type signature, in order (operands first, then results).
        text: the statement's full text (several lines for an op with a region).
        first_line / last_line: 0-based line numbers in the module text.
        loc: location alias (``#loc42``) or ``None``.
        region_ops: op names used inside its regions (the combiner of a ``tt.reduce``).
    """

    index: int
    op: str
    results: tuple[str, ...]
    operands: tuple[str, ...]
    types: tuple[TileType, ...]
    text: str
    first_line: int
    last_line: int
    loc: str | None
    region_ops: tuple[str, ...]

    @property
    def result_type(self) -> TileType | None:
        """The type of the first result, when it is a tensor or memory descriptor."""
        return _result_type(self)

    @property
    def short(self) -> str:
        return self.op.split(".", 1)[1]



@dataclass(frozen=True)
class ForLoop:
    """An ``scf.for`` loop: induction variable, iteration arguments, body statements and yielded values."""

    header_line: int
    close_line: int
    induction: str
    iter_args: tuple[str, ...]
    body: tuple[Statement, ...]
    yields: tuple[str, ...]
    innermost: bool
    loc: str | None = None
    num_stages: int | None = None       # the loop's own ``tl.range(..., num_stages=N)`` (``tt.num_stages``)


# -- types -------------------------------------------------------------------------------------------------
def parse_types(signature: str) -> tuple[TileType, ...]:
    """Every ``tensor<...>`` / ``!ttg.memdesc<...>`` type in a type signature, in order."""
    out = []
    for m in _TYPE.finditer(signature):
        kind, dims, element, rest = m.groups()
        shape = tuple(int(d) for d in dims.split("x") if d)
        pointee = None
        if element.startswith("!tt.ptr"):
            element, pointee = "ptr", element[len("!tt.ptr<"):-1].split(",")[0].strip()
        if kind == "tensor":
            space = "registers"
        else:
            space = "tmem" if "tensor_memory" in rest else "shared"
        out.append(TileType(shape, element, space, pointee))
    return tuple(out)


def type_colon(line: str) -> int:
    """Index of the top-level `` : `` that starts a statement's type signature, or -1."""
    depth = 0
    for i, ch in enumerate(line):
        if ch in "<({[":
            depth += 1
        elif ch in ">)}]":
            depth = max(0, depth - 1)
        elif ch == ":" and depth == 0 and line[i - 1:i + 2] == " : ":
            return i - 1
    return -1



def add_attribute(line: str, attr: str) -> str:
    """``line`` (a statement's last line) with ``attr`` added to its attribute dictionary."""
    region_end = re.match(r"^(\s*\})\s*(?:\{(.*?)\})?(\s*loc\(.*)?$", line)
    if region_end:                         # the closing line of an op with a region: attributes follow it
        inner = f"{region_end.group(2)}, {attr}" if region_end.group(2) else attr
        tail = f" {region_end.group(3).strip()}" if region_end.group(3) else ""
        return f"{region_end.group(1)} {{{inner}}}{tail}"
    cut = type_colon(line)
    if cut < 0:
        raise TwillError(f"cannot place the attribute {attr!r} on {line.strip()[:80]!r}")
    head = line[:cut].rstrip()
    if head.endswith("}"):                 # an attribute dictionary precedes the types: extend it
        return head[:-1].rstrip() + f", {attr}}}" + line[cut:]
    return head + f" {{{attr}}}" + line[cut:]

def _type_signature(tail: str) -> str:
    """The part of a statement's last line after its top-level ``:`` (the type signature), without loc."""
    tail = re.sub(r"\s*loc\([^()]*(?:\([^()]*\))*[^()]*\)\s*$", "", tail)
    cut = type_colon(tail)
    return tail[cut + 2:] if cut >= 0 else ""


def _result_type(st: Statement) -> TileType | None:
    sig = _type_signature(st.text.splitlines()[-1])
    if not sig:
        return None
    for sep in ("->", " to "):
        if sep in sig:
            sig = sig.rsplit(sep, 1)[1]
            break
    types = parse_types(sig)
    if not types:
        return None
    if st.op in ("arith.cmpi", "arith.cmpf"):
        return TileType(types[-1].shape, "i1", types[-1].space)
    return types[-1]


# -- statements and loops ----------------------------------------------------------------------------------
def _strip_strings(line: str) -> str:
    return re.sub(r'"[^"]*"', '""', line)


def _net_braces(line: str) -> int:
    s = _strip_strings(line)
    return s.count("{") - s.count("}")


def _results(res: str | None) -> tuple[str, ...]:
    if not res:
        return ()
    out: list[str] = []
    for part in res.split(","):
        part = part.strip()
        m = re.match(r"^(%[A-Za-z0-9_$.\-]+)(?::(\d+))?$", part)
        if not m:
            continue
        if m.group(2):
            out.extend(f"{m.group(1)}#{k}" for k in range(int(m.group(2))))
        else:
            out.append(m.group(1))
    return tuple(out)


def _operands(text: str, results: tuple[str, ...], region_defs: set[str]) -> tuple[str, ...]:
    body = _strip_strings(text)
    first = body.split("=", 1)[1] if results and "=" in body else body
    seen: list[str] = []
    for v in _VALUE.findall(first):
        if v in results or v in region_defs or v in seen:
            continue
        seen.append(v)
    return tuple(seen)


def _statement(index: int, lines: list[str], first: int, last: int) -> Statement:
    head = lines[first]
    m = _OPNAME.match(head)
    if not m:
        raise FormatError(f"line {first + 1}: cannot read the operation {head.strip()[:80]!r}")
    results = _results(m.group("res"))
    text = "\n".join(lines[first:last + 1])
    region_defs: set[str] = set()
    region_ops: list[str] = []
    for inner in lines[first + 1:last]:
        im = _OPNAME.match(inner)
        if im:
            region_ops.append(im.group("op"))
            region_defs.update(_results(im.group("res")))
        bb = re.match(r"^\s*\^bb\d+\((.*)\):", inner)
        if bb:
            region_defs.update(re.findall(r"%[A-Za-z0-9_$.\-]+", bb.group(1)))
    # operands: the head line's operands plus uses inside the region of values defined outside it
    operands = list(_operands(head, results, region_defs))
    for inner in lines[first + 1:last + 1]:
        for v in _VALUE.findall(_strip_strings(inner.split(" loc(")[0])):
            if v not in region_defs and v not in results and v not in operands:
                operands.append(v)
    loc = _LOC_REF.search(lines[last].rstrip())
    types = parse_types(_type_signature(lines[last]))
    return Statement(index=index, op=m.group("op"), results=results, operands=tuple(operands), types=types,
                     text=text, first_line=first, last_line=last, loc=loc.group(1) if loc else None,
                     region_ops=tuple(region_ops))


def region_statements(st: Statement) -> tuple[tuple[Statement, ...], ...]:
    """The statements at the top level of each region of ``st`` (the ``then`` and ``else`` blocks of an
    ``scf.if``), terminators (``scf.yield``) left out, numbered from 0 in text order, with module line
    numbers."""
    lines = st.text.splitlines()
    regions: list[list[Statement]] = [[]]
    count, depth, j = 0, 0, 1
    while j < len(lines) - 1:
        stripped = lines[j].strip()
        if depth == 0 and stripped.startswith("}") and stripped.endswith("{"):
            regions.append([])              # "} else {": the next region starts
            j += 1
            continue
        if depth == 0 and stripped and not stripped.startswith(("}", "^", "scf.yield")):
            net, k = _net_braces(lines[j]), j
            while net > 0 and k + 1 < len(lines) - 1:
                k += 1
                net += _net_braces(lines[k])
            inner = _statement(count, lines, j, k)
            regions[-1].append(Statement(index=inner.index, op=inner.op, results=inner.results,
                                         operands=inner.operands, types=inner.types, text=inner.text,
                                         first_line=st.first_line + j, last_line=st.first_line + k,
                                         loc=inner.loc, region_ops=inner.region_ops))
            count += 1
            j = k + 1
            continue
        depth = max(0, depth + _net_braces(lines[j]))
        j += 1
    return tuple(tuple(r) for r in regions)


def _loop_header(line: str) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    iv = re.search(r"scf\.for\s+(%[A-Za-z0-9_$.\-]+)\s*=", line)
    args = re.search(r"iter_args\((.*?)\)\s*->", line) or re.search(r"iter_args\((.*)\)", line)
    iter_args: list[str] = []
    inits: list[str] = []
    if args:
        for part in re.split(r",\s*(?=%)", args.group(1)):
            if "=" in part:
                name, init = part.split("=", 1)
                iter_args.append(name.strip())
                inits.append(init.strip())
    return (iv.group(1) if iv else "%iv"), tuple(iter_args), tuple(inits)


def find_loops(text: str) -> list[ForLoop]:
    """Every ``scf.for`` of a module, outermost first, with the statements at the top level of its body."""
    lines = text.splitlines()
    loops = []
    for i, line in enumerate(lines):
        if not re.search(r"(^|\s|=\s)scf\.for\s", line) or not line.rstrip().endswith("{"):
            continue
        induction, iter_args, _ = _loop_header(line)
        body: list[Statement] = []
        yields: tuple[str, ...] = ()
        innermost = True
        depth, j = 1, i + 1
        while j < len(lines) and depth > 0:
            s = lines[j]
            stripped = s.strip()
            if depth == 1 and stripped and not stripped.startswith("}") and not stripped.startswith("^"):
                first, net, k = j, _net_braces(s), j
                while net > 0 and k + 1 < len(lines):
                    k += 1
                    net += _net_braces(lines[k])
                if stripped.startswith("scf.yield"):
                    yields = tuple(_VALUE.findall(stripped.split(":")[0]))
                else:
                    st = _statement(len(body), lines, first, k)
                    body.append(st)
                    if st.op == "scf.for" or "scf.for" in st.region_ops:
                        innermost = False
                j = k + 1
                continue
            depth += _net_braces(s)
            j += 1
        close = lines[j - 1].rstrip() if j - 1 < len(lines) else ""
        loc = _LOC_REF.search(close)
        stages = re.search(r"\btt\.num_stages = (\d+)", close)
        loops.append(ForLoop(header_line=i, close_line=j - 1, induction=induction, iter_args=iter_args,
                             body=tuple(body), yields=yields, innermost=innermost,
                             loc=loc.group(1) if loc else None,
                             num_stages=int(stages.group(1)) if stages else None))
    return loops


# -- locations ---------------------------------------------------------------------------------------------
def location_table(text: str) -> dict[str, str]:
    """``#locN`` alias -> its definition text."""
    table = {}
    for line in text.splitlines():
        m = _LOC_DEF.match(line.strip())
        if m:
            table[m.group(1)] = m.group(2)
    return table


def resolve_location(alias: str | None, table: dict[str, str]) -> tuple[str | None, str | None]:
    """(name, "file:line:col") of a location alias: the first name given to it and the source position it
    points at (file reduced to its base name), following named and call-site locations."""
    name: str | None = None
    seen: set[str] = set()
    while alias and alias not in seen:
        seen.add(alias)
        body = table.get(alias)
        if body is None:
            return name, None
        m = _FILE_LOC.match(body)
        if m:
            return name, f"{m.group(1).rsplit('/', 1)[-1]}:{m.group(2)}:{m.group(3)}"
        m = _NAMED_LOC.match(body)
        if m:
            name = name or m.group(1)
            alias = m.group(2)
            continue
        m = _CALLSITE.match(body)
        if m:
            alias = m.group(2) if table.get(m.group(1), "") == "unknown" else m.group(1)
            continue
        return name, None
    return name, None


def source_positions(alias: str | None, table: dict[str, str]) -> tuple[str, ...]:
    """Python source positions (``"file.py:LINE"``) of a location alias: the position itself, then, for code
    inlined from a ``@triton.jit`` helper, each call site outwards."""
    body = table.get(alias or "", "")
    m = _FILE_LOC.match(body)
    if m:
        return (f"{m.group(1).rsplit('/', 1)[-1]}:{m.group(2)}",)
    m = _NAMED_LOC.match(body)
    if m and m.group(2) != alias:
        return source_positions(m.group(2), table)
    m = _CALLSITE.match(body)
    if m:
        return source_positions(m.group(1), table) + source_positions(m.group(2), table)
    return ()


def function_name(text: str) -> str | None:
    m = re.search(r"tt\.func\s+(?:public\s+|private\s+)?@([A-Za-z0-9_]+)", text)
    return m.group(1) if m else None


def module_num_warps(text: str) -> int | None:
    m = re.search(r'"ttg\.num-warps"\s*=\s*(\d+)', text)
    return int(m.group(1)) if m else None


def module_target(text: str) -> str | None:
    m = re.search(r'ttg\.target\s*=\s*"cuda:(\d+)"', text)
    return f"sm_{m.group(1)}" if m else None
