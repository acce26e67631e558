"""The analysis of a CUDA source file for the rule-based experts: ``analyze`` reads its kernels
(parameters, loops, shared arrays and their accesses, the pointers each writes through), its
launches, and the order of the host's CUDA operations into a ``SourceModel`` (agents.source_model).

The parse is tree-sitter's CUDA grammar over the preprocessed text (agents._ts says why and
how); a file the grammar cannot fully read still yields what it could, with `errors`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace

from agents import _ts
from agents._tree_index import find_all
from agents._ts import (
    ConstEnv,
    Node,
    ancestors,
    arguments,
    callee_name,
    continues_subscript,
    declared_name,
    is_store,
    name_node,
    pointer_names,
    squash,
    stored_through,
    subscript_chain,
    text,
    trip_count,
    unwrap,
    walk,
)
from agents.source_model import (
    HostOp,
    HostOpKind,
    Kernel,
    Launch,
    LaunchBounds,
    Loop,
    Param,
    ParseIssue,
    SharedAccess,
    SharedArray,
    SourceModel,
    Span,
    TemplateParam,
    UnrollPragma,
)

_LOOPS = {"for_statement": "for", "for_range_loop": "for", "while_statement": "while", "do_statement": "do"}
_LOOP_TYPES = frozenset(_LOOPS)
_FUNCTIONS = frozenset({"function_definition"})
_DECLARATIONS = frozenset({"declaration"})
_IDENTIFIERS = frozenset({"identifier"})
_SUBSCRIPTS = frozenset({"subscript_expression"})
_CALLS = frozenset({"call_expression"})
_FILE_DECLARATIONS = frozenset({"declaration", "field_declaration"})
# api -> (kind, dst, src, direction, stream): argument positions, None where the call has none.
_HOST_APIS: dict[str, tuple[HostOpKind, int | None, int | None, int | None, int | None]] = {
    "cudaMemcpy": (HostOpKind.MEMCPY, 0, 1, 3, None),
    "cudaMemcpyAsync": (HostOpKind.MEMCPY, 0, 1, 3, 4),
    "cudaMemcpy2D": (HostOpKind.MEMCPY, 0, 2, 6, None),
    "cudaMemcpy2DAsync": (HostOpKind.MEMCPY, 0, 2, 6, 7),
    "cudaMemcpyToSymbol": (HostOpKind.MEMCPY, 0, 1, 4, None),
    "cudaMemcpyToSymbolAsync": (HostOpKind.MEMCPY, 0, 1, 4, 5),
    "cudaMemcpyFromSymbol": (HostOpKind.MEMCPY, 0, 1, 4, None),
    "cudaMemcpyFromSymbolAsync": (HostOpKind.MEMCPY, 0, 1, 4, 5),
    "cudaMemset": (HostOpKind.MEMSET, 0, None, None, None),
    "cudaMemsetAsync": (HostOpKind.MEMSET, 0, None, None, 3),
    "cudaDeviceSynchronize": (HostOpKind.DEVICE_SYNC, None, None, None, None),
    "cudaStreamSynchronize": (HostOpKind.STREAM_SYNC, None, None, None, 0),
    "cudaEventSynchronize": (HostOpKind.EVENT_SYNC, None, None, None, None),
    "cudaStreamCreate": (HostOpKind.STREAM_CREATE, None, None, None, None),
    "cudaStreamCreateWithFlags": (HostOpKind.STREAM_CREATE, None, None, None, None),
    "cudaStreamCreateWithPriority": (HostOpKind.STREAM_CREATE, None, None, None, None),
    "cudaEventRecord": (HostOpKind.EVENT_RECORD, None, None, None, 1),
    "cudaEventRecordWithFlags": (HostOpKind.EVENT_RECORD, None, None, None, 1),
    "cudaStreamWaitEvent": (HostOpKind.STREAM_WAIT_EVENT, None, None, None, 0),
}
_DEFAULT_DIRECTION = {"cudaMemcpyToSymbol": "cudaMemcpyHostToDevice", "cudaMemcpyFromSymbol": "cudaMemcpyDeviceToHost"}


def analyze(source: str, path: str = "", *, defines: Mapping[str, str | int] | None = None) -> SourceModel:
    """Analyse one CUDA file. `defines` act as -D options: they win over the file's defaults."""
    return _Analysis(source, path, {k: str(v) for k, v in (defines or {}).items()}).model()


class _Analysis:
    """One file's analysis: the parse, its constants, and one method per fact extracted."""

    def __init__(self, source: str, path: str, defines: dict[str, str]) -> None:
        raw = source.encode("utf-8", "surrogateescape")
        self.path = path
        self.pre = _ts.preprocess(raw, defines)
        self.root, self.skipped = _parse_recovering(self.pre.masked)
        self.char_of = None if source.isascii() else _char_offsets(raw)
        self.lines = self.pre.clean.split(b"\n")
        self.functions = {declared_name(n.child_by_field_name("declarator")) for n in find_all(self.root, _FUNCTIONS)}
        self.function_envs: dict[int, ConstEnv] = {}
        self.env = file_env(self.root, self.pre.macros)

    def model(self) -> SourceModel:
        launches, ops = self.host_ops()
        kernels = [(self.kernel(n), n) for n in find_all(self.root, _FUNCTIONS) if _is_kernel(n)]
        file_shared = [self.with_accesses(array, [(k.name, fn) for k, fn in kernels], self.env)
                       for node in find_all(self.root, _DECLARATIONS, _FUNCTIONS) for array in self.shared(node, None)]
        instances = [i for k, fn in kernels for i in self.instances(k, fn, launches)]
        values = {name: self.env.value(name) for name in [*self.pre.macros, *self.env.declared]}
        return SourceModel(
            path=self.path, kernels=tuple(k for k, _ in kernels),
            shared=tuple(s for k, _ in kernels for s in k.shared) + tuple(file_shared),
            launches=tuple(launches), host_ops=tuple(ops), errors=tuple(self.errors()), instances=tuple(instances),
            macros=dict(self.pre.macros), constants={k: v for k, v in values.items() if v is not None},
            root=self.root, clean=self.pre.clean,
        )

    # -- positions and text ----------------------------------------------------------------
    def span(self, node: Node) -> Span:
        start, end = node.start_byte, node.end_byte
        if self.char_of is not None:
            start, end = self.char_of[start], self.char_of[end]
        return Span(node.start_point[0] + 1, node.end_point[0] + 1, start, end)

    def text(self, node: Node | None, end: int | None = None) -> str:
        """The source of `node` (up to byte `end`) with comments blanked and whitespace squashed."""
        if node is None:
            return ""
        return squash(self.pre.clean[node.start_byte : end or node.end_byte].decode("utf-8", "replace"))

    def errors(self) -> list[ParseIssue]:
        issues = [ParseIssue(line, f"syntax error at {what!r}: the line was left out to read the rest")
                  for line, what in self.skipped]
        for node in _ts.errors_under(self.root):
            what = f"missing {node.type!r}" if node.is_missing else f"syntax error at {self.text(node)[:60]!r}"
            issues.append(ParseIssue(node.start_point[0] + 1, what))
        return sorted(issues, key=lambda issue: issue.line)

    def scope_env(self, body: Node, hidden: set[str]) -> ConstEnv:
        """File constants, less the names a function rebinds (`hidden` and its locals), plus its own."""
        return scope_env(self.env, body, hidden)

    # -- kernels ---------------------------------------------------------------------------
    def kernel(self, fn: Node, binding: Mapping[str, int | str] | None = None) -> Kernel:
        """The kernel defined by `fn`; with `binding`, the instance for those template arguments."""
        binding = binding or {}
        declarator = next((n for n in walk(fn.child_by_field_name("declarator") or fn, frozenset({"parameter_list"}))
                           if n.type == "function_declarator"), None)
        name = declared_name(declarator)
        template = fn.parent if fn.parent is not None and fn.parent.type == "template_declaration" else None
        template_params = self.template_params(template)
        plist = declarator.child_by_field_name("parameters") if declarator is not None else None
        params = tuple(self.param(p) for p in (plist.named_children if plist is not None else ())
                       if p.type.endswith("parameter_declaration") and p.child_by_field_name("declarator"))
        body = fn.child_by_field_name("body") or fn
        template_names = {t.name for t in template_params} - set(binding)
        env = self.scope_env(body, template_names | {p.name for p in params})
        for bound, value in binding.items():
            if isinstance(value, int):
                env.bind(bound, value)
            else:
                env.types[bound] = value
        bounds = next((c for c in fn.children if c.type == "launch_bounds"), None)
        effects = _Effects(params, body)
        return Kernel(
            name=name, template_params=template_params, params=params, launch_bounds=self.launch_bounds(bounds, env),
            span=self.span(template or fn), body=self.span(body), loops=tuple(self.loops(body, env, template_names)),
            shared=tuple(self.with_accesses(a, [(name, fn)], env) for n in find_all(body, _DECLARATIONS)
                         for a in self.shared(n, name)),
            writes=frozenset(effects.writes), may_write=frozenset(effects.may_write - effects.writes),
            reads=frozenset(effects.reads), template_values=tuple(binding.items()),
            single_element=frozenset(effects.single_element()),
        )

    def instances(self, kernel: Kernel, fn: Node, launches: list[Launch]) -> list[Kernel]:
        """`kernel` once per distinct binding of its template parameters among `launches`."""
        if not kernel.template_params:
            return [kernel]
        bindings: list[dict[str, int | str]] = []
        for launch in launches:
            if launch.kernel == kernel.name and (binding := self.binding(kernel, launch)) not in bindings:
                bindings.append(binding)
        bindings = [b for b in bindings if b] or [self.binding(kernel, None)]
        return [self.kernel(fn, b) for b in bindings] if any(bindings) else [kernel]

    def binding(self, kernel: Kernel, launch: Launch | None) -> dict[str, int | str]:
        """The template arguments `launch` gives `kernel`, defaults (evaluated with the earlier
        arguments) for those it leaves out; a parameter that resolves to nothing is left out."""
        given = launch.template_values if launch is not None else ()
        env, out = self.env.child(), {}
        for i, param in enumerate(kernel.template_params):
            value = given[i] if i < len(given) else None
            if value is None and param.default is not None:
                value = param.default if param.kind == "type" else env.eval_text(param.default)
            if isinstance(value, int) and param.kind == "value":
                env.bind(param.name, value)
            elif isinstance(value, str) and param.kind == "type":
                env.types[param.name] = value
            else:
                continue
            out[param.name] = value
        return out

    def template_params(self, template: Node | None) -> tuple[TemplateParam, ...]:
        plist = template.child_by_field_name("parameters") if template is not None else None
        result = []
        for p in plist.named_children if plist is not None else ():
            default = self.text(p.child_by_field_name("default_value") or p.child_by_field_name("default_type")) or None
            if p.type in ("parameter_declaration", "optional_parameter_declaration"):
                result.append(TemplateParam(declared_name(p.child_by_field_name("declarator")), "value",
                                            self.text(p.child_by_field_name("type")), default))
            elif p.type.endswith("type_parameter_declaration"):
                name = p.child_by_field_name("name") or next(
                    (c for c in p.named_children if c.type == "type_identifier"), None)
                result.append(TemplateParam(text(name) if name is not None else "", "type", None, default))
        return tuple(result)

    def param(self, node: Node) -> Param:
        declarator = node.child_by_field_name("declarator")
        name = name_node(declarator)
        inner = list(walk(declarator)) if declarator is not None else []
        kinds = {n.type for n in inner}
        qualifiers = {text(n) for n in inner if n.type == "type_qualifier"}
        outer = {text(c) for c in node.children if c.type == "type_qualifier"}
        is_array = "array_declarator" in kinds and "reference_declarator" not in kinds  # not `float (&a)[4]`
        is_pointer = "pointer_declarator" in kinds or is_array
        type_text = self.text(node)
        if name is not None:  # the declaration with the name cut out
            raw = self.pre.clean[node.start_byte : node.end_byte]
            cut = name.start_byte - node.start_byte
            type_text = squash((raw[:cut] + b" " + raw[cut + len(name.text or b"") :]).decode("utf-8", "replace"))
        return Param(text(name) if name is not None else "", type_text.replace(" *", "*").replace(" &", "&"),
                     is_pointer, is_pointer and "const" in outer, "__restrict__" in qualifiers | outer)

    def launch_bounds(self, node: Node | None, env: ConstEnv) -> LaunchBounds | None:
        args = [a for a in node.named_children if a.type != "comment"] if node is not None else []
        if not args:
            return None
        return LaunchBounds(self.text(args[0]), self.text(args[1]) if len(args) > 1 else None, env.eval(args[0]))

    def loops(self, body: Node, env: ConstEnv, template_names: set[str]) -> list[Loop]:
        loops = []
        for node in find_all(body, _LOOP_TYPES):
            depth = sum(1 for a in ancestors(node) if a.type in _LOOPS and a.start_byte >= body.start_byte)
            if node.type == "do_statement":
                header = "do ... while " + self.text(node.child_by_field_name("condition"))
            else:
                inner = node.child_by_field_name("body")
                header = self.text(node, inner.start_byte if inner is not None else None)
            variable, count, depends = trip_count(node, env, template_names)
            loops.append(Loop(_LOOPS[node.type], self.span(node), header, variable, count, depends,
                              self.unroll_before(node, env), depth))
        return loops

    def unroll_before(self, loop: Node, env: ConstEnv) -> UnrollPragma | None:
        """The `#pragma unroll` on the lines just above the loop, when the loop starts its line."""
        row, column = loop.start_point
        if self.lines[row][:column].strip():
            return None
        for line in range(row, 0, -1):  # 1-based numbers of the lines above
            pragma = self.pre.pragmas.get(line)
            if pragma is not None and (m := re.match(r"unroll\b\s*(.*)", pragma)):
                argument = m.group(1).strip() or None
                return UnrollPragma(line, argument, env.eval_text(argument) if argument else None)
            if pragma is None and self.lines[line - 1].strip():
                return None
        return None

    # -- shared memory ---------------------------------------------------------------------
    def shared(self, node: Node, kernel: str | None) -> list[SharedArray]:
        """The arrays `node` declares `__shared__` (none unless it is such a declaration)."""
        if node.type != "declaration" or not any(text(c) == "__shared__" for c in node.children):
            return []
        extern = any(text(c) == "extern" for c in node.children if c.type == "storage_class_specifier")
        element = self.text(node.child_by_field_name("type"))
        arrays = []
        for declarator in node.children_by_field_name("declarator"):
            sizes: list[Node | None] = []
            inner: Node | None = declarator
            while inner is not None and inner.type in ("array_declarator", "init_declarator"):
                if inner.type == "array_declarator":
                    sizes.insert(0, inner.child_by_field_name("size"))
                inner = inner.child_by_field_name("declarator")
            dims = tuple(self.text(size) for size in sizes)
            arrays.append(SharedArray(declared_name(declarator), element, dims, (None,) * len(dims),
                                      extern and "" in dims, self.span(node), kernel, ()))
        return arrays

    def with_accesses(self, array: SharedArray, kernels: list[tuple[str, Node]], env: ConstEnv) -> SharedArray:
        """`array` with its sizes evaluated in `env` and its subscripts in `kernels`."""
        accesses = []
        for kernel, fn in kernels:
            for node in find_all(fn, _SUBSCRIPTS):
                if continues_subscript(node):
                    continue
                base, *chain = subscript_chain(node)
                if base is not None and base.type == "identifier" and text(base) == array.name:
                    indices = tuple(self.text(s.child_by_field_name("indices"))[1:-1].strip() for s in chain if s)
                    accesses.append(SharedAccess(node.start_point[0] + 1, indices, is_store(node), kernel))
        values = tuple(env.eval_text(d) if d else None for d in array.dims)
        return replace(array, accesses=tuple(accesses), dim_values=values)

    # -- host side -------------------------------------------------------------------------
    def host_ops(self) -> tuple[list[Launch], list[HostOp]]:
        launches: list[Launch] = []
        ops: list[tuple[int, HostOp]] = []  # with the call's offset, to sort by
        calls: list[tuple[int, HostOp]] = []
        for node in find_all(self.root, _CALLS):
            api, line, args = callee_name(node), node.start_point[0] + 1, tuple(self.text(a) for a in arguments(node))
            function, loops, env = self.enclosing(node)
            chevrons = next((c for c in node.children if c.type == "kernel_call_syntax"), None)
            if chevrons is not None or api == "cudaLaunchKernel":
                launch = self.launch(node, chevrons, args, function, loops, env)
                if launch is not None:
                    launches.append(launch)
                    kernel_name = api if chevrons is None else launch.kernel
                    ops.append((node.start_byte, HostOp(HostOpKind.LAUNCH, kernel_name, line, function, args, loops,
                                                        launch.stream, launch=launch, at=node.start_byte)))
            elif api in _HOST_APIS:
                kind, *positions = _HOST_APIS[api]
                dst, src, direction, stream = (args[i] if i is not None and i < len(args) else None for i in positions)
                ops.append((node.start_byte, HostOp(kind, api, line, function, args, loops, stream, dst, src,
                                                    direction or _DEFAULT_DIRECTION.get(api), at=node.start_byte)))
            elif api in self.functions:
                calls.append((node.start_byte, HostOp(HostOpKind.CALL, api, line, function, args, loops,
                                                      at=node.start_byte)))
        active = {op.function for _, op in ops}
        while more := {c.function for _, c in calls if c.api in active} - active:  # their callers do host ops too
            active |= more
        ops += [(at, c) for at, c in calls if c.api in active]
        return launches, [op for _, op in sorted(ops, key=lambda pair: pair[0])]

    def enclosing(self, node: Node) -> tuple[str | None, tuple[int | None, ...], ConstEnv]:
        """The function around `node` (through lambdas), the trip counts of the loops between, and
        the function's constants."""
        fn = next((a for a in ancestors(node) if a.type == "function_definition"), None)
        if fn is None:
            return None, (), self.env
        if fn.id not in self.function_envs:
            self.function_envs[fn.id] = self.scope_env(fn.child_by_field_name("body") or fn, set())
        loops = [a for a in ancestors(node) if a.type in _LOOPS and a.start_byte > fn.start_byte]
        trips = tuple(trip_count(loop, self.function_envs[fn.id], set())[1] for loop in reversed(loops))
        return declared_name(fn.child_by_field_name("declarator")) or None, trips, self.function_envs[fn.id]

    def launch(self, call: Node, chevrons: Node | None, args: tuple[str, ...], function: str | None,
               loops: tuple[int | None, ...], env: ConstEnv) -> Launch | None:
        line = call.start_point[0] + 1
        if chevrons is None:  # cudaLaunchKernel(kernel, grid, block, args[, smem[, stream]])
            if len(args) < 4:
                return None
            target = unwrap(arguments(call)[0])
            while target is not None and target.type == "pointer_expression":
                target = unwrap(target.child_by_field_name("argument"))
            smem, stream = [*args[4:6], None, None][:2]
            return Launch(declared_name(target) or args[0], None, args[1], args[2], smem, stream, args[3:4], line,
                          function, loops, self.template_values(target, env))
        config: list[str | None] = [self.text(c) for c in chevrons.named_children if c.type != "comment"]
        config += [None] * (4 - len(config))
        fn = call.child_by_field_name("function")
        templated = next((n for n in walk(fn) if n.type == "template_function"), None) if fn is not None else None
        targs = templated.child_by_field_name("arguments") if templated is not None else None
        return Launch(callee_name(call), self.text(targs)[1:-1].strip() if targs is not None else None,
                      config[0] or "", config[1] or "", config[2], config[3], args, line, function, loops,
                      self.template_values(fn, env))

    def template_values(self, callee: Node | None, env: ConstEnv) -> tuple[int | str | None, ...]:
        """The template arguments of `callee` (`k<256, float>`): integers where they evaluate in
        `env`, type names for types, None for what does not resolve."""
        templated = next((n for n in walk(callee) if n.type == "template_function"), None) if callee else None
        targs = templated.child_by_field_name("arguments") if templated is not None else None
        values: list[int | str | None] = []
        for arg in targs.named_children if targs is not None else ():
            if arg.type == "comment":
                continue
            if arg.type != "type_descriptor":
                values.append(env.eval(arg))
            else:  # `k<kBlock>` reads as a type to the grammar: a constant's name is tried first
                value = env.eval_text(self.text(arg)) if re.fullmatch(r"[\w:]+", self.text(arg)) else None
                values.append(self.text(arg) if value is None else value)
        return tuple(values)


class _Effects:
    """Which pointer parameters a kernel body reads and writes, following local pointer aliases
    (`float* dst = out + k; dst[0] = v;` writes `out`)."""

    _STORES = re.compile(r"atomic\w*|__st(cg|cs|wb|wt)|memcpy|memset")  # they write their first argument
    _LOADS = re.compile(r"__ld(g|ca|cg|cs|lu|cv)")
    _ALIASING = frozenset({"init_declarator", "assignment_expression"})
    _EFFECTS = frozenset({"assignment_expression", "update_expression", "call_expression"})

    def __init__(self, params: tuple[Param, ...], body: Node) -> None:
        # pointer name -> (the parameters it points into, whether its pointee is const)
        self.roots = {p.name: ({p.name}, p.is_const_pointee) for p in params if p.is_pointer}
        self.writes: set[str] = set()
        self.may_write: set[str] = set()
        self.reads: set[str] = set()
        self.quiet: set[int] = set()  # offsets of identifiers naming a pointer without reading through it
        self.body = body
        for _ in range(2):  # twice: an alias may be assigned from one that appears later in the text
            for node in find_all(body, self._ALIASING):
                self.alias(node)
        for node in find_all(body, self._EFFECTS):
            if node.type in ("assignment_expression", "update_expression"):
                target = node.child_by_field_name("left" if node.type == "assignment_expression" else "argument")
                through = stored_through(target)
                self.writes |= self.params_of(through)
                operator = node.child_by_field_name("operator")
                if operator is not None and operator.type == "=":  # `+=` reads too
                    self.quiet |= {n.start_byte for n in through}
            elif node.type == "call_expression":
                self.call(node)
        for node in find_all(body, _IDENTIFIERS):
            if text(node) in self.roots and node.start_byte not in self.quiet:
                parent = node.parent  # a declared name is not a use
                if parent is None or not parent.type.endswith("declarator") or parent.child_by_field_name(
                        "declarator") != node:
                    self.reads |= self.roots[text(node)][0]

    def single_element(self) -> set[str]:
        """The pointer params whose every use is `*p` or `p[0]` and that no other pointer aliases."""
        aliased = {q for name, (params, _) in self.roots.items() if name not in params for q in params}
        single = {name for name, (params, _) in self.roots.items() if params == {name}} - aliased
        for node in find_all(self.body, _IDENTIFIERS):
            if text(node) not in single:
                continue
            parent = node.parent
            deref = parent is not None and parent.type == "pointer_expression" and text(
                parent.child_by_field_name("operator") or parent) == "*"
            first = parent is not None and parent.type == "subscript_expression" and parent.child_by_field_name(
                "argument") == node and text(parent.child_by_field_name("indices") or parent).replace(" ", "") == "[0]"
            if not (deref or first):
                single.discard(text(node))
        return single

    def params_of(self, names: list[Node]) -> set[str]:
        return {p for n in names if text(n) in self.roots for p in self.roots[text(n)][0]}

    def call(self, node: Node) -> None:
        name = callee_name(node)
        if name.endswith("_cast") or self._LOADS.fullmatch(name):
            return
        for i, arg in enumerate(arguments(node)):
            pointers = [p for p in pointer_names(arg) if text(p) in self.roots]
            if i == 0 and self._STORES.fullmatch(name):
                self.writes |= self.params_of(pointers)
            else:  # a non-const pointer handed to code this analysis does not see
                self.may_write |= self.params_of([p for p in pointers if not self.roots[text(p)][1]])

    def alias(self, node: Node) -> None:
        """Record `T* p = <pointer expression>;` and `p = <pointer expression>;`."""
        if node.type == "init_declarator" and node.parent is not None and node.parent.type == "declaration":
            target, value = node.child_by_field_name("declarator"), node.child_by_field_name("value")
            declared_type = text(node.parent.child_by_field_name("type") or node)
            is_pointer = (target is not None and target.type == "pointer_declarator") or declared_type == "auto"
            const = any(text(c) == "const" for c in node.parent.children if c.type == "type_qualifier")
        elif node.type == "assignment_expression":
            target, value = node.child_by_field_name("left"), node.child_by_field_name("right")
            is_pointer, const = target is not None and target.type == "identifier", False
        else:
            return
        name = declared_name(target)
        sources = [n for n in pointer_names(value) if text(n) in self.roots]
        if not is_pointer or not sources or not name or name == text(sources[0]):
            return
        params, was_const = self.roots.get(name, (set(), True))
        sources_const = all(self.roots[text(s)][1] for s in sources)
        self.roots[name] = (params | self.params_of(sources), (const or sources_const) and was_const)
        self.quiet |= {n.start_byte for n in [*sources, target] if n is not None}  # `r = q` reads neither


def _parse_recovering(masked: bytes, tries: int = 8) -> tuple[Node, list[tuple[int, str]]]:
    """Parse; while a syntax error remains, leave out the line where the first one starts, as long
    as that shrinks the erroneous text: an unbalanced brace or parenthesis otherwise makes
    tree-sitter swallow every definition after it into one error node."""
    tree, skipped = _ts.parser().parse(masked), []
    for _ in range(tries):
        first = next(_ts.errors_under(tree.root_node), None)
        if first is None:
            break
        start = masked.rfind(b"\n", 0, first.start_byte) + 1
        end = masked.find(b"\n", first.start_byte)
        end = len(masked) if end < 0 else end
        candidate = masked[:start] + b" " * (end - start) + masked[end:]
        retry = _ts.parser().parse(candidate)
        if _ts.error_extent(retry.root_node) >= _ts.error_extent(tree.root_node):
            break
        skipped.append((first.start_point[0] + 1, squash(masked[first.start_byte : end].decode("utf-8", "replace"))))
        masked, tree = candidate, retry
    return tree.root_node, skipped


def _char_offsets(raw: bytes) -> list[int]:
    """Byte offset -> str index, for sources with multi-byte characters."""
    table, chars = [0] * (len(raw) + 1), 0
    for i, byte in enumerate(raw):
        table[i] = chars
        chars += (byte & 0xC0) != 0x80
    table[len(raw)] = chars
    return table


def file_env(root: Node | None, macros: Mapping[str, str]) -> ConstEnv:
    """The constants of a file's scope: its macros (read through `macros`), its `const`/`constexpr`
    declarations and the static constant members of its structs."""
    env = ConstEnv(macros)
    for node in find_all(root, _FILE_DECLARATIONS, _FUNCTIONS) if root is not None else ():
        if node.type == "declaration":
            _declare_constants(node, env, hide_others=False)
        elif node.type == "field_declaration":
            _declare_member(node, env)
    return env


def scope_env(outer: ConstEnv, body: Node, hidden: set[str]) -> ConstEnv:
    """The constants a function body sees: `outer`'s, less `hidden` and the names its locals
    rebind, plus its own constant declarations."""
    env = outer.child()
    env.hidden |= hidden
    for node in find_all(body, _DECLARATIONS):
        _declare_constants(node, env, hide_others=True)
    return env


def _is_kernel(fn: Node) -> bool:
    return any(c.type == "__global__" for c in fn.children)


def _declare_member(field: Node, env: ConstEnv) -> None:
    """`struct Cfg { static constexpr int kTile = 32; };` declares `Cfg::kTile`."""
    constant = any(text(c) in ("constexpr", "const") for c in field.children if c.type == "type_qualifier")
    static = any(text(c) == "static" for c in field.children if c.type == "storage_class_specifier")
    owner = next((a for a in ancestors(field) if a.type in ("struct_specifier", "class_specifier")), None)
    name, value = field.child_by_field_name("declarator"), field.child_by_field_name("default_value")
    owner_name = owner.child_by_field_name("name") if owner is not None else None
    if constant and static and name is not None and value is not None and owner_name is not None:
        env.declare(f"{text(owner_name)}::{text(name)}", value)


def _declare_constants(decl: Node, env: ConstEnv, hide_others: bool) -> None:
    """Declare a declaration's `constexpr`/`const` names to `env`; with hide_others, its other
    names shadow file constants of the same name."""
    constant = any(text(c) in ("constexpr", "const") for c in decl.children if c.type == "type_qualifier")
    for declarator in decl.children_by_field_name("declarator"):
        name = name_node(declarator)
        inner = declarator.child_by_field_name("declarator") if declarator.type == "init_declarator" else None
        value = declarator.child_by_field_name("value") if inner is not None else None
        if name is not None and constant and value is not None and inner is not None and inner.type == "identifier":
            env.declare(text(name), value)
        elif name is not None and hide_others:
            env.hidden.add(text(name))
