"""The ctypes declarations of `portcullis/_lib.py` match `ffi/include/portcullis.h`: every
function of the header is declared with the right number and kinds of arguments and result,
every struct has the header's fields in order with the same sizes (callback fields with the
same prototypes), and every constant has the header's value. A function, field or constant
added to the header and not to the package fails here, instead of drifting silently."""

import ctypes
import os
import re
import unittest

from portcullis import _lib, errors

HEADER = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "ffi", "include", "portcullis.h"
)

#: Header struct -> the package's ctypes class.
STRUCTS = {
    "pc_bytes": "Bytes",
    "pc_entity_view": "EntityView",
    "pc_apply_context": "ApplyContextC",
    "pc_slice": "Slice",
    "pc_written": "Written",
    "pc_deferred": "Deferred",
    "pc_warm_progress": "WarmProgress",
    "pc_revoke_progress": "RevokeProgress",
    "pc_engine_stats": "EngineStats",
    "pc_store_stats": "StoreStats",
    "pc_event": "Event",
    "pc_outcome": "Outcome",
    "pc_machine": "Machine",
}

SCALARS = {
    "uint8_t": ctypes.c_uint8,
    "uint32_t": ctypes.c_uint32,
    "uint64_t": ctypes.c_uint64,
    "size_t": ctypes.c_size_t,
    "bool": ctypes.c_bool,
}


def header_text():
    with open(HEADER, encoding="utf-8") as f:
        text = f.read()
    return re.sub(r"//[^\n]*", "", text)


def typedefs(text):
    """Scalar typedefs (`typedef uint32_t pc_flag;`) and function pointer typedefs."""
    scalars = {alias: base for base, alias in re.findall(r"typedef (\w+) (\w+);", text)}
    functions = {
        name: (ret.strip(), split_params(params))
        for ret, name, params in re.findall(
            r"typedef ([\w ]+?\**)\s*\(\*(\w+)\)\(([^;]*?)\);", text, re.S
        )
    }
    return scalars, functions


def split_params(params):
    params = " ".join(params.split())
    if params in ("", "void"):
        return []
    out, depth, current = [], 0, ""
    for c in params:
        if c == "," and depth == 0:
            out.append(current.strip())
            current = ""
            continue
        depth += c == "("
        depth -= c == ")"
        current += c
    out.append(current.strip())
    return out


def param_type(param):
    """The type of `const uint8_t *data` -> `const uint8_t *`."""
    param = param.strip()
    match = re.match(r"^(.*?)(\w+)$", param)
    return " ".join(match.group(1).split()).replace(" *", "*") if match else param


class Shapes:
    def __init__(self, text):
        self.scalars, self.functions = typedefs(text)

    def resolve(self, c_type):
        c_type = c_type.replace("const ", "").replace("struct ", "").strip()
        while c_type in self.scalars and c_type not in SCALARS:
            c_type = self.scalars[c_type]
        return c_type

    def matches(self, c_type, ctype, where):
        """Whether ctypes type `ctype` stands for C type `c_type`; raises with `where`."""
        resolved = self.resolve(c_type)
        if resolved == "void":
            ok = ctype is None
        elif resolved in SCALARS:
            want = SCALARS[resolved]
            ok = ctype is want or (
                ctype is not None
                and issubclass(ctype, ctypes._SimpleCData)
                and ctype._type_ == want._type_
            )
        elif resolved in self.functions:
            ok = self.prototype_matches(resolved, ctype, where)
        elif resolved.endswith("*"):
            ok = ctype is not None and (
                ctype in (ctypes.c_void_p, ctypes.c_char_p)
                or issubclass(ctype, (ctypes._Pointer, ctypes._CFuncPtr))
            )
        else:
            raise AssertionError(f"{where}: unknown C type {c_type!r}")
        if not ok:
            raise AssertionError(f"{where}: the header has {c_type!r}, the package {ctype!r}")
        return True

    def prototype_matches(self, typedef, ctype, where):
        ret, params = self.functions[typedef]
        if ctype is None or not issubclass(ctype, ctypes._CFuncPtr):
            raise AssertionError(f"{where}: {typedef} is a callback, the package has {ctype!r}")
        self.callback_matches(ret, params, ctype, where)
        return True

    def callback_matches(self, ret, params, ctype, where):
        if len(params) != len(ctype._argtypes_):
            raise AssertionError(
                f"{where}: {len(params)} parameters in the header, {len(ctype._argtypes_)} here"
            )
        self.matches(ret, ctype._restype_, f"{where} result")
        for i, (p, a) in enumerate(zip(params, ctype._argtypes_)):
            self.matches(param_type(p), a, f"{where} parameter {i}")


class HeaderTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.text = header_text()
        cls.shapes = Shapes(cls.text)

    def test_every_function_is_declared_as_the_header_says(self):
        found = re.findall(r"\n([\w][\w \*]*?)\s*\b(pc_\w+)\(([^;{]*?)\);", self.text, re.S)
        self.assertGreater(len(found), 60)
        names = set()
        for ret, name, params in found:
            names.add(name)
            with self.subTest(function=name):
                self.assertIn(name, _lib._SIGNATURES, f"{name} is not declared in _lib.py")
                declared = _lib._SIGNATURES[name]
                restype, argtypes = declared[0], list(declared[1])
                if len(declared) > 2 and declared[2]:
                    argtypes.append(ctypes.c_void_p)  # the trailing pc_error *err
                params = split_params(params)
                self.assertEqual(len(params), len(argtypes), f"{name}'s parameters")
                self.shapes.matches(ret.strip(), restype, f"{name} result")
                for i, (p, a) in enumerate(zip(params, argtypes)):
                    self.shapes.matches(param_type(p), a, f"{name} parameter {i} ({p})")
        self.assertEqual(set(_lib._SIGNATURES) - names, set(), "declared but not in the header")

    def test_every_struct_has_the_headers_fields(self):
        structs = re.findall(r"typedef struct (\w+) \{(.*?)\} \1;", self.text, re.S)
        self.assertEqual({name for name, _ in structs}, set(STRUCTS))
        for name, body in structs:
            with self.subTest(struct=name):
                cls = getattr(_lib, STRUCTS[name])
                fields = [f.strip() for f in body.split(";") if f.strip()]
                self.assertEqual(len(fields), len(cls._fields_), f"{name}'s fields")
                for field, (py_name, py_type) in zip(fields, cls._fields_):
                    callback = re.match(r"^(.*?)\(\*(\w+)\)\((.*)\)$", " ".join(field.split()))
                    if callback:
                        ret, c_name, params = callback.groups()
                        self.assertEqual(c_name, py_name)
                        self.shapes.callback_matches(
                            ret.strip(), split_params(params), py_type, f"{name}.{c_name}"
                        )
                        continue
                    c_name = field.split()[-1].lstrip("*")
                    self.assertEqual(c_name, py_name, f"{name}'s fields in order")
                    c_type = field[: field.rindex(c_name)].strip()
                    resolved = self.shapes.resolve(c_type)
                    if resolved.startswith("pc_") and not resolved.endswith("*"):
                        self.assertIs(py_type, getattr(_lib, STRUCTS[resolved]))
                    else:
                        self.shapes.matches(c_type, py_type, f"{name}.{c_name}")

    def test_every_constant_has_the_headers_value(self):
        defined = dict(re.findall(r"#define PC_(\w+) (\d+)", self.text))
        self.assertGreater(len(defined), 40)
        # Error codes are the exception classes' codes (PC_REFUSED is WriteRefused).
        classes = {"REFUSED": "WriteRefused", "IO": "Io"}
        codes = 0
        for name, value in defined.items():
            with self.subTest(constant=name):
                value = int(value)
                camel = "".join(w.capitalize() for w in name.split("_"))
                cls = getattr(errors, classes.get(name, camel), None)
                if name == "OK":
                    self.assertEqual(value, 0)
                elif isinstance(cls, type) and issubclass(cls, errors.PortcullisError):
                    self.assertEqual(cls.code, value, f"PC_{name}")
                    self.assertIs(errors.BY_CODE[value], cls)
                    codes += 1
                else:
                    self.assertEqual(getattr(_lib, name, None), value, f"PC_{name} in _lib.py")
        self.assertEqual(codes, len(errors.BY_CODE), "an exception class without a code")
