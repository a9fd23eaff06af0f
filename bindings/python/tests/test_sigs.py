"""_lib.py's ctypes signatures and structs against flashopt.h, the header
the library is built from: every entry point the binding binds or calls, and
every struct it reads, field by field. A small parser of the header's
FLASHOPT_API declarations (no pycparser)."""

import ctypes
import re
from pathlib import Path

import pytest

from flashopt import _lib as L

ROOT = Path(__file__).resolve().parents[3]
HEADER = ROOT / "runtime" / "include" / "flashopt" / "flashopt.h"
PACKAGE = ROOT / "bindings" / "python" / "flashopt"


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


class Header:
    """What the binding needs of flashopt.h: functions, enums, handles, structs."""

    def __init__(self, text: str):
        text = _strip_comments(text)
        self.enums = set(re.findall(r"typedef\s+enum\s+\w*\s*\{[^}]*\}\s*(\w+)\s*;", text))
        self.handles = set(re.findall(r"typedef\s+struct\s+\w+\s*\*\s*(\w+)\s*;", text))
        self.structs = {}
        for body, name in re.findall(r"typedef\s+struct\s+\w*\s*\{([^}]*)\}\s*(\w+)\s*;", text):
            fields = []
            for decl in body.split(";"):
                decl = " ".join(decl.split())
                if not decl or "(" in decl:  # function-pointer members: their names
                    if "(" in decl:
                        fn = re.search(r"\(\s*\*\s*(\w+)\s*\)", decl)
                        fields.append(("<fnptr>", fn.group(1) if fn else None))
                    continue
                arr = re.match(r"(\w+)\s+(\w+)\s*\[\s*(\d+)\s*\]$", decl)
                if arr:  # a fixed array member: char name[128]
                    fields.append((f"{arr.group(1)}[{arr.group(3)}]", arr.group(2)))
                    continue
                m = re.match(r"(.*?)(\w+(?:\s*,\s*\**\s*\w+)*)$", decl)
                base, names = m.group(1), m.group(2)
                for n in names.split(","):
                    n = n.strip()
                    stars = n.count("*")
                    fields.append((self.norm(base + "*" * stars), n.strip("* ")))
            self.structs[name] = fields
        self.functions = {}
        for ret, name, args in re.findall(
                r"FLASHOPT_API\s+([\w\s\*]+?)\s*\b(flashopt_\w+)\s*\(([^)]*)\)\s*;", text):
            params = []
            for a in args.split(","):
                a = " ".join(a.split())
                if a in ("void", ""):
                    continue
                m = re.match(r"(.*?[\s\*])(\w+)$", a)
                params.append(self.norm(m.group(1)))
            self.functions[name] = (self.norm(ret), params)

    @staticmethod
    def norm(ctype: str) -> str:
        """'const void *const *' -> 'void**'."""
        t = re.sub(r"\bconst\b", " ", ctype)
        stars = t.count("*")
        return " ".join(t.replace("*", " ").split()) + "*" * stars

    _SCALARS = {"int": ctypes.c_int, "int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64,
                "uint32_t": ctypes.c_uint32, "double": ctypes.c_double, "float": ctypes.c_float,
                "uint64_t": ctypes.c_uint64, "size_t": ctypes.c_size_t}

    def ctypes_of(self, ctype: str):
        """The ctypes types the binding may declare for a C type (a set:
        data buffers of float may be bound as c_void_p)."""
        arr = re.match(r"(\w+)\[(\d+)\]$", ctype)
        if arr:
            (t,) = {"char": {ctypes.c_char}}.get(arr.group(1)) or self.ctypes_of(arr.group(1))
            return {t * int(arr.group(2))}
        base, stars = ctype.rstrip("*"), len(ctype) - len(ctype.rstrip("*"))
        if stars == 0:
            if base == "void":
                return {None}
            if base in self.enums:
                return {ctypes.c_int}
            if base in self.handles:
                return {ctypes.c_void_p}
            return {self._SCALARS[base]}
        if base == "char":
            inner = {ctypes.c_char_p}
        elif base == "void":
            inner = {ctypes.c_void_p}
        elif base in L.STRUCTS:
            inner = {ctypes.POINTER(L.STRUCTS[base])}
        elif base == "flashopt_comm_backend":
            inner = {ctypes.POINTER(L.CommBackend)}
        else:
            (t,) = self.ctypes_of(base)
            inner = {ctypes.POINTER(t)} | ({ctypes.c_void_p} if base == "float" else set())
        for _ in range(stars - 1):
            inner = {ctypes.POINTER(t) for t in inner}
        return inner


# flashopt.h with the parts of the ABI it includes (of flashopt_dist.h, the
# data-parallel part, the binding binds the externally reduced mode).
_TEXT = "\n".join((HEADER.parent / h).read_text()
                  for h in ("flashopt.h", "flashopt_state.h", "flashopt_dist.h"))
HDR = Header(_TEXT)
OPTIONAL_IN_HEADER = [n for n in L._OPTIONAL_SIGS if n in HDR.functions]


def test_the_parser_sees_the_header():
    # Guards the regular expressions: every declaration is parsed.
    decls = re.findall(r"^\s*FLASHOPT_API\b", _strip_comments(_TEXT), re.M)
    assert len(HDR.functions) == len(decls) >= 30
    assert HDR.functions["flashopt_set_grads"] == (
        "flashopt_status", ["flashopt_optimizer", "int64_t", "int64_t*", "void**",
                            "flashopt_dtype"])
    assert "flashopt_status" in HDR.enums and "flashopt_optimizer" in HDR.handles


@pytest.mark.parametrize("name", [*L._SIGS, *OPTIONAL_IN_HEADER])
def test_signature_matches_the_header(name):
    assert name in HDR.functions, f"{name} is bound in _lib.py but not declared in flashopt.h"
    ret, params = HDR.functions[name]
    res, args = L._SIGS.get(name) or L._OPTIONAL_SIGS[name]
    assert res in HDR.ctypes_of(ret), f"{name} returns {ret}, bound as {res}"
    assert len(args) == len(params), f"{name} takes {len(params)} arguments, bound with {len(args)}"
    for k, (a, p) in enumerate(zip(args, params)):
        assert a in HDR.ctypes_of(p), f"{name} argument {k} is {p}, bound as {a}"


@pytest.mark.parametrize("name", sorted(set(L._OPTIONAL_SIGS) - set(OPTIONAL_IN_HEADER)))
def test_optional_entry_points_not_in_this_header(name):
    # Bound only when the loaded library has them; checked above once the
    # header declares them.
    assert not L.has(name) or name in HDR.functions
    pytest.skip(f"{name} is not in flashopt.h yet (bound only when the library has it)")


@pytest.mark.parametrize("cname", sorted(L.STRUCTS))
def test_struct_matches_the_header(cname):
    fields = HDR.structs[cname]
    ours = L.STRUCTS[cname]._fields_
    assert [n for _, n in fields] == [n for n, _ in ours], cname
    for (ctype, n), (_, t) in zip(fields, ours):
        assert t in HDR.ctypes_of(ctype), f"{cname}.{n} is {ctype}, bound as {t}"


def test_comm_backend_matches_the_header():
    # The communicator table _comm.py fills: its members in the header's
    # order, the function pointers as C function types (the optional ones
    # the binding leaves NULL as plain pointers).
    fields = HDR.structs["flashopt_comm_backend"]
    ours = L.CommBackend._fields_
    assert [n for _, n in fields] == [n for n, _ in ours]
    for (ctype, n), (_, t) in zip(fields, ours):
        if ctype == "<fnptr>":
            assert t is ctypes.c_void_p or issubclass(t, ctypes._CFuncPtr), n
        else:
            assert t in HDR.ctypes_of(ctype), f"flashopt_comm_backend.{n} is {ctype}, bound as {t}"


def test_every_entry_point_the_package_calls_is_bound():
    called = set()
    for src in PACKAGE.glob("*.py"):
        text = src.read_text()
        called |= set(re.findall(r"""["'](flashopt_\w+)["']""", text))
        called |= set(re.findall(r"\.(flashopt_\w+)\(", text))
    assert called, "the scan found no calls"
    unbound = called - set(L._SIGS) - set(L._OPTIONAL_SIGS) - set(L.STRUCTS)
    assert not unbound, f"called but not in _SIGS: {sorted(unbound)}"


def test_status_names_come_from_the_library():
    assert L.status_name(0) == "FLASHOPT_OK"
    assert L.status_name(14) == "FLASHOPT_ERROR_NUMERICS"
    err = L.FlashOptError(3, "bad dtype")
    assert err.status == "FLASHOPT_ERROR_DTYPE" and "FLASHOPT_ERROR_DTYPE" in str(err)
    # Every code of the header's enum has the library's own name.
    text = _strip_comments(HEADER.read_text())
    body = re.search(r"typedef\s+enum\s+flashopt_status\s*\{([^}]*)\}", text).group(1)
    for name, value in re.findall(r"(FLASHOPT_\w+)\s*=\s*(\d+)", body):
        assert L.status_name(int(value)) == name
