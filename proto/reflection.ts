/**
 * Server reflection descriptors, one FileDescriptorProto per original .proto file.
 *
 * Why not hand proto-loader's package definition to @grpc/reflection directly: protobufjs
 * builds one synthetic file per *package*, with type references as written in the .proto
 * (`type.v3.HttpStatus`) and no `dependency` list. grpcurl (jhump/protoreflect) needs
 * fully-qualified references and declared dependencies ("unresolvable reference", grpc-node
 * issue #3018), and per-package files of Envoy's API have dependency cycles that make
 * grpcurl recurse until it crashes. So we load the same protos with protobufjs, group types
 * by the file they were declared in, qualify every reference with protobuf's scoping rules,
 * and derive each file's dependencies. Done once at start-up.
 */
import { accessSync, constants } from 'node:fs';
import { isAbsolute, join, relative } from 'node:path';
import protobuf from 'protobufjs';
import descriptor from 'protobufjs/ext/descriptor/index.js';

interface Field { name?: string; typeName?: string; extendee?: string }
interface Msg { name?: string; field?: Field[]; extension?: Field[]; nestedType?: Msg[]; enumType?: { name?: string }[] }
interface Method { inputType?: string; outputType?: string }
interface File {
  name?: string; package?: string; dependency?: string[]; syntax?: string;
  messageType?: Msg[]; enumType?: { name?: string }[]; service?: { method?: Method[] }[]; extension?: Field[];
}

const FileDescriptorProto = descriptor.FileDescriptorProto;

/** Resolves `ref` from `scope` (".a.b.C") outward, as protoc does; unchanged if unknown. */
export function resolveTypeName(ref: string, scope: string, symbols: ReadonlyMap<string, string>): string {
  if (ref === '' || ref.startsWith('.')) return ref;
  let s = scope;
  while (true) {
    const candidate = `${s}.${ref}`;
    if (symbols.has(candidate)) return candidate;
    if (s === '') return ref;
    s = s.slice(0, s.lastIndexOf('.'));
  }
}

/** Records every message and enum of `file` as fully-qualified name → file name. */
function collectSymbols(file: File, symbols: Map<string, string>): void {
  const name = file.name ?? '';
  const root = file.package ? `.${file.package}` : '';
  const walk = (prefix: string, msgs: Msg[] | undefined): void => {
    for (const m of msgs ?? []) {
      const fqn = `${prefix}.${m.name ?? ''}`;
      symbols.set(fqn, name);
      for (const e of m.enumType ?? []) symbols.set(`${fqn}.${e.name ?? ''}`, name);
      walk(fqn, m.nestedType);
    }
  };
  walk(root, file.messageType);
  for (const e of file.enumType ?? []) symbols.set(`${root}.${e.name ?? ''}`, name);
}

/** Qualifies every reference in `file` and sets its `dependency` list. */
function qualify(file: File, symbols: ReadonlyMap<string, string>): void {
  const root = file.package ? `.${file.package}` : '';
  const deps = new Set<string>();
  const resolve = (ref: string, scope: string): string => {
    const fqn = resolveTypeName(ref, scope, symbols);
    const owner = symbols.get(fqn);
    if (owner !== undefined && owner !== file.name) deps.add(owner);
    return fqn;
  };
  const fixFields = (fields: Field[] | undefined, scope: string): void => {
    for (const f of fields ?? []) {
      if (f.typeName) f.typeName = resolve(f.typeName, scope);
      if (f.extendee) f.extendee = resolve(f.extendee, scope);
    }
  };
  const walk = (prefix: string, msgs: Msg[] | undefined): void => {
    for (const m of msgs ?? []) {
      const fqn = `${prefix}.${m.name ?? ''}`;
      fixFields(m.field, fqn);
      fixFields(m.extension, fqn);
      walk(fqn, m.nestedType);
    }
  };
  walk(root, file.messageType);
  fixFields(file.extension, root);
  for (const svc of file.service ?? []) {
    for (const m of svc.method ?? []) {
      if (m.inputType) m.inputType = resolve(m.inputType, root);
      if (m.outputType) m.outputType = resolve(m.outputType, root);
    }
  }
  file.dependency = [...deps].sort();
}

/**
 * protobufjs copies each extension field into the extended message as a "sister" field
 * named by its full name (".validate.rules" inside google.protobuf.FieldOptions). Those
 * belong to the declaring file, and keeping them would make descriptor.proto depend on
 * validate.proto (a cycle). Drop them.
 */
function dropSisterFields(m: Msg): void {
  if (m.field !== undefined) m.field = m.field.filter((f) => !(f.name ?? '').startsWith('.'));
  for (const n of m.nestedType ?? []) dropSisterFields(n);
}

type Described = protobuf.ReflectionObject & { toDescriptor(syntax?: string): protobuf.Message };

/**
 * Loads `files` (relative to `includeDirs`) and returns, for @grpc/reflection, an object
 * whose single entry carries every file's encoded FileDescriptorProto.
 */
export function reflectionPackage(files: readonly string[], includeDirs: readonly string[]): Record<string, { fileDescriptorProtos: Buffer[] }> {
  const root = new protobuf.Root();
  root.resolvePath = (_origin, target) => {
    if (isAbsolute(target)) return target;
    for (const dir of includeDirs) {
      const full = join(dir, target);
      try {
        accessSync(full, constants.R_OK);
        return full;
      } catch { /* next include dir */ }
    }
    return target;
  };
  root.loadSync([...files], { keepCase: true });
  root.resolveAll();

  const byFile = new Map<string, File>();
  const fileName = (obj: protobuf.ReflectionObject, pkg: string): string => {
    const f = obj.filename;
    if (f === null || f === undefined) return `${pkg.replace(/\./g, '/')}/_builtin.proto`;
    const rel = includeDirs.map((d) => relative(d, f)).find((r) => !r.startsWith('..'));
    return rel ?? f;
  };
  const fileFor = (name: string, pkg: string): File => {
    let f = byFile.get(name);
    if (f === undefined) {
      f = { name, package: pkg, syntax: 'proto3', messageType: [], enumType: [], service: [] };
      byFile.set(name, f);
    }
    return f;
  };
  const visit = (ns: protobuf.NamespaceBase, pkg: string): void => {
    for (const child of ns.nestedArray) {
      if (child instanceof protobuf.Type) {
        const f = fileFor(fileName(child, pkg), pkg);
        const msg = FileDescriptorProto.toObject(
          FileDescriptorProto.fromObject({ messageType: [(child as unknown as Described).toDescriptor('proto3')] }),
        ) as File;
        for (const m of msg.messageType ?? []) {
          dropSisterFields(m);
          f.messageType!.push(m);
        }
      } else if (child instanceof protobuf.Enum) {
        const f = fileFor(fileName(child, pkg), pkg);
        f.enumType!.push((child as unknown as Described).toDescriptor() as unknown as { name?: string });
      } else if (child instanceof protobuf.Service) {
        const f = fileFor(fileName(child, pkg), pkg);
        f.service!.push((child as unknown as Described).toDescriptor() as unknown as { method?: Method[] });
      } else if (child instanceof protobuf.Namespace) {
        visit(child, pkg === '' ? child.name : `${pkg}.${child.name}`);
      }
    }
  };
  visit(root, '');

  // toDescriptor() returns protobufjs Message instances; normalise to plain objects.
  const plain = [...byFile.values()].map((f) => FileDescriptorProto.toObject(FileDescriptorProto.fromObject(f as object)) as File);
  const symbols = new Map<string, string>();
  for (const f of plain) collectSymbols(f, symbols);
  const out: Buffer[] = [];
  for (const f of plain) {
    qualify(f, symbols);
    out.push(Buffer.from(FileDescriptorProto.encode(FileDescriptorProto.fromObject(f as object)).finish()));
  }
  return { descriptors: { fileDescriptorProtos: out } };
}
