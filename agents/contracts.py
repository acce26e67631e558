"""What a variant's kernel-level promises must keep, checked on its source whoever made it (step 4
of the workflow, beside the dependence graph): the promises a compiler takes on trust and a wrong
one turns into a crash or a wrong result rather than a build error.

- `__launch_bounds__(T, ...)`: no launch of the kernel has more than T threads per block.
- a pointer parameter made `__restrict__`: at no launch does its argument share memory with
  another argument of the kernel that the kernel writes (agents.launch_sites.may_alias), nor,
  when it is written itself, with any other argument.
- a vector access (`*reinterpret_cast<float4*>(&p[...])`): it sits under a test of p's alignment.

Only what the variant adds is checked: a bound, a `__restrict__` or a vector access the original
already had is the program's own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from agents import _ts
from agents.cuda_source import analyze
from agents.launch_sites import LaunchSite, instance_of, launch_sites
from agents.regions import pretty
from agents.source_model import Kernel, SourceModel, written_params

CUDA_SOURCES = (".cu", ".cuh", ".h", ".hpp", ".cpp", ".cc", ".cxx")  # files a kernel or its launch may be in
_VECTOR_ACCESS = re.compile(r"reinterpret_cast\s*<\s*(?:const\s+)?\w+[24]\s*\*\s*>\s*\(\s*&?\s*\(?\s*([A-Za-z_]\w*)")


def violations(original: Mapping[str, str], patched: Mapping[str, str],
               defines: Mapping[str, str] | None = None) -> list[str]:
    """Every broken promise of the patched files, as `path: what`."""
    problems = []
    for path, text in patched.items():
        if path not in original or not path.endswith(CUDA_SOURCES):
            continue
        before, after = analyze(original[path], path, defines=defines), analyze(text, path, defines=defines)
        sites = launch_sites(after)
        problems += [f"{path}: {p}" for p in launch_bound_violations(before, after, sites)]
        problems += [f"{path}: {p}" for p in restrict_violations(before, after, sites)]
        problems += [f"{path}: {p}" for p in vector_violations(original[path], text)]
    return problems


def _kernel(model: SourceModel, name: str) -> Kernel | None:
    return next((k for k in model.kernels if k.name == name), None)


def launch_bound_violations(before: SourceModel, after: SourceModel, sites: list[LaunchSite]) -> list[str]:
    changed = {k.name for k in after.kernels if k.launch_bounds is not None
               and (old := _kernel(before, k.name)) is not None and old.launch_bounds != k.launch_bounds}
    out = []
    for site in (s for s in sites if s.launch.kernel in changed):
        kernel = instance_of(after, site.launch)
        bound = kernel.launch_bounds.max_threads_value if kernel is not None and kernel.launch_bounds else None
        threads = site.threads(after)
        if bound is not None and threads is not None and threads > bound:
            out.append(f"{site.launch.kernel} declares __launch_bounds__({bound}) but is launched with {threads} "
                       f"threads per block (line {site.launch.line})")
    return out


def restrict_violations(before: SourceModel, after: SourceModel, sites: list[LaunchSite]) -> list[str]:
    out = []
    for kernel in after.kernels:
        old = _kernel(before, kernel.name)
        added = [p.name for p in kernel.params if p.is_restrict and p.is_pointer and (
            old is None or not any(q.name == p.name and q.is_restrict for q in old.params))]
        written = written_params(kernel)
        for site in (s for s in sites if s.launch.kernel == kernel.name and added):
            regions = site.regions(kernel)
            for name in (n for n in added if n in regions):
                others = [q for q in regions if q != name and (name in written or q in written)]
                shared = next((q for q in others if site.may_alias(regions[name], regions[q])), None)
                if shared is not None:
                    out.append(f"{kernel.name}'s {name} is __restrict__ but its argument `{_arg(site, kernel, name)}` "
                               f"may share memory with {shared}'s `{_arg(site, kernel, shared)}`, which the kernel "
                               f"{'writes' if shared in written else 'reads'} (line {site.launch.line})")
    return out


def _arg(site: LaunchSite, kernel: Kernel, param: str) -> str:
    return pretty(site.launch.bound_args(kernel).get(param, "?"))


def vector_violations(original: str, patched: str) -> list[str]:
    """Vector accesses the patch adds that no enclosing `if` tests the alignment of."""
    known = {m.group(0) for m in _VECTOR_ACCESS.finditer(original)}
    root = _ts.parser().parse(_ts.preprocess(patched.encode("utf-8", "surrogateescape")).masked).root_node
    out = []
    for node in _ts.walk(root):
        if node.type != "call_expression" or _ts.callee_name(node) != "reinterpret_cast":
            continue
        access = _VECTOR_ACCESS.match(_ts.text(node))
        if access is None or access.group(0) in known:
            continue
        pointer = access.group(1)
        guards = [_ts.text(a.child_by_field_name("condition") or a) for a in _ts.ancestors(node)
                  if a.type == "if_statement" and _within(node, a.child_by_field_name("consequence"))]
        if not any(re.search(rf"\b{re.escape(pointer)}\b", g) and re.search(r"%\s*(?:16|8)\b|&\s*(?:15|7)\b", g)
                   for g in guards):
            out.append(f"the vector access `{_ts.squash(_ts.text(node))}` (line {node.start_point[0] + 1}) is not "
                       f"under a test of {pointer}'s alignment")
    return out


def _within(node: _ts.Node, outer: _ts.Node | None) -> bool:
    return outer is not None and outer.start_byte <= node.start_byte and node.end_byte <= outer.end_byte
