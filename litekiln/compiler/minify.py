"""Smaller OpenCL C and PTX for the cache: the same kernels, in fewer bytes (issue 16).

TVM prints OpenCL C for people: identifiers such as
``conv2d_nhwc_intermediate_reindex_pad_local_ptr`` (9,820 uses in one program),
``(convert_int(get_local_id(0)))`` at every index, two-space indentation, and a
``int cse_vN = ...;`` before most statements that nothing reads (its common-subexpression pass
names the value, then prints the expression again where it is used). selfie_segmentation's
program was 4.4 MB of such text (45 KB in xz); the cache compresses it, and every warm start
decompresses and parses all of it. Minified: 1.0 MB (26 KB in xz).

`minify_opencl` rewrites each kernel so that the driver sees the same program after
preprocessing, less unused declarations the driver's compiler removes anyway:

- drops declarations of scalars that nothing reads, when their initialiser is pure (index
  arithmetic: no call but the work-item built-ins and conversions, no memory access, no
  assignment), until none is left;
- renames each kernel's parameters and locals to the shortest names free in that kernel, in
  order of declaration (kernels of one shape then print alike, which also compresses better);
- writes ``(convert_int(get_group_id(0)))`` and its five siblings as macros (``G0``...
  ``L2``) defined once in the program's head;
- drops comments and whitespace the C grammar does not need: one kernel a line;
- orders the kernels by likeness (the text less its name and numbers), so that xz finds
  each kernel's twin of another size close by.

Kernel names are not changed here (the compiler names the kernels, `litekiln.compiler.codegen`);
each kernel keeps its ``// Function: <name>`` line, by which the runtime cuts a program to its
default kernels (`litekiln.runtime.build.default_program`). Preprocessor lines are kept as they
are. Whatever the lexer does not know (a string, a character it has no rule for) leaves the
source unminified (`MinifyError`); the output is checked to lex back into the tokens written.

`strip_ptx` drops PTX's comment-only lines, blank lines and indentation (nvcc's banner,
``// .globl``, ``// ... has been demoted``): nothing the driver reads. (Register names are
nvcc's and stay: a reversible renumbering of them saved 17% of the PTX's xz but took 160 ms
of Python to undo at every read.)

Pure Python and deterministic (same source, same output, whatever the number of processes).
"""

from __future__ import annotations

import itertools
import re
import string
from collections import Counter
from collections.abc import Iterator

from litekiln.artifact.program import FUNCTION_MARKER
from litekiln.compiler.parallel import fork_map

_TOKEN = re.compile(
    r"""
     \s+                                       # whitespace
    |//[^\n]*|/\*.*?\*/                        # comments
    |\#[^\n]*(?:\\\n[^\n]*)*                   # preprocessor lines
    |0[xX][0-9a-fA-F]+[uUlL]*|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?[fFhHuUlL]*   # numbers
    |[A-Za-z_]\w*                              # identifiers
    |<<=|>>=|->|\+\+|--|<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%&|^]=|[][(){};,.?:~!<>=+\-*/%&|^]
    """,
    re.S | re.X,
)

#: Scalar and vector type names (a declaration starts with one).
_TYPE = re.compile(
    r"(?:u?(?:char|short|int|long)|half|float|double|bool|size_t|void)(?:2|3|4|8|16)?"
)
_QUALIFIERS = frozenset({
    "__global", "__local", "__constant", "__private", "global", "local", "constant", "private",
    "const", "volatile", "restrict", "unsigned", "signed",
})  # fmt: skip
_KEYWORDS = frozenset({
    "if", "else", "for", "while", "do", "return", "break", "continue", "switch", "case",
    "default", "goto", "sizeof", "struct", "union", "enum", "typedef", "static", "inline",
    "auto", "register", "extern",
})  # fmt: skip
#: Calls an initialiser may hold and still be dropped when nothing reads it: they have no
#: effect but their value.
_PURE_CALLS = frozenset({
    "get_group_id", "get_local_id", "get_global_id", "get_num_groups", "get_local_size",
    "get_global_size", "convert_int", "convert_uint", "convert_long", "convert_ulong", "min",
    "max",
})  # fmt: skip
#: Work-item indices as TVM prints them, and the macro each becomes.
_MACROS = {
    f"(convert_int(get_{kind}_id({axis})))": f"{kind[0].upper()}{axis}"
    for kind in ("group", "local")
    for axis in range(3)
}
_ASSIGNING = frozenset({
    "=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>=", "++", "--",
})  # fmt: skip


class MinifyError(ValueError):
    """The source holds something the minifier does not handle; it stays as it is."""


def lex(source: str) -> list[str]:
    """``source`` as tokens, comments and whitespace included (they join back into it).

    Raises:
        MinifyError: a character no rule matches (a string literal, say).
    """
    tokens: list[str] = _TOKEN.findall(source)
    if sum(map(len, tokens)) != len(source) or "".join(tokens) != source:
        pos = 0
        for t in tokens:
            if not source.startswith(t, pos):
                break
            pos += len(t)
        raise MinifyError(f"cannot lex {source[pos : pos + 30]!r}")
    return tokens


def _is_id(token: str) -> bool:
    return token[0].isalpha() or token[0] == "_"


def minify_opencl(source: str, jobs: int = 1) -> str:
    """``source`` (TVM's OpenCL C of a program) minified; see the module docstring.

    ``jobs``: processes the kernels are minified in (`litekiln.compiler.parallel.fork_map`;
    the text does not depend on it).

    Raises:
        MinifyError: the source holds what the lexer does not know, or the result would not
            lex back into the tokens written.
    """
    # The macros first, as text: TVM prints the indices exactly so (each starts with "(" and
    # ends with ")", so no token is cut), and the lexer then has a ninth of the tokens to read.
    macros = [
        (text, name)
        for text, name in _MACROS.items()
        if text in source and not (name in source and re.search(rf"\b{name}\b", source))
    ]
    for text, name in macros:
        source = source.replace(text, name)
    head, *chunks = ("\n" + source).split("\n" + FUNCTION_MARKER)
    head_tokens = _code(lex(head))
    protected = {t for t in head_tokens if _is_id(t)} | set(_MACROS.values())
    out = [_join(head_tokens), *(f"#define {name} {text}\n" for text, name in macros)]
    split = [chunk.partition("\n") for chunk in chunks]  # (name line, "\n", kernel text)
    texts = fork_map(_minify_kernel, protected, [body for _, _, body in split], jobs, chunksize=8)
    kernels = [(name.strip(), text) for (name, _, _), text in zip(split, texts, strict=True)]
    if all(text.startswith("__kernel") for _, text in kernels):
        kernels.sort(key=_likeness)  # (helper functions, should TVM print any, stay first)
    out += [f"{FUNCTION_MARKER}{name}\n{text}" for name, text in kernels]
    return "".join(out)


def _minify_kernel(protected: set[str], body: str) -> str:
    """One kernel's text (after its ``// Function:`` line), minified."""
    return _join(_rename_locals(_drop_dead(_code(lex(body))), protected))


def _likeness(kernel: tuple[str, str]) -> str:
    """Sort key that puts kernels of one shape next to each other: the text without its
    name and numbers (a rule's kernels for other sizes differ in their constants). The
    compressor then finds each one's twin close by: 0.8% less xz (selfie_segmentation)."""
    name, text = kernel
    return re.sub(r"\d+", "#", text.replace(name, "", 1))


def _code(tokens: list[str]) -> list[str]:
    """The tokens the compiler reads (no whitespace, no comments)."""
    return [t for t in tokens if not (t[0].isspace() or t.startswith(("//", "/*")))]


def _drop_dead(tokens: list[str]) -> list[str]:
    """``tokens`` without declarations ``T x = <pure>;`` of scalars nothing reads."""
    while True:
        counts = Counter(tokens)
        out: list[str] = []
        i, dropped = 0, False
        while i < len(tokens):
            end = _dead_declaration(tokens, i, counts) if tokens[i] in _DECL_STARTS else 0
            if end:
                i, dropped = end, True
                continue
            out.append(tokens[i])
            i += 1
        tokens = out
        if not dropped:
            return tokens


#: Scalar types whose declarations may be unread (TVM's `int cse_vN`, and the like).
_DECL_STARTS = frozenset(f"{u}{t}" for u in ("", "u") for t in ("char", "short", "int", "long")) | {
    "half",
    "float",
    "double",
    "bool",
}


def _dead_declaration(tokens: list[str], i: int, counts: Counter[str]) -> int:
    """One past the ``;`` of an unread pure scalar declaration starting at ``i``, else 0."""
    if i + 3 >= len(tokens) or (i and tokens[i - 1] not in (";", "{", "}")):
        return 0  # not a statement of its own (a `for` loop's, say)
    name = tokens[i + 1]
    if not _is_id(name) or tokens[i + 2] != "=" or counts[name] != 1:
        return 0
    j = i + 3
    while j < len(tokens) and tokens[j] != ";":
        text = tokens[j]
        if text in _ASSIGNING or text in ("[", "{", "}", ",", "?"):
            return 0
        is_call = j + 1 < len(tokens) and tokens[j + 1] == "("
        if is_call and _is_id(text) and text not in _PURE_CALLS and not _TYPE.fullmatch(text):
            return 0
        j += 1
    return j + 1 if j < len(tokens) else 0


def _short_names(taken: set[str]) -> Iterator[str]:
    """a, b, ..., z, a0, ..., zz, ...: lowercase names not in ``taken``, no keyword or type."""
    first, rest = string.ascii_lowercase, string.ascii_lowercase + string.digits
    for size in itertools.count(1):
        for chars in itertools.product(first, *([rest] * (size - 1))):
            name = "".join(chars)
            if name not in taken and name not in _KEYWORDS and not _TYPE.fullmatch(name):
                yield name


def _declared(tokens: list[str], protected: set[str]) -> list[str]:
    """Names declared in ``tokens`` (parameters and locals), in order of first declaration:
    an identifier after a type, a qualifier or a ``*`` that follows one, and before one of
    ``[ = ; , )``."""
    out: dict[str, None] = {}
    for i in range(len(tokens) - 1):
        text = tokens[i]
        if tokens[i + 1] not in _DECL_ENDS or not _is_id(text) or text in protected:
            continue
        j = i - 1
        while j >= 0 and tokens[j] == "*":
            j -= 1
        if j >= 0 and (tokens[j] in _QUALIFIERS or _TYPE.fullmatch(tokens[j])):
            out.setdefault(text)
    return list(out)


_DECL_ENDS = frozenset("[=;,)")


def _rename_locals(tokens: list[str], protected: set[str]) -> list[str]:
    """``tokens`` with each declared name renamed to a short one free in the kernel."""
    taken = {t for t in tokens if _is_id(t)} | protected
    fresh = _short_names(taken)
    mapping = {name: next(fresh) for name in _declared(tokens, protected)}
    out = list(tokens)
    for i, text in enumerate(tokens):
        # (after `.` or `->` a name is a member, `.x` or `.s0`: not a variable)
        if text in mapping and not (i and tokens[i - 1] in (".", "->")):
            out[i] = mapping[text]
    return out


def _join(tokens: list[str]) -> str:
    """The tokens as text: a space only where two tokens would otherwise lex as others,
    preprocessor lines on lines of their own, the rest on one line (a kernel's).

    (One line per kernel rather than one per statement: 2% smaller compressed, and its JSON
    string, without a ``\\n`` escape per statement, parses in 60% of the time.)

    Raises:
        MinifyError: the text would not lex back into ``tokens``.
    """
    parts: list[str] = []
    prev = ""
    for text in tokens:
        if text[0] == "#":
            if parts and not parts[-1].endswith("\n"):
                parts.append("\n")
            parts.append(text + "\n")
            prev = ""
            continue
        if prev and _needs_space(prev, text):
            parts.append(" ")
        parts.append(text)
        prev = text
    out = "".join(parts)
    if out and not out.endswith("\n"):
        out += "\n"
    if _code(lex(out)) != tokens:
        raise MinifyError("the minified text does not lex back into the same tokens")
    return out


_SPACE_CACHE: dict[tuple[str, str], bool] = {}


def _needs_space(a: str, b: str) -> bool:
    """Whether ``a`` then ``b`` must be kept apart (else they lex as other tokens)."""
    if (a[-1].isalnum() or a[-1] == "_") and (b[0].isalnum() or b[0] == "_"):
        return True
    key = (a[-2:], b[:2])
    cached = _SPACE_CACHE.get(key)
    if cached is None:
        try:
            cached = _code(lex(key[0] + key[1])) != list(key)
        except MinifyError:
            cached = True
        _SPACE_CACHE[key] = cached
    return cached


_PTX_COMMENT_LINE = re.compile(r"^[ \t]*(?://[^\n]*)?\n", re.M)
_PTX_INDENT = re.compile(r"^[ \t]+", re.M)


def strip_ptx(ptx: str) -> str:
    """``ptx`` without comment-only lines, blank lines and indentation, its tabs as spaces
    (PTX separates tokens by any whitespace; it holds no string literal).

    Nothing the driver reads goes: nvcc's banner, ``// .globl``, ``// ... has been demoted``.
    A JSON string without a ``\\t`` escape a line parses in 60% of the time.
    """
    return _PTX_INDENT.sub("", _PTX_COMMENT_LINE.sub("", ptx)).replace("\t", " ")
