#!/usr/bin/env python3
"""Module cycles inside a crate, for structure reviews (issues 16 and 24).

Usage: scripts/module-cycles.py [--why] SRC_DIR...     e.g. scripts/module-cycles.py node-agent/src
       scripts/module-cycles.py --self-test

Each .rs file under SRC_DIR is a module (`a/b.rs` and `a/b/mod.rs` are `a::b`; `lib.rs` is the crate
root; `main.rs` beside a `lib.rs`, and `bin/*`, are roots of their own). The source is tokenized
(comments, doc comments and literals dropped; strings kept only as below), then every path is read:

  * `use` trees, parsed as trees: nested `{...}`, `self` in a group, `as` renames, `*` globs (the
    module itself), leading `crate::`, `super::` (repeated), `self::` or a child module's name;
  * paths elsewhere that start with `crate::`, `$crate::`, `super::`, `self::`, a child module or
    a name the module imports (`crate::a::b::f()` in an expression, `names::UPLINK`);
  * attribute strings that are such paths (`#[serde(with = "crate::a::b")]`).

A path names the module of its longest prefix that is a file; when the next segment is a name that
module imports (`pub use lab::Lab;` at the root), the path follows that import, so `crate::Lab` is
an edge to `lab`. Edges go from a file to the module a path names; a module's references to itself
or to its own ancestors are not edges. Items under `#[cfg(test)]` (`mod tests { ... }`, test-only
`mod fixtures;` files, test helpers) are ignored. Prints each strongly connected component of more
than one file, then the count; `--why` also prints the paths behind each edge inside a cycle.
Exit status 1 when there is a cycle. Not seen: names a glob brings in (`use crate::a::*` is an edge
to `a`, not to what `a` re-exports), macros used by textual scope, `#[path]` files."""
import os
import re
import sys
from collections import defaultdict

# ---------------------------------------------------------------- lexer


TOKEN = re.compile(r"""\s*(?:
    (?P<raw>(?:br|cr|r)(?P<hashes>\#*)"(?P<rawtext>.*?)"(?P=hashes))
  | (?P<str>[bc]?"(?P<text>(?:[^"\\]|\\.)*)")
  | (?P<char>b?'(?:[^'\\\n]|\\(?:u\{[0-9a-fA-F_]*\}|x[0-9a-fA-F]{2}|.))')
  | (?P<rawid>r\#(?P<rid>[^\W\d]\w*))
  | (?P<id>[^\W\d]\w*)
  | (?P<path>::)
  | (?P<line>//[^\n]*)
  | (?P<block>/\*)
  | (?P<lifetime>'[^\W\d]\w*)
  | (?P<num>\d\w*)
  | (?P<p>\S)
  | (?P<end>\Z)
)""", re.S | re.X)


def matches(text):
    """The TOKEN matches of `text`, block comments (which nest) skipped."""
    if '/*' not in text:
        yield from TOKEN.finditer(text)
        return
    pos, n = 0, len(text)
    while pos < n:
        m = TOKEN.match(text, pos)
        pos = m.end()
        if m.lastgroup != 'block':
            yield m
            continue
        depth = 1
        while pos < n and depth:
            a, b = text.find('/*', pos), text.find('*/', pos)
            if b < 0:
                pos = n
            elif 0 <= a < b:
                depth, pos = depth + 1, a + 2
            else:
                depth, pos = depth - 1, b + 2


def lex(text):
    """Tokens of Rust source: identifiers (`id`), `::`, single punctuation characters (`p`), the text
    of string literals (`str`, escapes kept); other literals are `lit`; comments (`//`, `///`, `//!`,
    nested `/* */`) and lifetimes are dropped."""
    toks = []
    append = toks.append
    for m in matches(text):
        kind = m.lastgroup
        if kind == 'id' or kind == 'p':
            append((kind, m.group(kind)))
        elif kind == 'path':
            append(('p', '::'))
        elif kind == 'str':
            append(('str', m.group('text')))
        elif kind == 'raw':
            append(('str', m.group('rawtext')))
        elif kind == 'rawid':
            append(('id', m.group('rid')))
        elif kind == 'num' or kind == 'char':
            append(('lit', ''))
    return toks


# ---------------------------------------------------------------- use trees


def parse_use_tree(toks, i, prefix=()):
    """Parses one use tree at toks[i]. Returns (next index, [(path, name, glob)]): `path` is the
    tuple of segments (a leading `::` is kept as a segment), `name` the name it binds (None for a
    glob or `as _`), `glob` whether it is `path::*`."""
    out = []
    segs = list(prefix)
    first = i
    if i < len(toks) and toks[i] == ('p', '::'):
        if not segs:
            segs.append('::')
        i += 1
    while i < len(toks):
        kind, val = toks[i]
        if (kind, val) == ('p', '*'):
            out.append((tuple(segs), None, True))
            return i + 1, out
        if (kind, val) == ('p', '{'):
            i += 1
            while i < len(toks) and toks[i] != ('p', '}'):
                start = i
                i, items = parse_use_tree(toks, i, tuple(segs))
                out += items
                if i < len(toks) and toks[i] == ('p', ','):
                    i += 1
                elif i == start:  # not a use tree: step over it
                    i += 1
            return i + 1, out
        if kind != 'id':
            break
        segs.append(val)
        i += 1
        if i < len(toks) and toks[i] == ('p', '::'):
            i += 1
            continue
        break
    name = segs[-1] if segs else None
    if segs and segs[-1] == 'self':  # `a::{self, b}`: `a` itself
        segs.pop()
        name = segs[-1] if segs else None
    if i + 1 < len(toks) and toks[i] == ('id', 'as'):
        alias = toks[i + 1][1]
        name = None if alias == '_' else alias
        i += 2
    if segs and i > first:
        out.append((tuple(segs), name, False))
    return i, out


def parse_use(text):
    """The (path, name, glob) entries of `use` declarations in `text` (for tests)."""
    toks = lex(text)
    out = []
    i = 0
    while i < len(toks):
        if toks[i] == ('id', 'use'):
            i, items = parse_use_tree(toks, i + 1)
            out += items
        else:
            i += 1
    return out


# ---------------------------------------------------------------- one file

ITEM_KEYWORDS = {'mod', 'fn', 'use', 'impl', 'struct', 'enum', 'trait', 'type', 'const', 'static',
                 'extern', 'unsafe', 'async', 'macro_rules', 'union', 'pub', 'default'}
ATTR_PATH = re.compile(r'\$?(crate|super|self)(::[A-Za-z_][A-Za-z0-9_]*)+$')
DEFINING = {'fn', 'struct', 'enum', 'trait', 'type', 'const', 'static', 'union', 'mod'}


def matching(toks, i):
    """Index after the group opened at toks[i] (`(`, `[` or `{`)."""
    depth = 0
    while i < len(toks):
        v = toks[i]
        if v[0] == 'p' and v[1] in '([{':
            depth += 1
        elif v[0] == 'p' and v[1] in ')]}':
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return i


def is_test_cfg(attr):
    """Whether attribute tokens (inside `#[...]`) are `cfg(test)` or `cfg(all(test, ...))`."""
    words = [v for _, v in attr]
    if words[:2] != ['cfg', '(']:
        return False
    return words[2:4] == ['test', ')'] or words[2:6] == ['all', '(', 'test', ',']


def skip_item(toks, i):
    """Index after the item or field/statement/arm starting at toks[i] (attributes already read)."""
    j = i
    while j < len(toks) and toks[j] == ('id', 'pub'):
        j += 1
        if j < len(toks) and toks[j] == ('p', '('):
            j = matching(toks, j)
    item = j < len(toks) and toks[j][0] == 'id' and toks[j][1] in ITEM_KEYWORDS
    while j < len(toks):
        kind, val = toks[j]
        if kind == 'p' and val in '([{':
            close = matching(toks, j)
            if val == '{' and item:
                return close
            j = close
            continue
        if kind == 'p' and val in ')]}':  # end of the enclosing group: stop before it
            return j
        if kind == 'p' and val == ';':
            return j + 1
        if kind == 'p' and val == ',' and not item:
            return j + 1
        j += 1
    return j


class FileInfo:
    def __init__(self):
        self.refs = []  # (scope, path, where): path as written, scope the module it is written in
        self.imports = defaultdict(dict)  # scope -> name -> path as written
        self.globs = defaultdict(list)  # scope -> [path as written]
        self.defines = defaultdict(set)  # scope -> names of items defined there
        self.test_children = set()  # child module names declared under #[cfg(test)]
        self.test_only = False  # #![cfg(test)]


def parse_file(text, mod):
    """Reads a module file whose module path is `mod`."""
    info = FileInfo()
    toks = lex(text)
    scope = list(mod)
    braces = []  # for each open `{`: whether it opened an inline `mod NAME {`
    i = 0
    while i < len(toks):
        kind, val = toks[i]
        if (kind, val) == ('p', '#'):
            inner = i + 1 < len(toks) and toks[i + 1] == ('p', '!')
            j = i + 2 if inner else i + 1
            if j < len(toks) and toks[j] == ('p', '['):
                end = matching(toks, j)
                test = is_test_cfg(toks[j + 1:end - 1])
                if inner:
                    if test and not braces:
                        info.test_only = True
                    i = end
                    continue
                # more attributes on the same item
                while end < len(toks) and toks[end] == ('p', '#') and end + 1 < len(toks) \
                        and toks[end + 1] == ('p', '['):
                    k = matching(toks, end + 1)
                    test = test or is_test_cfg(toks[end + 2:k - 1])
                    end = k
                if not test:  # `#[serde(with = "crate::a::b")]`: a path in a string, still code
                    for kind2, text2 in toks[i:end]:
                        if kind2 == 'str' and ATTR_PATH.match(text2):
                            info.refs.append((tuple(scope), tuple(text2.lstrip('$').split('::')),
                                              f'"{text2}"'))
                if test:
                    k = end
                    while k < len(toks) and toks[k] == ('id', 'pub'):
                        k += 1
                        if k < len(toks) and toks[k] == ('p', '('):
                            k = matching(toks, k)
                    if k + 2 < len(toks) and toks[k] == ('id', 'mod') and toks[k + 2] == ('p', ';'):
                        if len(scope) == len(mod):
                            info.test_children.add(toks[k + 1][1])
                    i = skip_item(toks, end)
                else:
                    i = end
                continue
            i += 1
            continue
        if (kind, val) == ('id', 'pub') and i + 1 < len(toks) and toks[i + 1] == ('p', '('):
            i = matching(toks, i + 1)  # pub(crate), pub(in crate::a): not references
            continue
        if (kind, val) == ('id', 'use') and not (i + 1 < len(toks) and toks[i + 1] == ('p', '<')):
            i, items = parse_use_tree(toks, i + 1)
            item_level = not braces or braces[-1]  # not a `use` inside a function body
            for path, name, glob in items:
                info.refs.append((tuple(scope), path, 'use ' + '::'.join(path) + ('::*' if glob else '')))
                if glob and item_level:
                    info.globs[tuple(scope)].append(path)
                elif name and item_level:
                    info.imports[tuple(scope)][name] = path
            continue
        if kind == 'id' and val in DEFINING and i + 1 < len(toks) and toks[i + 1][0] == 'id':
            if not braces or braces[-1]:  # items of the module, not of an impl or a body
                info.defines[tuple(scope)].add(toks[i + 1][1])
            if val == 'mod' and i + 2 < len(toks) and toks[i + 2] == ('p', '{'):
                scope.append(toks[i + 1][1])
                braces.append(True)
                i += 3
                continue
        if kind == 'id' and val == 'macro_rules' and i + 2 < len(toks) and toks[i + 1] == ('p', '!'):
            info.defines[tuple(scope)].add(toks[i + 2][1])
        if (kind, val) == ('p', '{'):
            braces.append(False)
        elif (kind, val) == ('p', '}'):
            if braces and braces.pop():
                scope.pop()
        elif kind == 'id' and i + 1 < len(toks) and toks[i + 1] == ('p', '::'):
            # a path's first segment (`$crate::` too); `a.b::<T>()` and `x::y::z` inner segments are not
            if not i or toks[i - 1] not in (('p', '::'), ('p', '.')):
                segs = [val]
                j = i + 1
                while j + 1 < len(toks) and toks[j] == ('p', '::') and toks[j + 1][0] == 'id':
                    segs.append(toks[j + 1][1])
                    j += 2
                info.refs.append((tuple(scope), tuple(segs), '::'.join(segs)))
                i = j
                continue
        i += 1
    return info


# ---------------------------------------------------------------- a crate


def module_files(root):
    """{module path: file} and {module path: its crate root} for the .rs files under `root`."""
    files, roots = {}, {}
    has_lib = os.path.exists(os.path.join(root, 'lib.rs'))
    for dp, _, fs in os.walk(root):
        for f in sorted(fs):
            if not f.endswith('.rs'):
                continue
            p = os.path.join(dp, f)
            parts = os.path.relpath(p, root)[:-3].split(os.sep)
            if parts == ['main'] and has_lib:
                key = crate = ('<main>',)
            elif parts[0] == 'bin' and len(parts) > 1:
                if len(parts) > 2 and parts[-1] == 'main':
                    parts = parts[:-1]
                key = tuple(['<bin>'] + parts[1:])
                crate = key[:2]
            else:
                if parts[-1] in ('mod', 'lib', 'main'):
                    parts = parts[:-1]
                key, crate = tuple(parts), ()
            files[key] = p
            roots[key] = crate
    return files, roots


class Crate:
    def __init__(self, root):
        self.files, self.roots = module_files(root)
        self.info = {}
        for m, p in self.files.items():
            with open(p, encoding='utf-8') as f:
                self.info[m] = parse_file(f.read(), m)
        # test-only files: declared under #[cfg(test)], #![cfg(test)], and everything below them
        test = {m for m, inf in self.info.items() if inf.test_only}
        for m, inf in self.info.items():
            test |= {m + (c,) for c in inf.test_children}
        self.test = {m for m in self.files if any(m[:len(t)] == t for t in test)}
        self.modules = [m for m in self.files if m not in self.test]

    def absolute(self, scope, path, depth=0):
        """The crate-absolute form of `path` written in module `scope`, or None (another crate)."""
        if not path or depth > 16:
            return None
        head = path[0]
        if head == '::':
            return None
        if head == 'crate':
            return self.crate_root(scope) + tuple(path[1:])
        if head in ('self', 'super'):
            base, rest = list(scope), list(path)
            while rest and rest[0] in ('self', 'super'):
                if rest.pop(0) == 'super':
                    if len(base) <= len(self.crate_root(scope)):
                        return None
                    base.pop()
            return tuple(base) + tuple(rest)
        if tuple(scope) + (head,) in self.files:  # a child module (2018 uniform paths)
            return tuple(scope) + tuple(path)
        alias = self.info_of(scope).imports.get(tuple(scope), {}).get(head)
        if alias is not None and alias != path:
            base = self.absolute(scope, alias, depth + 1)
            return None if base is None else base + tuple(path[1:])
        return None

    def crate_root(self, scope):
        f = self.file_of(scope)
        return self.roots[f] if f is not None else ()

    def file_of(self, path):
        for n in range(len(path), -1, -1):
            if tuple(path[:n]) in self.files:
                return tuple(path[:n])
        return None

    def info_of(self, scope):
        f = self.file_of(scope)
        return self.info[f] if f is not None else FileInfo()

    def resolve(self, path, depth=0):
        """The module file a crate-absolute path names, following imports of the module it passes."""
        f = self.file_of(path)
        if f is None or depth > 16:
            return f
        n = len(f)
        if n == len(path):
            return f
        name = path[n]
        inf = self.info[f]
        alias = inf.imports.get(f, {}).get(name)
        if alias is not None:
            target = self.absolute(f, alias)
            if target is not None and target != tuple(path[:n + 1]):
                return self.resolve(target + tuple(path[n + 1:]), depth + 1)
            return f
        if name in inf.defines.get(f, ()):
            return f
        for g in inf.globs.get(f, ()):  # `pub use x::*`: follow the glob whose module has the name
            base = self.absolute(f, g)
            if base is not None and base in self.files and self.has(base, name):
                return self.resolve(base + (name,), depth + 1)
        return f

    def has(self, mod, name):
        inf = self.info[mod]
        return name in inf.defines.get(mod, ()) or name in inf.imports.get(mod, {}) \
            or mod + (name,) in self.files

    def edges(self):
        """{module: {target: [paths as written]}} over the non-test modules."""
        out = {m: defaultdict(list) for m in self.modules}
        for m in self.modules:
            for scope, path, where in self.info[m].refs:
                a = self.absolute(scope, path)
                if a is None:
                    continue
                t = self.resolve(a)
                if t is None or t in self.test or t == m or t == m[:len(t)]:
                    continue
                out[m][t].append(where)
        return out


def strongly_connected(edges):
    """Components of more than one node (Tarjan, iterative)."""
    index, low, on, stack, sccs = {}, {}, set(), [], []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    sccs.append(sorted(comp))
    return sccs


def name(m):
    return '::'.join(m) or 'lib'


def report(root, why=False, prefix='', out=None):
    out = out or sys.stdout
    crate = Crate(root)
    edges = crate.edges()
    sccs = strongly_connected(edges)
    for c in sccs:
        print(prefix + ' <-> '.join(name(x) for x in c), file=out)
        if why:
            for a in c:
                for b in c:
                    if b in edges[a]:
                        paths = sorted(set(edges[a][b]))
                        print(f'{prefix}    {name(a)} -> {name(b)}: {", ".join(paths)}', file=out)
    print(f'{prefix}{len(sccs)} cycles among {len(crate.modules)} files', file=out)
    return len(sccs)


def main(argv):
    if argv[:1] == ['--self-test']:
        import unittest
        unittest.main(argv=[sys.argv[0]] + argv[1:], module=__name__, exit=True)
    why = '--why' in argv
    roots = [a for a in argv if a != '--why']
    if not roots:
        print(__doc__, file=sys.stderr)
        return 2
    cycles = 0
    for root in roots:
        cycles += report(root, why, f'{root}: ' if len(roots) > 1 else '')
    return 1 if cycles else 0


# ---------------------------------------------------------------- self-test

import unittest  # noqa: E402


class UseTrees(unittest.TestCase):
    CASES = [
        ('grouped', 'use crate::{a::b, d::e};',
         [(('crate', 'a', 'b'), 'b', False), (('crate', 'd', 'e'), 'e', False)]),
        ('nested group', 'use crate::{a::{b, c::{D, E}}, f};',
         [(('crate', 'a', 'b'), 'b', False), (('crate', 'a', 'c', 'D'), 'D', False),
          (('crate', 'a', 'c', 'E'), 'E', False), (('crate', 'f'), 'f', False)]),
        ('super::super', 'use super::super::x::Y;', [(('super', 'super', 'x', 'Y'), 'Y', False)]),
        ('glob', 'use crate::names::*;', [(('crate', 'names'), None, True)]),
        ('self in group', 'use crate::names::{self, NetnsNames};',
         [(('crate', 'names'), 'names', False), (('crate', 'names', 'NetnsNames'), 'NetnsNames', False)]),
        ('rename', 'use crate::a::B as C; use crate::t::Tr as _;',
         [(('crate', 'a', 'B'), 'C', False), (('crate', 't', 'Tr'), None, False)]),
        ('self path', 'pub(crate) use self::inner::{X, y::*};',
         [(('self', 'inner', 'X'), 'X', False), (('self', 'inner', 'y'), None, True)]),
        ('leading ::', 'use ::std::fmt;', [(('::', 'std', 'fmt'), 'fmt', False)]),
        ('not a use tree inside a group', 'use crate::{a, #, b};',
         [(('crate', 'a'), 'a', False), (('crate', 'b'), 'b', False)]),
        ('comments and strings', 'use crate::{a /* , b */, // c\n d}; const S: &str = "use crate::z;";',
         [(('crate', 'a'), 'a', False), (('crate', 'd'), 'd', False)]),
        ('trailing comma, multi-line', 'use crate::{\n    a::{B, C,},\n    d,\n};',
         [(('crate', 'a', 'B'), 'B', False), (('crate', 'a', 'C'), 'C', False), (('crate', 'd'), 'd', False)]),
    ]

    def test_cases(self):
        for label, src, want in self.CASES:
            with self.subTest(label):
                self.assertEqual(parse_use(src), want)

    def test_lexer_drops_comments_strings_chars(self):
        src = '/* a /* nested */ crate::x */ /// doc crate::y\n//! crate::z\nlet c = \'"\'; ' \
              'let s = r#"crate::w "quoted""#; let l: &\'a str = b"crate::v"; crate::u::f();'
        ids = [v for k, v in lex(src) if k == 'id']
        self.assertEqual([i for i in ids if i in 'xyzwvu'], ['u'])


FIXTURES = {
    'cycle': {
        'lib.rs': 'pub mod layout;\nmod pods;\npub use layout::Layout;\n',
        'layout.rs': '//! uses pods\nuse crate::{error::Result, pods::{self, Draft}};\npub struct Layout;\n',
        'pods.rs': 'use crate::{\n    layout::{LabNode, LabPod},\n};\npub struct Draft;\n',
        'error.rs': 'pub type Result<T> = std::result::Result<T, ()>;\n',
    },
    'acyclic': {
        'lib.rs': 'pub mod layout;\nmod pods;\nmod kube;\n',
        'layout.rs': 'use crate::{error::Result, pods::{self, Draft}};\nuse super::kube::*;\n',
        'pods.rs': 'use crate::error::Result;\n// use crate::layout::X;\n/* crate::layout::Y */\n'
                   'const S: &str = "crate::layout::Z";\n'
                   '#[cfg(test)]\nmod tests {\n    use crate::layout::LabNode;\n}\n'
                   '#[cfg(test)]\nmod fixtures;\n',
        'pods/fixtures.rs': 'use crate::layout::LabPod;\n',
        'error.rs': '',
        'kube/mod.rs': 'mod a;\nmod b;\npub use self::a::A;\n',
        'kube/a.rs': 'use super::super::error::Result;\nuse super::b::B;\n',
        'kube/b.rs': 'pub struct B;\nfn f() { crate::error::g(); }\n',
    },
    # serde's `with = "path"`: a path in a string that is code
    'attribute': {
        'lib.rs': 'mod a;\nmod b;\n',
        'a.rs': '#[derive(Deserialize)]\nstruct S {\n    #[serde(deserialize_with = "crate::b::entries")]\n'
                '    x: u8,\n}\npub fn g() {}\n',
        'b.rs': 'pub fn entries() { let _ = "crate::z"; crate::a::g(); }\n',
    },
    # a cycle only visible through super::super, a glob, a rename and a root re-export
    'indirect': {
        'lib.rs': 'mod a;\nmod b;\nmod c;\npub use c::Thing;\n',
        'a/mod.rs': 'mod inner;\n',
        'a/inner.rs': 'use super::super::b::*;\n',
        'b.rs': 'use crate::Thing as T;\n',
        'c.rs': 'pub struct Thing;\nfn f() { crate::a::inner::g(); }\n',
    },
}


class Fixtures(unittest.TestCase):
    def run_fixture(self, files, *args):
        import io
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            for rel, text in files.items():
                p = os.path.join(d, rel)
                os.makedirs(os.path.dirname(p), exist_ok=True)
                with open(p, 'w') as f:
                    f.write(text)
            out = io.StringIO()
            real, sys.stdout = sys.stdout, out
            try:
                code = main([d] + list(args))
            finally:
                sys.stdout = real
            return code, out.getvalue()

    def test_two_file_cycle_found(self):
        code, out = self.run_fixture(FIXTURES['cycle'], '--why')
        self.assertEqual(code, 1)
        self.assertIn('layout <-> pods\n', out)
        self.assertIn('layout -> pods: use crate::pods, use crate::pods::Draft', out)
        self.assertIn('1 cycles among 4 files', out)

    def test_acyclic(self):
        code, out = self.run_fixture(FIXTURES['acyclic'])
        self.assertEqual((code, out), (0, '0 cycles among 7 files\n'))

    def test_attribute_path_cycle(self):
        code, out = self.run_fixture(FIXTURES['attribute'], '--why')
        self.assertEqual(code, 1)
        self.assertIn('a -> b: "crate::b::entries"', out)

    def test_indirect_cycle(self):
        code, out = self.run_fixture(FIXTURES['indirect'])
        self.assertEqual(code, 1)
        self.assertIn('a::inner <-> b <-> c\n', out)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
