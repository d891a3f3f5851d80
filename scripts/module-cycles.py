#!/usr/bin/env python3
"""Module cycles inside a crate, for structure reviews (issue 16).

Usage: scripts/module-cycles.py node-agent/src

Edges go from a file to the module file a `crate::a::b` or `super::x` path names (the longest prefix
that is a file); a child's references to its own parent are not edges. Prints each strongly connected
component of more than one file, then the count; `#[cfg(test)] mod tests` blocks are ignored.
Exit status 1 when there is a cycle."""
import os, re, sys
root = sys.argv[1]
files = {}
for dp, _, fs in os.walk(root):
    for f in fs:
        if f.endswith('.rs'):
            p = os.path.join(dp, f)
            rel = os.path.relpath(p, root)[:-3]
            parts = rel.split('/')
            if parts[-1] in ('mod', 'lib', 'main'):
                parts = parts[:-1]
            files[tuple(parts)] = p
def resolve(mod, path):
    # longest prefix that is a module file
    for n in range(len(path), 0, -1):
        if tuple(path[:n]) in files:
            return tuple(path[:n])
    return None
edges = {m: set() for m in files}
for mod, p in files.items():
    text = open(p).read()
    i = text.find('#[cfg(test)]\nmod tests')
    if i >= 0:
        text = text[:i]
    text = re.sub(r'//[^\n]*', '', text)
    for m in re.finditer(r'\b(crate|super)((?:::\w+)+)', text):
        segs = m.group(2).strip(':').split('::')
        # `super` of a/b.rs and of a/b/mod.rs is a.
        base = [] if m.group(1) == 'crate' else list(mod[:-1])
        target = resolve(mod, base + segs)
        if target and target != mod and target != tuple(mod[:len(target)]):
            edges[mod].add(target)
# Tarjan
index = {}; low = {}; stack = []; on = set(); sccs = []; counter = [0]
sys.setrecursionlimit(10000)
def strong(v):
    index[v] = low[v] = counter[0]; counter[0] += 1; stack.append(v); on.add(v)
    for w in edges[v]:
        if w not in index:
            strong(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: sccs.append(comp)
for v in list(edges):
    if v not in index: strong(v)
for c in sccs:
    print(' <-> '.join('::'.join(x) or 'lib' for x in sorted(c)))
print(f'{len(sccs)} cycles among {len(files)} files')
sys.exit(1 if sccs else 0)
