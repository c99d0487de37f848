"""Mangled symbol names as their source names, without parameters.

Rust code in the kernel (binder, ashmem) prints frames mangled by Rust's v0 scheme
(``_RNvMs3_NtCs..._11rust_binder7processNtB5_7Process10update_ref``) and C++ test
symbols by the Itanium one (``_Z8fakeNameiii``).  A title names the function as its
author wrote it, ``<rust_binder::process::Process>::update_ref`` and ``fakeName``, and
frames to skip (``__rustc::rust_begin_unwind``) are written so too.  Only what frames
use is read: crate roots, nested names, inherent and trait impls, back-references and
plain Itanium names; anything else is returned as it came.
"""

from __future__ import annotations

import re

_BASE62 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def demangle(name: str) -> str:
    """`name` demangled if it is a Rust v0 or simple Itanium symbol, else unchanged."""
    try:
        if name.startswith("_R"):
            return _RustV0(name[2:]).path()
        if name.startswith("_Z"):
            return _itanium(name[2:]) or name
    except (IndexError, ValueError):
        pass
    return name


def _itanium(text: str) -> str:
    nested = text.startswith("N")
    parts = re.findall(r"(\d+)", text[1:] if nested else text)
    out, pos = [], 1 if nested else 0
    for _ in parts:
        m = re.match(r"\d+", text[pos:])
        if m is None:
            break
        length = int(m.group())
        pos += len(m.group())
        out.append(text[pos:pos + length])
        pos += length
        if not nested:
            break
    return "::".join(out)


class _RustV0:
    """A recursive reader over the part after ``_R`` (positions are back-reference targets)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def _next(self) -> str:
        ch = self.text[self.pos]
        self.pos += 1
        return ch

    def _base62(self) -> int:
        if self.text[self.pos] == "_":
            self.pos += 1
            return 0
        value = 0
        while (ch := self._next()) != "_":
            value = value * 62 + _BASE62.index(ch)
        return value + 1

    def _disambiguator(self) -> None:
        if self.text[self.pos] == "s":
            self.pos += 1
            self._base62()

    def _ident(self) -> str:
        self._disambiguator()
        m = re.match(r"\d+", self.text[self.pos:])
        if m is None:
            raise ValueError("identifier without length")
        self.pos += len(m.group())
        if self.text[self.pos] == "_":
            self.pos += 1
        length = int(m.group())
        ident = self.text[self.pos:self.pos + length]
        self.pos += length
        return ident

    def _backref(self) -> str:
        target = self._base62()
        saved, self.pos = self.pos, target
        try:
            return self.path()
        finally:
            self.pos = saved

    def path(self) -> str:
        tag = self._next()
        if tag == "C":
            return self._ident()
        if tag == "N":
            self._next()  # namespace: a value, a type, a closure...
            parent = self.path()
            ident = self._ident()
            return f"{parent}::{ident}" if ident else parent
        if tag == "M":
            self._disambiguator()
            self.path()  # where the impl is: not printed
            return f"<{self.path()}>"
        if tag == "X":
            self._disambiguator()
            self.path()
            impl_type = self.path()
            return f"<{impl_type} as {self.path()}>"
        if tag == "B":
            return self._backref()
        raise ValueError(f"unread path tag {tag!r}")
