/**
 * What every part of the renderer shares: the output types, the render options, and the few
 * value helpers (durations, addresses, typed extension configs).
 */
import { isIP } from 'node:net';
import type { TypeUrl } from './names.ts';

// ─── Output types ──────────────────────────────────────────────────────────────────────────

/** A JSON/YAML value. `undefined` members are dropped by the YAML writer. */
export type Json = string | number | boolean | null | readonly Json[] | JsonObject;
export interface JsonObject { readonly [key: string]: Json | undefined }

/** A typed config: the `@type` comes from the TYPE_URL table, so it cannot be misspelled. */
export interface TypedConfig extends JsonObject { readonly '@type': TypeUrl }

/** Envoy's TypedExtensionConfig (filters, access loggers, formatters, resource monitors…). */
export interface TypedExtension extends JsonObject {
  readonly name: string;
  readonly typed_config: TypedConfig;
}

/** `{name, typed_config: {'@type': type, ...fields}}`, in that key order. */
export function typedExtension(name: string, type: TypeUrl, fields: JsonObject = {}): TypedExtension {
  return { name, typed_config: typedConfig(type, fields) };
}

/** `{'@type': type, ...fields}`. */
export function typedConfig(type: TypeUrl, fields: JsonObject = {}): TypedConfig {
  return { '@type': type, ...fields };
}

// ─── Options ───────────────────────────────────────────────────────────────────────────────

export type AllowedHeaders = 'minimal' | 'all';

export interface RenderOptions {
  /** Absolute path the bootstrap reads the client-certificate SDS resource from. */
  readonly sdsPath: string;
  /**
   * Absolute path the bootstrap reads the server-certificate SDS resource from (EDGE_TLS_*);
   * default `sds-server-cert.yaml` beside sdsPath (render/tls.ts).
   */
  readonly serverSdsPath?: string;
  /** Access log file; default Envoy's stdout. */
  readonly accessLogPath?: string;
  /** Bootstrap node id (path-based SDS needs one); default `edge-envoy`. */
  readonly nodeId?: string;
  /**
   * Which request headers ext_authz forwards in the CheckRequest. `minimal` (default): only
   * those the authz service reads. `all`: every header (Envoy's default), for benchmarks.
   */
  readonly allowedHeaders?: AllowedHeaders;
  /**
   * Idle timeout of pooled upstream HTTP/1.1 connections (market, order backend); default 4 s,
   * below Node's 5 s keep-alive so Envoy, not the server, closes idle connections.
   */
  readonly upstreamIdleTimeoutSecs?: number;
  /** Overload-manager cap on downstream connections; default MAX_DOWNSTREAM_CONNECTIONS (bootstrap.ts). */
  readonly maxDownstreamConnections?: number;
  /**
   * max_dynamic_descriptors of the local rate limit; default LOCAL_RATE_LIMIT_DESCRIPTOR_CAP
   * (budget.ts). Benchmarks only (bench:capacity measures bytes per descriptor past the cap).
   */
  readonly maxDynamicDescriptors?: number;
}

export interface RenderedEnvoy {
  /** The bootstrap YAML (`envoy -c`). */
  readonly bootstrap: string;
  /** The SDS YAML to write at `opts.sdsPath`; undefined when no order backend is configured. */
  readonly sds: string | undefined;
  /** The server-certificate SDS YAML to write at serverSdsPath (render/tls.ts); undefined without EDGE_TLS_CERT_FILE. */
  readonly serverSds: string | undefined;
  /** Deployment problems worth a log line (never fatal). */
  readonly warnings: readonly string[];
}

// ─── Values ────────────────────────────────────────────────────────────────────────────────

/** Milliseconds → protobuf Duration string ("5s", "0.25s"). */
export function duration(ms: number): string {
  if (!Number.isFinite(ms) || ms < 0) throw new RangeError(`duration: ${ms} ms`);
  return `${Number((ms / 1000).toFixed(3))}s`;
}

/** An IPv6 literal in the form Envoy prints (compressed, lower case); other input unchanged. */
export function canonicalIp(host: string): string {
  if (isIP(host) !== 6) return host;
  return new URL(`http://[${host}]/`).hostname.replace(/^\[(.*)\]$/, '$1');
}

export function socketAddress(address: string, port: number): JsonObject {
  return { socket_address: { address, port_value: port } };
}

/** A header to set on a request or response, replacing any the message already has. */
export function overwriteHeader(key: string, value: string): JsonObject {
  return { header: { key, value }, append_action: 'OVERWRITE_IF_EXISTS_OR_ADD' };
}
